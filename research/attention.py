"""Where the attention goes: the paper's attention experiment, on a checkpoint.

    python -m research.attention --out OUT     # OUT/attention.png; the checkpoint's own text

Each layer's attention on c_mem, mem and the segment, each cut in BUCKETS_PER_REGION spans, over
the validation text once the memories are full; on the recall task, where each '?' looks."""

import torch

import train_shakespeare
from compressive import CompressiveTransformer
from research import caption, code, positive, print_table, recall
from training import checkpoint, plots
from training.checks import UserError, command_flags, exit_status, keep_freed_memory, pick_device
from training.recorded_attention import recorded_attention

BUCKETS_PER_REGION = 4


def attention_buckets(weights: torch.Tensor, n_c_mem: int, n_mem: int) -> torch.Tensor:
    """Attention weights [..., K] summed over c_mem, mem and the segment, each cut into
    BUCKETS_PER_REGION equal spans, oldest first: [..., 3 * n], summing to 1 for every query."""
    K = weights.size(-1)
    starts = []
    for start, length in ((0, n_c_mem), (n_c_mem, n_mem), (n_c_mem + n_mem, K - n_c_mem - n_mem)):
        cuts = torch.linspace(0, length, BUCKETS_PER_REGION + 1).round().long() + start
        starts += cuts[:-1].tolist()
    ends = starts[1:] + [K]
    return torch.stack([weights[..., a:b].sum(-1) for a, b in zip(starts, ends)], dim=-1)


BUCKET_NAMES = [
    f"{region} {i + 1}/{BUCKETS_PER_REGION}"
    for region in ("c_mem", "mem", "segment")
    for i in range(BUCKETS_PER_REGION)
]


@torch.no_grad()
def analyze(model, streams: torch.Tensor, step: int, out: str, caption: str = "") -> None:
    """The attention by bucket and layer over streams [n, L + 1]: printed, OUT/attention.png."""
    cfg = model.cfg
    totals = torch.zeros(cfg.n_layers, 3 * BUCKETS_PER_REGION, dtype=torch.float64)
    counted, memory = 0, None
    with recorded_attention(model) as attention:
        for start in range(0, streams.size(1) - cfg.seq_len, cfg.seq_len):
            held = None if memory is None else (memory.mem[0].size(1), memory.c_mem[0].size(1))
            _, memory, _ = model(streams[:, start : start + cfg.seq_len], memory)
            if held == (cfg.mem_len, cfg.c_mem_len):  # bucket edges compare once both are full
                for i, weights in enumerate(attention):
                    buckets = attention_buckets(weights.double(), cfg.c_mem_len, cfg.mem_len)
                    totals[i] += buckets.mean(dim=(0, 1, 2)).cpu()
                counted += 1
    if counted == 0:
        raise UserError("the validation text is too short to fill the memories; lower --batch-size")
    per_layer = (totals / counted).tolist()
    overall = [sum(column) / cfg.n_layers for column in zip(*per_layer)]
    print(
        f"attention by key bucket, {counted} segments x {streams.size(0)} streams, "
        f"n_cm={cfg.c_mem_len} n_m={cfg.mem_len} n_s={cfg.seq_len} (step {step})"
    )
    header = ["bucket", "all", *(f"layer {i + 1}" for i in range(cfg.n_layers))]
    cells = lambda b: [f"{w:.4f}" for w in [overall[b], *(row[b] for row in per_layer)]]
    print_table(header, ([name, *cells(b)] for b, name in enumerate(BUCKET_NAMES)))
    plt = plots.pyplot()
    if plt is None:
        return
    plt.figure(figsize=(9, 4.6 if caption else 4))
    x = range(len(BUCKET_NAMES))
    plt.bar(x, overall, color="lightgray", label="all layers")
    for i, row in enumerate(per_layer):
        plt.plot(x, row, marker="o", label=f"layer {i + 1}")
    plt.xticks(x, BUCKET_NAMES, rotation=45, ha="right")
    title = "Attention by distance: compressed memory (oldest) -> memory -> segment (newest)"
    plt.gca().set(ylabel="mean attention weight", title=title)
    plt.legend()
    plots.save(plt, f"{out}/attention.png", caption)


@torch.no_grad()
def where_queries_look(model, streams: torch.Tensor, answers) -> None:
    """Print, per phase and layer, where the '?' of each query held in c_mem or (phase "mem") in
    mem looks; in mem digit and '=' have a slot each, so a look for the '=' only a fact has shows
    apart from one at any digit. Full segments only; n_s, n_m multiples of c."""
    cfg = model.cfg
    n_s, n_m, c = cfg.seq_len, cfg.mem_len, cfg.compression_rate
    n_streams, length = streams.size(0), streams.size(1) - 1
    stream, query, fact, back, whole = recall.locate(answers, length, n_streams, n_s)
    in_c_mem, in_mem = recall.held_in_c_mem(back, model.reach()), (back >= 1) & (back < n_m)
    group = torch.where(in_c_mem, fact % c, torch.where(in_mem, c, -1))  # a phase, c: mem
    wanted = whole & (query < length // n_s * n_s) & (group >= 0)
    by_segment = {}
    for b, q, g, k in zip(*(t[wanted].tolist() for t in (stream, query, group, back))):
        by_segment.setdefault(q // n_s, []).append((b, q % n_s, g, k))
    sums = torch.zeros(c + 1, cfg.n_layers, 3, dtype=torch.float64)  # the phases, then mem
    counts = torch.zeros(c + 1)
    memory = None
    with recorded_attention(model) as attention:
        for segment in range(length // n_s):
            n_held = 0 if memory is None else memory.c_mem[0].size(1)
            n_mem = 0 if memory is None else memory.mem[0].size(1)
            _, memory, _ = model(streams[:, segment * n_s : (segment + 1) * n_s], memory)
            for b, i, group, k in by_segment.get(segment, []):
                if group == c:  # held in mem: the digit k before the segment, its '=' one before
                    if k >= n_mem:
                        continue
                    digit, marker = n_held + n_mem - k, n_held + n_mem - k - 1
                else:
                    digit, marker = recall.fact_slots(k, n_m, c, n_held)
                    if marker < 0:  # the '=' has already left c_mem
                        continue
                for layer, weights in enumerate(attention):
                    w = weights[b, :, i].double().mean(dim=0).cpu()  # [K], keys [c_mem; mem; h]
                    on_marker = w[marker] if marker != digit else 0.0
                    sums[group, layer] += torch.tensor([w[digit], on_marker, w[:n_held].sum()])
                counts[group] += 1
    if not counts.any():
        print("no query held in c_mem or mem was read in a full segment: nothing to show")
        return
    print(
        "where the '?' of a query held in c_mem looks (mean over heads): on the slot of the fact's "
        "digit, on its '='s when a block boundary parts them (phase 0), on all of c_mem; phase "
        "mem: the queries whose fact is held in mem, on the digit's slot and on the '='s"
    )
    rows = []
    for p in (p for p in range(c + 1) if counts[p]):
        for layer in range(cfg.n_layers):
            digit, marker, on_c_mem = (sums[p, layer] / counts[p]).tolist()
            marker = f"{marker:.3f}" if p in (0, c) else "-"
            rows.append([p if p < c else "mem", int(counts[p]), layer + 1, f"{digit:.3f}"])
            rows[-1] += [marker, f"{on_c_mem:.3f}"]
    print_table(["phase", "queries", "layer", "digit slot", "= slot", "c_mem"], rows)


def main(argv=None) -> int:
    p = command_flags("python -m research.attention", __doc__)
    p.add_argument("--batch-size", type=positive, default=12, help="parallel streams of the text")
    p.set_defaults(data=None)  # the checkpoint's own text
    args = p.parse_args(argv)
    keep_freed_memory()
    return exit_status(lambda: analyze_checkpoint(args))


def analyze_checkpoint(args) -> None:
    device = pick_device(args.device)
    model, ckpt = checkpoint.load_model(args.out, device)
    if not isinstance(model, CompressiveTransformer):
        raise UserError("a Feedback Transformer has no attention over [c_mem; mem; segment]")
    data, answers = code.validation_text(args, ckpt)
    print(f"validation text: {data.name}")
    streams = train_shakespeare.make_streams(data.val, args.batch_size).to(device)
    analyze(model, streams, ckpt["step"], args.out, caption(ckpt, "python -m research.attention"))
    if answers is not None and model.cfg.mem_len and model.cfg.c_mem_len:
        where_queries_look(model, streams, answers)


if __name__ == "__main__":
    raise SystemExit(main())
