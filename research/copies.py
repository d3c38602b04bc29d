"""Loss by copy distance: which characters a longer reach could help with, and whether it does.

    python -m research.copies FILE [FILE ...]      # a text's share of characters by copy distance

The copy distance d of position p is p - q, for the last earlier q in its stream at which the same
n-gram ended; the query at index i of its segment that predicts p finds the copy e = d - 1 - i
beyond its segment: in mem when 1 <= e <= n_m, in c_mem up to n_m + c * n_cm (docs/REACH.md, the
score). EDGES are the code study's (n_s 64)."""

import sys

import torch

from research import parser
from training.checks import UserError, exit_status, one_line

NGRAM = 13
EDGES = (64, 96, 192, 1000)
PLAIN_EDGES = (96, 160, 352, 1000)  # the corpus profile: distances alone, not position-aware
NEVER = -1
SPANS = [f"{lo + 1}-{hi}" for lo, hi in zip((0, *EDGES[:-1]), EDGES)]
BUCKETS = ["segment", *SPANS, f">{EDGES[-1]}", "never"]  # by how far the copy lies beyond


def copy_distances(text: str, n: int = NGRAM) -> torch.Tensor:
    """[len(text)]: at p, p - q for the last q < p where the n-gram ending at p ended, or NEVER."""
    distances = [NEVER] * len(text)
    last = {}
    for p in range(n - 1, len(text)):
        gram = text[p - n + 1 : p + 1]
        q = last.get(gram)
        if q is not None:
            distances[p] = p - q
        last[gram] = p
    return torch.tensor(distances, dtype=torch.long)


def bucket_of(beyond: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """Each character's index into BUCKETS."""
    bucket = 1 + torch.bucketize(beyond, torch.tensor(EDGES), right=False)  # e in (lo, hi] -> span
    bucket = torch.where(beyond <= 0, torch.zeros_like(bucket), bucket)
    return torch.where(distance == NEVER, torch.full_like(bucket, len(EDGES) + 2), bucket)


def evaluation_geometry(text: str, n_streams: int, seq_len: int):
    """For each position p of a text cut as training.evaluate cuts it: its copy distance within its
    stream, and the index in its segment of the query that predicts p (-1 for position 0)."""
    length = (len(text) - 1) // n_streams
    distance = torch.full((len(text),), NEVER, dtype=torch.long)
    index = torch.full((len(text),), -1, dtype=torch.long)
    for b in range(n_streams):
        start = b * length
        end = start + length + 1 if b < n_streams - 1 else len(text)  # the last takes the tail
        distance[start + 1 : end] = copy_distances(text[start:end])[1:]
        index[start + 1 : start + length + 1] = torch.arange(length) % seq_len
    tail = len(text) - (n_streams * length + 1)
    index[n_streams * length + 1 :] = torch.arange(tail)
    return distance, index


def by_bucket(char_losses: torch.Tensor, distance: torch.Tensor, index: torch.Tensor):
    """{bucket: {"loss" (mean nats/char), "share", "chars"}} of the characters with a loss."""
    scored = ~torch.isnan(char_losses) & (index >= 0)
    bucket = bucket_of(distance - 1 - index, distance)[scored]
    losses = char_losses[scored].double()
    out = {}
    for k, name in enumerate(BUCKETS):
        chosen = bucket == k
        n = int(chosen.sum())
        mean = float(losses[chosen].mean()) if n else None
        out[name] = {"loss": mean, "share": n / max(1, len(losses)), "chars": n}
    return out


def regions_of(model_reach, seq_len: int):
    """The region of the model's reach that holds each bucket's copy."""
    beyond = [(name, edge - seq_len) for name, edge in model_reach if name != "segment"]
    spans = [next((name for name, edge in beyond if hi <= edge), "beyond") for hi in EDGES]
    return ["segment", *spans, "beyond", "-"]


def print_by_bucket(rows: dict, regions, label: str = "") -> None:
    print(
        f"validation loss by copy distance{label} ({NGRAM}-gram; the buckets count how far the "
        f"copy lies beyond the query's own segment)"
    )
    print(f"{'bucket':>10} {'region':>8} {'share':>7} {'loss':>7}")
    for (name, row), region in zip(rows.items(), regions):
        loss = "-" if row["loss"] is None else f"{row['loss']:.3f}"
        print(f"{name:>10} {region:>8} {row['share']:>7.3f} {loss:>7}")


def profile(text: str) -> dict:
    """Share of a text's characters by plain copy distance (the corpus's own profile)."""
    distance = copy_distances(text)
    bucket = torch.bucketize(distance, torch.tensor(PLAIN_EDGES), right=True)  # d in [lo, hi)
    spans = [f"{lo}-{hi - 1}" for lo, hi in zip(PLAIN_EDGES, PLAIN_EDGES[1:])]
    names = [f"<{PLAIN_EDGES[0]}", *spans, f">={PLAIN_EDGES[-1]}"]
    seen = distance != NEVER
    out = {name: float(((bucket == k) & seen).double().mean()) for k, name in enumerate(names)}
    out["never"] = float((distance == NEVER).double().mean())
    return out


def main(argv=None) -> int:
    p = parser("copies", "The share of each text's characters by copy distance.")
    p.add_argument("paths", nargs="+", metavar="FILE", help="UTF-8 texts to profile")
    args = p.parse_args(argv)

    def run():
        for path in args.paths:
            try:
                with open(path, encoding="utf-8") as f:
                    shares = profile(f.read())
            except (OSError, UnicodeDecodeError) as e:
                raise UserError(f"cannot read {path} as UTF-8 text ({one_line(e)})") from None
            print(f"{path}: " + ", ".join(f"{name} {share:.1%}" for name, share in shares.items()))

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
