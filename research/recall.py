"""The reach benchmark: a text in which reach is everything (docs/REACH.md says how it is read).

    python -m research.recall --no-post-norm --seq-len 32 --loss-on answers   # train
    python -m research.recall --eval-only --out OUT    # a checkpoint's accuracy by distance

Facts " KK=d" in '.' filler, each asked D characters later as " KK?d"; the accuracy on the digit
after '?', by D cut at model.reach(), and over the facts held in c_mem by their phase."""

import argparse
import heapq
import math
import os
import random
import string
from typing import NamedTuple

import torch

import evaluate as evaluate_command
import train_shakespeare
from research import at_least, caption, positive, print_table, task_flags
from training import checkpoint, evaluate, files, plots
from training.checks import UserError, exit_status, keep_freed_memory, processes
from training.data import IGNORE, Data, encode

VOCAB = sorted(". =?" + string.ascii_uppercase + string.digits)
KEYS = [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]
VALIDATION_KEYS = KEYS[::8]  # held out of training, so no validation fact is ever trained on
TRAINING_KEYS = [key for key in KEYS if key not in VALIDATION_KEYS]
MAX_TRAIN_CHARS = 32_000_000
MIN_DISTANCE, FACT_GAP = 8, 5  # the shortest D; the mean filler characters between facts
DEFAULTS = {  # the task's flags; given as None, a checkpoint's own settings fill them first
    "max_distance": 400,
    "live_facts": 1,
    "distractors": False,
    "curriculum": 0.5,
    "curriculum_hold": 0.0,
    "val_chars": 300_000,
    "loss_on": "all",
}


def fraction(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1], got {value}")
    return value


class RecallText(NamedTuple):
    text: str
    answers: torch.Tensor  # [n_queries, 2]: position of each answer digit, and its distance D


def make_recall_text(
    n_chars: int,
    keys,
    min_distance: int,
    max_distance: int,
    gap: int,
    live_facts: int,
    seed: str,
    widen_over: int = 0,
    distractors: bool = False,
    hold_over: int = 0,
    hold_distance: int = 0,
) -> RecallText:
    """Facts about gap characters apart, each asked once D later (log-uniform, digit to digit),
    at most live_facts waiting, a key not stated again before its query; the longest D grows over
    widen_over characters (after hold_over at hold_distance); distractors: facts never asked."""
    rng = random.Random(seed)
    chars, taken = ["."] * n_chars, bytearray(n_chars)
    free_keys, busy_keys = list(keys), []  # busy_keys: heap of (position where free again, key)
    answers, pos = [], 0
    log_min, log_max = math.log(min_distance), math.log(max_distance + 1)
    while True:
        if len(busy_keys) >= live_facts and not distractors:  # wait until a query has passed
            pos = max(pos, busy_keys[0][0])
        pos += rng.randint(0, 2 * gap)
        if pos + 5 > n_chars:
            break
        while busy_keys and busy_keys[0][0] <= pos:
            free_keys.append(heapq.heappop(busy_keys)[1])
        if len(busy_keys) >= live_facts:  # a distractor: a free key, which stays free
            if not any(taken[pos : pos + 5]) and free_keys:
                chars[pos : pos + 5] = f" {rng.choice(free_keys)}={rng.choice(string.digits)}"
                taken[pos : pos + 5] = b"\x01" * 5
                pos += 4
            pos += 1
            continue
        if widen_over:
            start = hold_distance if hold_over else min_distance
            grown = min(1.0, max(0, pos - hold_over) / widen_over)
            log_max = math.log(start + (max_distance - start) * grown + 1)
        distance = min(max_distance, int(math.exp(rng.uniform(log_min, log_max))))
        query = pos + distance
        clash = any(taken[pos : pos + 5]) or any(taken[query : query + 5])
        if clash or query + 5 > n_chars or not free_keys:
            pos += 1
            continue
        key = free_keys.pop(rng.randrange(len(free_keys)))
        digit = rng.choice(string.digits)
        chars[pos : pos + 5] = f" {key}={digit}"
        chars[query : query + 5] = f" {key}?{digit}"
        taken[pos : pos + 5] = taken[query : query + 5] = b"\x01" * 5
        heapq.heappush(busy_keys, (query + 5, key))
        answers.append((query + 4, distance))
        pos += 5
    return RecallText("".join(chars), torch.tensor(sorted(answers), dtype=torch.long).view(-1, 2))


def answer_targets(ids: torch.Tensor) -> torch.Tensor:
    """The targets of --loss-on answers: the digits after a '?', every other target IGNORE."""
    after_query = torch.zeros_like(ids, dtype=torch.bool)
    after_query[1:] = ids[:-1] == VOCAB.index("?")
    return ids.masked_fill(~after_query, IGNORE)


def load_data(args, n_train_streams: int = 1, saved_args=None, need_train: bool = True):
    """(Data, answers): training text --steps read once (capped), a strand per stream so that the
    curriculum widens along each; validation text of held-out keys, and its queries. The task's
    flags as given, else as the checkpoint was trained (saved_args), else DEFAULTS."""
    given = lambda name: [getattr(args, name, None), (saved_args or {}).get(name), DEFAULTS[name]]
    s = {name: next(v for v in given(name) if v is not None) for name in DEFAULTS}
    task = (MIN_DISTANCE, s["max_distance"], FACT_GAP, s["live_facts"])
    train = None
    if need_train:
        length = min(args.steps * args.seq_len, MAX_TRAIN_CHARS // n_train_streams)
        strands = [
            make_recall_text(
                length,
                TRAINING_KEYS,
                *task,
                seed=f"train {args.seed} {b}",
                widen_over=int(s["curriculum"] * length),
                distractors=s["distractors"],
                hold_over=int(s["curriculum_hold"] * length),
                hold_distance=args.seq_len - 1,
            ).text
            for b in range(n_train_streams)
        ]
        train = encode("".join(strands) + ".", VOCAB)
    made = make_recall_text(
        s["val_chars"], VALIDATION_KEYS, *task, seed="validation", distractors=s["distractors"]
    )
    val = encode(made.text, VOCAB)
    data = Data(VOCAB, train, val, "the recall task's generated text")
    if s["loss_on"] == "answers":
        targets = None if train is None else answer_targets(train)
        data = data._replace(train_targets=targets, val_targets=answer_targets(val))
    return data, made.answers


class Scored(NamedTuple):
    distance: torch.Tensor  # D of every scored query
    correct: torch.Tensor  # whether the model's most likely character was the answer
    fact_offset: torch.Tensor  # where the fact's digit sits in its stream (its phase: mod c)
    fact_back: torch.Tensor  # how far the digit lies before the segment its query is read in
    latest_right: torch.Tensor  # whether the latest fact stated has the answer (blind to keys)
    said_latest: torch.Tensor  # whether the model answered with the latest fact's digit
    facts_after: torch.Tensor  # facts stated between the asked one and its query


def locate(answers, length: int, n_streams: int, seq_len: int):
    """Each query's stream (the last takes the tail), the offsets of its '?' and fact's digit, how
    far the digit lies before the '?'s segment (<= 0: inside), whether the fact is whole in it."""
    position, distance = answers.unbind(dim=1)
    stream = ((position - 1) // length).clamp(max=n_streams - 1)
    query = position - 1 - stream * length
    fact = position - distance - stream * length
    segment_start = torch.where(query < length, query - query % seq_len, length)
    return stream, query, fact, segment_start - fact, fact - 4 >= 0


def score(predictions, data, answers, n_streams: int, seq_len: int) -> Scored:
    """The queries whose fact is whole in their stream; predictions[p]: the guess after data[:p]."""
    _, _, fact, back, whole = locate(answers, (len(data) - 1) // n_streams, n_streams, seq_len)
    position, distance = answers.unbind(dim=1)
    correct = predictions[position] == data[position]
    digits = (data == VOCAB.index("=")).nonzero().squeeze(1) + 1  # every fact's digit, in order
    before = torch.searchsorted(digits, position - 1) - 1  # the last one before each '?' (-1: none)
    latest = data[torch.cat([digits, digits.new_zeros(1)])[before]]  # (none: index -1, a stand-in)
    latest_right = (before >= 0) & (latest == data[position])
    said_latest = (before >= 0) & (predictions[position] == latest)
    facts_after = before - torch.searchsorted(digits, position - distance)  # digits in between
    found = (distance, correct, fact, back, latest_right, said_latest, facts_after)
    return Scored(*(t[whole] for t in found))


def accuracy(correct: torch.Tensor):
    return correct.float().mean().item() if len(correct) else None


def counted(scored: Scored, chosen: torch.Tensor) -> dict:
    return {"queries": int(chosen.sum()), "accuracy": accuracy(scored.correct[chosen])}


def by_distance(scored: Scored, edges, width: int):
    """Accuracy by bucket of D, width wide, cut at the reach edges, named by its farthest region."""
    lo_d, hi_d = int(scored.distance.min()), int(scored.distance.max())
    cuts = set(range(0, hi_d + 1, width)) | {e for _, e in edges if e <= hi_d}
    cuts = sorted({c for c in cuts if c > lo_d} | {lo_d, hi_d + 1})
    rows = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        inside = (scored.distance >= lo) & (scored.distance < hi)
        if inside.any():
            region = next((name for name, edge in edges if hi <= edge), "beyond")
            rows.append({"from": lo, "to": hi - 1, "region": region, **counted(scored, inside)})
    return rows


def in_regions(scored: Scored, edges):
    """(name, mask) of the queries by the region of the reach their D falls in."""
    lows = [0] + [edge for _, edge in edges]
    bounds = zip(edges + [("beyond", math.inf)], lows)
    return [(name, (scored.distance >= lo) & (scored.distance < hi)) for (name, hi), lo in bounds]


def by_region(scored: Scored, edges) -> dict:
    regions = in_regions(scored, edges)
    return {name: accuracy(scored.correct[inside]) for name, inside in regions if inside.any()}


def held_in_c_mem(fact_back: torch.Tensor, edges):
    """Which queries find their fact in c_mem when read (None without one); D alone does not say
    it. Exact when n_s and n_m are multiples of c, as in the recipes."""
    limits = dict(edges)
    if "c_mem" not in limits:
        return None
    n_s = limits["segment"]  # a segment's last query reaches n_m (mem) and c * n_cm (c_mem) more
    return (fact_back > limits["mem"] - n_s) & (fact_back <= limits["c_mem"] - n_s)


def by_phase(scored: Scored, edges, rate: int):
    """[{"phase", "queries", "accuracy"}] of the facts held in c_mem, "all" first, then by the
    digit's place in its block of c; [] without such queries."""
    held = held_in_c_mem(scored.fact_back, edges)
    if held is None or not held.any():
        return []
    rows = []
    for phase in ["all", *range(rate)]:
        chosen = held if phase == "all" else held & (scored.fact_offset % rate == phase)
        if chosen.any():
            rows.append({"phase": phase, **counted(scored, chosen)})
    return rows


AFTER = (0, 1, 2, 3)  # key_use's columns: facts stated after the asked one, the last "or more"


def key_use(scored: Scored, edges) -> list:
    """Per region and over the facts held in c_mem: the accuracy, a recency reader's, how often it
    said the latest fact, the accuracy by facts stated after the asked one; [] without rivals."""
    if scored.latest_right.all():
        return []
    chosen = in_regions(scored, edges)
    held = held_in_c_mem(scored.fact_back, edges)
    if held is not None:
        chosen.append(("held in c_mem", held))
    after = scored.facts_after.clamp(max=AFTER[-1])
    return [
        {
            "region": name,
            **counted(scored, inside),
            "latest_fact_right": accuracy(scored.latest_right[inside]),
            "said_latest": accuracy(scored.said_latest[inside]),
            "by_facts_after": [accuracy(scored.correct[inside & (after == n)]) for n in AFTER],
        }
        for name, inside in chosen
        if inside.any()
    ]


def summary(scored: Scored, edges, rate: int) -> str:
    """One line: accuracy per region, and over the facts held in c_mem, all and per phase."""
    line = ", ".join(f"{name} {acc:.3f}" for name, acc in by_region(scored, edges).items())
    held, *phases = by_phase(scored, edges, rate) or [None]
    if held is None:
        return line
    each = " / ".join(f"{row['accuracy']:.3f}" for row in phases)
    return f"{line}; held in c_mem {held['accuracy']:.3f} ({held['queries']}; by phase {each})"


def fact_slots(fact_back: int, n_m: int, rate: int, n_held: int):
    """A fact held in c_mem: the slots (oldest first) of its digit and '=', one unless the digit
    opens its block (phase 0); the newest holds the c characters before mem's n_m."""
    digit_from_newest = -(-(fact_back - n_m) // rate)  # ceil
    marker_from_newest = -(-(fact_back + 1 - n_m) // rate)
    return n_held - digit_from_newest, n_held - marker_from_newest


def report(scored: Scored, model, out: str, caption: str = "") -> dict:
    """Print the accuracy by distance, phase and key use, plot OUT/recall.png; for metrics.json."""
    if len(scored.distance) == 0:
        print("recall: no query could be scored (raise --val-chars or lower --max-distance)")
        return {"by_distance": [], "by_phase": [], "key_use": []}
    cfg, edges = model.cfg, model.reach()
    rows = by_distance(scored, edges, cfg.seq_len)
    phases = by_phase(scored, edges, cfg.compression_rate)
    title = f"n_s={cfg.seq_len} n_m={cfg.mem_len} n_cm={cfg.c_mem_len} c={cfg.compression_rate}"
    reach = ", ".join(f"{name} < {edge}" for name, edge in edges)
    print(f"recall accuracy by distance (chance 0.10; {title}: {reach})")
    cells = lambda r: [f"{r['from']}-{r['to']}", r["region"], r["queries"], f"{r['accuracy']:.3f}"]
    print_table(["distance", "region", "queries", "accuracy"], map(cells, rows))
    print(f"recall accuracy by region: {summary(scored, edges, cfg.compression_rate)}")
    keys = key_use(scored, edges)
    if keys:
        print(
            "finding the fact by its key: accuracy, that of the latest fact stated, how often the "
            "model said its digit, and accuracy with 0, 1, 2, 3+ facts stated after the asked one"
        )
        fmt = lambda a: "-" if a is None else f"{a:.3f}"  # "-": no query with that many after
        rates = ("accuracy", "latest_fact_right", "said_latest")
        cells = lambda k: [k["region"], k["queries"], *(fmt(k[n]) for n in rates)]
        after = [*map(str, AFTER[:-1]), f"{AFTER[-1]}+"]  # facts stated after the asked one
        header = ["region", "queries", "accuracy", "latest fact", "said latest", *after]
        print_table(header, (cells(k) + [*map(fmt, k["by_facts_after"])] for k in keys))
    if cfg.mem_len and cfg.c_mem_len:
        title += f" f_c={cfg.compression}"
    plot_recall(rows, edges, phases, title, os.path.join(out, "recall.png"), caption)
    return dict(by_distance=rows, by_phase=phases, key_use=keys, reach=edges, title=title)


def plot_recall(rows, edges, phases, title: str, path: str, caption: str = "") -> None:
    """Accuracy by distance with the reach edges; across c_mem a level per phase, styled apart."""
    plt = plots.pyplot()
    if plt is None:
        return
    plt.figure(figsize=(7, 4.6 if caption else 4))
    middle = [(row["from"] + row["to"]) / 2 for row in rows]
    plt.plot(middle, [row["accuracy"] for row in rows], marker="o", label="all queries, by D")
    styles = [(3.5, "-"), (2.5, "--"), (2, ":"), (1.5, "-.")]
    for (name, edge), lo in zip(edges, [0] + [edge for _, edge in edges]):
        plt.axvline(edge, color="gray", linestyle=":")
        plt.text(edge, 0.5, f"{name} reach", rotation=90, va="center", ha="right", fontsize=8)
        for p in phases[1:] if name == "c_mem" else []:  # phases[0] is all of them together
            width, style = styles[p["phase"] % len(styles)]
            label = f"held in c_mem, phase {p['phase']}: {p['accuracy']:.2f} ({p['queries']})"
            plt.hlines(p["accuracy"], lo, edge, f"C{p['phase'] + 1}", style, label=label, lw=width)
    plt.axhline(0.1, color="black", linestyle="--", linewidth=0.8, label="chance")
    plt.title(title, fontsize=9, loc="left")
    plt.gca().set(xlabel="D: distance from fact to query (characters)", ylabel="recall accuracy")
    plt.ylim(0, 1.05)
    legend_title = "phase p: the fact's digit at place p\nof its block of c" if phases else None
    plt.legend(fontsize=7, title=legend_title, title_fontsize=7)
    plots.save(plt, path, caption)


def parse_args(argv=None):
    parser = task_flags("recall", __doc__, "the accuracy report of OUT/ckpt.pt")
    group = parser.add_argument_group("the recall task")

    def add(name, text, **kind):
        text = f"{text} (default {DEFAULTS[name]})"
        group.add_argument("--" + name.replace("_", "-"), help=text, **kind)

    add("max_distance", f"longest D, log-uniform from {MIN_DISTANCE}", type=at_least(MIN_DISTANCE))
    add("live_facts", "most facts waiting at once (more: a query needs its key)", type=positive)
    distractors = "more facts, never asked, while --live-facts wait: only its key finds a fact"
    add("distractors", distractors, action="store_true", default=None)
    add("curriculum", "the longest D grows to --max-distance over this part", type=fraction)
    add("curriculum_hold", "first hold every fact in the segment for this part", type=fraction)
    add("val_chars", "length of the validation text", type=at_least(1000))
    add("loss_on", "all characters, or the answer digit after each '?'", choices=["all", "answers"])
    return parser.parse_args(argv)


def train(args) -> None:
    """Train, the accuracy by region at each evaluation, the report at the end (metrics.json)."""
    with processes() as world:
        data, answers = load_data(args, args.batch_size * world)
        last = {}

        def validate(model):  # at each evaluation of the training, in place of its own
            evaluation = evaluate.on_validation(model, data, args.batch_size, args.dtype)
            predictions = evaluation.predictions.cpu()
            scored = score(predictions, data.val, answers, args.batch_size, args.seq_len)
            last.update(model=model, scored=scored)
            print("recall accuracy: " + summary(scored, model.reach(), args.compression_rate))
            return {"val_loss": evaluation.loss, "recall": by_region(scored, model.reach())}

        metrics = train_shakespeare.train(args, data, validate)
    if metrics is not None:  # rank 0, the run finished: the report on its last evaluation
        ckpt = checkpoint.read(os.path.join(args.out, "ckpt.pt"), torch.device("cpu"))
        foot = caption(ckpt, "the training run")
        metrics["recall"] = report(last["scored"], last["model"], args.out, foot)
        files.write_json(os.path.join(args.out, "metrics.json"), metrics)


def evaluate_checkpoint(args) -> None:
    """--eval-only: OUT/ckpt.pt's report on its text, its memory cut where asked (not recorded)."""
    model, ckpt, cut = evaluate_command.load_checkpoint(args, tasks=("recall",))
    data, answers = load_data(args, saved_args=ckpt["args"], need_train=False)
    evaluation = evaluate_command.evaluate_checkpoint(args, model, ckpt, data, cut)
    n_s = model.cfg.seq_len
    scored = score(evaluation.predictions.cpu(), data.val, answers, args.batch_size, n_s)
    report(scored, model, args.out, caption(ckpt, "python -m research.recall --eval-only"))


def main(argv=None) -> int:
    args = parse_args(argv)
    keep_freed_memory()

    def run():
        train_shakespeare.check_args(args)
        if args.data is not None:
            raise UserError("--data: the recall task makes its own text")
        if args.curriculum_hold and args.seq_len - 1 < MIN_DISTANCE:
            seg = f"a segment of {args.seq_len} characters (D >= {MIN_DISTANCE})"
            raise UserError(f"--curriculum-hold: no fact fits inside {seg}")
        (evaluate_checkpoint if args.eval_only else train)(args)

    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
