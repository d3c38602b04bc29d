"""What train_shakespeare.py does besides training: --bench (time training steps), and, on the
checkpoint in --out, --sample, --eval-only and --analyze. ts is the script itself, whose model,
optimizer, training step and evaluation these modes reuse."""
import math

import torch

from compressive import CompressiveTransformer

from . import analysis, bench, checkpoint, recall, sample
from .checks import UserError
from .device import DTYPES, autocast_for, compile_when_full, grad_scaler, pick_device


def run(args, ts) -> None:
    if args.bench:
        device = pick_device(args.device)
        torch.manual_seed(args.seed)
        model = ts.make_model(args.model, ts.model_config(args, vocab_size=65)).to(device)
        optimizer, groups = ts.make_optimizer(model, args), ts.clip_groups(model)
        step_model = compile_when_full(model) if args.compile else model
        autocast, scaler = autocast_for(device, args.dtype), grad_scaler(device, args.dtype)
        step = lambda x, y, memory: ts.train_step(step_model, optimizer, scaler, groups, x, y,
                                                  memory, autocast, args.grad_clip, 1)[2]
        return bench.bench(step, model, args.batch_size, args.bench_steps, args.seed, device,
                           DTYPES[args.dtype])
    device = pick_device(args.device)
    model, ckpt = checkpoint.load_model(args.out, device, ts.make_model)
    if args.sample is not None:
        return sample.sample(model, ckpt["vocab"], args, device)
    if args.analyze and not isinstance(model, CompressiveTransformer):
        raise UserError("--analyze reads the attention over [c_mem; mem; segment] of the "
                        "compressive, xl and vanilla models; this checkpoint holds a Feedback "
                        "Transformer")
    task = recall.checkpoint_task(args, ckpt["args"])  # the validation text it was trained on
    _, _, val, answers = ts.load_data(args, task, vocab=ckpt["vocab"], saved_args=ckpt["args"],
                                      need_train=False)
    if args.analyze:
        streams = ts.make_streams(val, args.batch_size).to(device)
        analysis.analyze(model, streams, ckpt["step"], args.out)
        if answers is not None and model.cfg.mem_len and model.cfg.c_mem_len:
            recall.print_where_queries_look(recall.where_queries_look(model, streams, answers))
        return
    targets = recall.loss_targets(args, ckpt["args"], task)
    loss, predictions = ts.evaluate(model, val.to(device), args.batch_size, model.cfg.seq_len,
                                    autocast_for(device, args.dtype), targets)
    print(f"val loss {loss:.4f} nats/char, {loss / math.log(2):.4f} bpc (step {ckpt['step']})")
    if answers is not None:
        scored = recall.score(predictions.cpu(), val, answers, args.batch_size, model.cfg.seq_len)
        recall.report(scored, model, args.out)
