"""--sample: text from a trained model, one character at a time through its memory."""

import torch

from .checks import UserError


def add_arguments(parser) -> None:
    m = parser.add_argument_group("--sample (on OUT/ckpt.pt)")
    m.add_argument("--sample", type=int, metavar="N", help="print N generated characters")
    m.add_argument(
        "--prompt",
        help="text that starts the sample (default: a newline, or '.' for the recall task)",
    )
    m.add_argument("--temperature", type=float, default=0.8, help="sampling temperature")
    m.add_argument("--top-k", type=int, help="sample from the k most likely characters")


def sample(model, vocab, args, device) -> None:
    """Print --sample characters after --prompt (default: a newline, or "." where the vocabulary
    has none, as in the recall task), drawn with --temperature and --top-k from --seed."""
    prompt = args.prompt if args.prompt is not None else "\n" if "\n" in vocab else "."
    if set(prompt) - set(vocab):
        raise UserError(
            f"--prompt has characters not in the vocabulary: {sorted(set(prompt) - set(vocab))!r}"
        )
    if not prompt:
        raise UserError("--prompt must not be empty")
    torch.manual_seed(args.seed)
    out = model.generate(
        torch.tensor([[vocab.index(ch) for ch in prompt]], device=device),
        args.sample,
        temperature=args.temperature,
        top_k=args.top_k,
    )
    print("".join(vocab[i] for i in out[0].tolist()))
