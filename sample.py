"""Text from a trained model, one character at a time through its memory (as nanoGPT's sample.py),
from the checkpoint OUT/ckpt.pt (--out, default out):

    python sample.py --chars 500 --prompt "ROMEO:"
"""

import sys

import torch

from training import checkpoint, checks
from training.checks import UserError


def parse_args(argv=None):
    p = checks.command_flags("python sample.py", __doc__)
    p.add_argument("--chars", type=int, default=500, help="how many characters to generate")
    p.add_argument("--prompt", help="the text it starts from; by default a newline, else '.'")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature")
    p.add_argument("--top-k", type=int, help="sample from the k most likely characters")
    p.add_argument("--seed", type=int, default=1337, help="the random draws' seed")
    return p.parse_args(argv)


def sample(model, vocab, args, device) -> str:
    """--prompt and the --chars characters drawn after it (--temperature, --top-k, --seed); the
    default prompt is a newline, or "." where the vocabulary has none (the recall task's)."""
    prompt = args.prompt if args.prompt is not None else "\n" if "\n" in vocab else "."
    unknown = sorted(set(prompt) - set(vocab))
    if unknown:
        raise UserError(f"--prompt has characters not in the vocabulary: {unknown!r}")
    if not prompt:
        raise UserError("--prompt must not be empty")
    torch.manual_seed(args.seed)
    ids = torch.tensor([[vocab.index(ch) for ch in prompt]], device=device)
    out = model.generate(ids, args.chars, temperature=args.temperature, top_k=args.top_k)
    return "".join(vocab[i] for i in out[0].tolist())


def main(argv=None) -> int:
    args = parse_args(argv)

    def run():
        checks.check_flags(args)
        device = checks.pick_device(args.device)
        if device.type == "cpu":
            checks.cpu_threads()  # the cores other jobs leave free
        model, ckpt = checkpoint.load_model(args.out, device)
        print(sample(model, ckpt["vocab"], args, device))

    return checks.exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
