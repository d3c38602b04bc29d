"""The specification of train_shakespeare.py and its plumbing in training/, as tests: flags, data,
checkpoints, errors, precision, compile, torchrun and --bench. The model's own specification is
test_compressive.py at the top of the repository; the studies' are beside them in research/.
Run: pytest -q"""

import ast
import dataclasses
import hashlib
import inspect
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import nullcontext

import pytest
import torch

import bench
import evaluate as evaluate_command
import sample
import train_shakespeare as ts
from compressive import CompressiveConfig, CompressiveTransformer
from conftest import DAMAGES, ROOT, SHAKESPEARE, TINY_FLAGS, craft, damage, error_line, resave
from training import checkpoint, checks, data, evaluate, files


def test_streams_stay_contiguous_across_steps():
    text = torch.arange(1001)
    streams = ts.make_streams(text, 4)
    assert streams.shape == (4, 251)
    assert streams[1, 0] == streams[0, -1]  # strand b ends where strand b+1 begins
    x0, y0, wrapped0 = ts.segment_at(streams, streams, 0, 16)
    x1, y1, wrapped1 = ts.segment_at(streams, streams, 1, 16)
    assert wrapped0 and not wrapped1
    assert (x1[:, 0] == x0[:, -1] + 1).all() and (y0 == x0 + 1).all()  # row b continues row b
    n_segments = 250 // 16
    assert ts.segment_at(streams, streams, n_segments, 16)[2]  # wraps after the last segment
    targets = streams.masked_fill(streams % 2 == 0, -100)  # a task that scores odd ids alone
    x, y, _ = ts.segment_at(streams, targets, 1, 16)
    assert x.equal(x1) and y.equal(y1.masked_fill(y1 % 2 == 0, -100))


def test_each_process_reads_its_own_strands_on_its_device():
    ids = torch.arange(1001)
    text = data.Data([str(i) for i in range(1001)], ids, ids[:100], "ids", train_targets=ids + 1)
    args = ts.parse_args(["--batch-size", "2", "--seq-len", "16"])
    strands = ts.make_streams(ids, 4)  # 2 processes x 2 streams
    first, _ = ts.streams_of_rank(text, args, 0, 2, "cpu")
    second, targets = ts.streams_of_rank(text, args, 1, 2, "cpu")
    assert first.equal(strands[:2]) and second.equal(strands[2:]) and targets.equal(second + 1)
    on_meta = ts.streams_of_rank(text, args, 1, 2, "meta")
    assert all(t.is_meta and t.shape == second.shape for t in on_meta)


def test_a_validation_text_written_to_a_file_reads_back_with_its_facts(tmp_path):
    vocab = [".", "=", "?", "A", "B", "1"]
    text = "..AB=1....AB?1.."
    val = data.encode(text, vocab)
    facts = [{"query": 12, "fact": [1, 2, 3, 4, 5]}]
    path = str(tmp_path / "validation.json")
    data.write_validation(path, data.Data(vocab, None, val, "a task's text"), facts)
    read, read_facts = data.read_validation(path, vocab)
    assert read.val.equal(val) and (read.vocab, read.name, read.train) == (
        vocab,
        "a task's text",
        None,
    )
    assert read_facts == facts
    for written, message in [  # anything else: one line
        ("not json", "is not a validation text of a checkpoint"),
        ('{"name": "x", "text": "..AB"}', "no name, text and facts"),
        ('{"name": "x", "text": "..AB", "facts": [{"query": 9, "fact": [1]}]}', "a fact is not"),
        ('{"name": "x", "text": "..AB", "facts": [{"query": 1, "fact": []}]}', "a fact is not"),
        ('{"name": "x", "text": "..AB", "facts": [{"query": true, "fact": [1]}]}', "a fact is not"),
        ('{"name": "x", "text": "..AC", "facts": []}', "not the checkpoint's text"),
    ]:
        (tmp_path / "bad.json").write_text(written)
        with pytest.raises(checks.UserError, match=message):
            data.read_validation(str(tmp_path / "bad.json"), vocab)
    with pytest.raises(checks.UserError, match="no validation text at"):
        data.read_validation(str(tmp_path / "none.json"), vocab)


@pytest.mark.slow  # trains: seconds
def test_training_steps_lower_the_loss_and_write_metrics(small_text, tmp_path):
    out = str(tmp_path / "run")
    assert (
        ts.main(
            [
                "--data",
                small_text,
                "--out",
                out,
                "--steps",
                "60",
                "--eval-every",
                "60",
                "--log-every",
                "20",
                *TINY_FLAGS,
            ]
        )
        == 0
    )
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["step"] == 60 and metrics["tokens_seen"] == 60 * 4 * 16
    log = metrics["train_log"]  # the training loss at every log line
    assert [row["step"] for row in log] == [20, 40, 60] and log[-1]["train_loss"] == metrics[
        "train_loss"
    ]
    assert all(math.isfinite(row["train_loss"]) and row["recon_loss"] >= 0 for row in log)
    assert metrics["val_loss"] < math.log(len(set(open(small_text).read()))) - 0.5
    assert abs(metrics["val_bpc"] - metrics["val_loss"] / math.log(2)) < 1e-9
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    for key in ("config", "model", "optimizer", "step", "rng", "vocab", "memory", "args"):
        assert key in ckpt


@pytest.mark.slow  # trains or compiles: seconds
def test_resume_ends_where_an_uninterrupted_run_would(small_text, tmp_path):
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    common = ["--data", small_text, "--steps", "24", "--eval-every", "100", *TINY_FLAGS]
    assert ts.main([*common, "--out", whole]) == 0
    assert ts.main([*common, "--out", split, "--stop-after", "12"]) == 0
    assert torch.load(os.path.join(split, "ckpt.pt"), weights_only=True)["step"] == 12
    assert ts.main([*common, "--out", split, "--resume"]) == 0
    a = torch.load(os.path.join(whole, "ckpt.pt"), weights_only=True)
    b = torch.load(os.path.join(split, "ckpt.pt"), weights_only=True)
    assert a["step"] == b["step"] == 24
    assert [row["step"] for row in b["train_log"]] == [12, 24]  # the log is carried on
    for name, tensor in a["model"].items():
        torch.testing.assert_close(b["model"][name], tensor, rtol=0, atol=0, msg=name)


def test_resume_follows_the_schedule_of_the_flags_it_is_given_from_the_step_reached(
    small_text, tmp_path
):
    """--resume keeps no schedule of its own: the learning rate at each step is the warm-up and
    cosine decay of the resumed command's --lr, --min-lr, --warmup and --steps. A larger --steps
    after a finished run raises the rate again, to where a run planned that long from the start
    would be."""
    out = str(tmp_path / "run")
    common = ["--data", small_text, "--out", out, "--eval-every", "100", *TINY_FLAGS]
    common += ["--warmup", "1"]

    def last_lr():  # the rate the optimizer last stepped with, as the checkpoint keeps it
        ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
        return ckpt["step"], ckpt["optimizer"]["param_groups"][0]["lr"]

    def planned(step, steps, lr=3e-3, min_lr=1e-4, warmup=1):  # TINY_FLAGS's, --min-lr's default
        return min_lr + 0.5 * (lr - min_lr) * (
            1 + math.cos(math.pi * (step - warmup) / (steps - warmup))
        )

    assert ts.main([*common, "--steps", "6"]) == 0
    step, decayed = last_lr()
    assert step == 6 and math.isclose(decayed, planned(5, 6), rel_tol=1e-9)  # 3.8e-4
    assert ts.main([*common, "--steps", "12", "--stop-after", "1", "--resume"]) == 0
    step, resumed = last_lr()
    assert step == 7 and math.isclose(resumed, planned(6, 12), rel_tol=1e-9)  # 1.8e-3
    assert resumed > 4 * decayed


def test_sample_and_evaluate_use_the_checkpoint_and_evaluate_records_its_loss(
    small_text, tmp_path, capsys
):
    out = str(tmp_path / "run")
    assert ts.main(["--data", small_text, "--out", out, "--steps", "5", *TINY_FLAGS]) == 0
    capsys.readouterr()
    flags = ["--out", out, "--chars", "40", "--prompt", "First", "--top-k", "5", "--device", "cpu"]
    assert sample.main(flags) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("First") and len(printed.rstrip("\n")) >= 45 - 1
    # no --data: its own text; no --batch-size: the training's validation streams (4 here)
    assert evaluate_command.main(["--out", out, "--device", "cpu", "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert f"validation text: {small_text}" in printed and "val loss" in printed
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["eval_only"]["step"] == 5 and metrics["eval_only"]["val_loss"] > 0
    assert metrics["history"][-1]["step"] == 5  # the training's own record is kept
    # the same text, streams and segments as the training's last evaluation: the same loss
    torch.testing.assert_close(
        metrics["eval_only"]["val_loss"], metrics["val_loss"], rtol=1e-6, atol=0
    )
    # the ablation: the same weights with less memory, recorded beside the full-memory loss
    flags = ["--out", out, "--data", small_text, "--device", "cpu", "--dtype", "float32"]
    flags += ["--eval-c-mem-len", "0"]
    assert evaluate_command.main(flags) == 0
    assert "memory cut to n_m=16 n_cm=0" in capsys.readouterr().out
    after = json.load(open(os.path.join(out, "metrics.json")))
    assert after["eval_only"] == metrics["eval_only"]  # the full-memory figures are kept
    assert after["ablations"]["n_m=16 n_cm=0"]["val_loss"] != metrics["eval_only"]["val_loss"]
    for bad, says in (
        (["--eval-mem-len", "17"], "trained with 16"),
        (["--eval-mem-len", "1"], "at least c = 2"),
    ):
        assert evaluate_command.main(["--out", out, "--device", "cpu", *bad]) == 2
        assert says in error_line(capsys)
    for command, bad, says in (
        (sample.main, ["--chars", "-1"], "--chars must be >= 0"),
        (sample.main, ["--prompt", "\u00e9"], "not in the vocabulary"),
        (sample.main, ["--temperature", "nan"], "--temperature must be a finite number"),
        (evaluate_command.main, ["--batch-size", "0"], "--batch-size must be positive"),
        (sample.main, ["--out", str(tmp_path / "nothing")], "no checkpoint"),
        (evaluate_command.main, ["--out", str(tmp_path / "nothing")], "no checkpoint"),
    ):
        assert command(["--out", out, "--device", "cpu", *bad]) == 2
        assert says in error_line(capsys)


def test_evaluation_keeps_each_character_where_the_walk_reads_it(small_text):
    """per_character keeps each character's loss and prediction from the segment that predicts it
    (a model without memory reads each segment alone), and evaluate's loss is their mean."""
    torch.manual_seed(0)
    args = ts.parse_args([*TINY_FLAGS])
    model = checkpoint.make_model(dataclasses.asdict(ts.model_config(args, 65)))
    text = torch.randint(0, 65, (1003,))  # 4 streams of 250 and a tail of 2 (the last stream's)
    targets = text.masked_fill(text % 3 == 0, data.IGNORE)
    for scored in (None, targets):
        loss = evaluate.evaluate(model, text, 4, 16, nullcontext(), scored)
        each = evaluate.per_character(model, text, 4, 16, nullcontext(), scored)
        counted = ~torch.isnan(each.char_losses)
        assert counted.sum() == (1002 if scored is None else scored[1:].ne(data.IGNORE).sum())
        mean = each.char_losses[counted].double().mean().item()
        torch.testing.assert_close(mean, loss, rtol=1e-5, atol=0)  # float32 sums, another order
    args = ts.parse_args([*TINY_FLAGS, "--model", "vanilla"])
    vanilla = checkpoint.make_model(dataclasses.asdict(ts.model_config(args, 65))).eval()
    each = evaluate.per_character(vanilla, text, 4, 16, nullcontext())
    for start, end in ((2 * 250 + 16, 2 * 250 + 32), (1000, 1002)):  # stream 2's 2nd; the tail
        with torch.no_grad():
            logits = vanilla(text[None, start:end])[0][0]  # one row, not four: another order
        alone = torch.nn.functional.cross_entropy(
            logits, text[start + 1 : end + 1], reduction="none"
        )
        torch.testing.assert_close(
            each.char_losses[start + 1 : end + 1], alone, rtol=1e-5, atol=1e-6
        )
        # an argmax of the other order: the predicted character's logit is the largest, to
        # float32's rounding (a near tie may fall either way on another processor)
        predicted = logits.gather(1, each.predictions[start + 1 : end + 1, None])[:, 0]
        torch.testing.assert_close(predicted, logits.max(dim=-1).values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--seq-len", "0"], "--seq-len must be positive"),
        (["--mem-len", "-3"], "--mem-len must be >= 0"),
        (["--d-model", "30", "--n-heads", "4"], "divisible"),
        (["--data", "/nonexistent/file.txt"], "data file not found"),
        (["--batch-size", "100000"], "cannot feed"),
        (["--batch-size", "4", "--seq-len", "2000"], "--seq-len is longer than each training"),
        (["--model", "feedback", "--mem-len", "0"], "needs mem_len >= 1"),
        (["--log-every", "0"], "--log-every must be positive"),
        (["--lr", "1e-3", "--min-lr", "1e-2"], "--min-lr 0.01 is above --lr 0.001"),
        (["--resume", "--overwrite"], "--resume continues the checkpoint and --overwrite"),
        pytest.param(
            ["--device", "mps"],
            "no usable mps backend",
            marks=pytest.mark.skipif(
                torch.backends.mps.is_available(), reason="this machine has mps"
            ),
        ),
    ],
)
def test_bad_flags_exit_non_zero_with_one_message(flags, message, small_text, tmp_path, capsys):
    if "--data" not in flags:  # a small text, read at once
        flags = [*flags, "--data", small_text]
    if "--out" not in flags:
        flags = [*flags, "--out", str(tmp_path / "run")]
    assert ts.main(flags) == 2
    assert message in error_line(capsys)


@pytest.mark.parametrize("name", ["ckpt.pt", "metrics.json", "loss.png"])
@pytest.mark.parametrize("flag", [[], ["--overwrite"], ["--resume"]])
def test_a_folder_named_as_a_runs_file_is_one_line_before_training(
    name, flag, small_text, tmp_path, capsys
):
    (tmp_path / "run" / name).mkdir(parents=True)
    flags = ["--data", small_text, "--out", str(tmp_path / "run"), *TINY_FLAGS, *flag]
    assert ts.main(flags) == 2
    printed = capsys.readouterr()
    assert printed.err.splitlines() == [
        f"error: {tmp_path / 'run' / name} is not a file: move it away, or pass another --out"
    ]
    assert "step" not in printed.out  # nothing trained


def test_a_model_too_large_for_the_machine_gives_one_error_line(small_text, tmp_path, capsys):
    out = tmp_path / "run"
    # about 3e11 floats for W_q, W_k, W_v: far beyond this machine's memory, refused at once
    assert (
        ts.main(
            [
                "--data",
                small_text,
                "--out",
                str(out),
                *TINY_FLAGS,
                "--d-model",
                "300000",
                "--n-heads",
                "1",
            ]
        )
        == 2
    )
    line = error_line(capsys)
    assert "out of memory" in line and "GiB" in line and "lower --d-model" in line
    assert not out.exists()
    cuda_error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "lower --d-model" in checks.out_of_memory(cuda_error)
    assert checks.out_of_memory(cuda_error) is not None
    assert checks.out_of_memory(RuntimeError("shape mismatch")) is None


@pytest.mark.slow  # a fresh Python that imports torch
def test_the_command_line_reports_bad_input_without_a_traceback(tmp_path):
    script = os.path.join(ROOT, "train_shakespeare.py")
    # one process (each costs a Python and torch start-up); argparse's own errors exit 2 alike
    result = subprocess.run(
        [sys.executable, script, "--data", str(tmp_path / "missing.txt")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "data file not found" in result.stderr
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr


# ---------------------------------------------------------------- device, precision, compile


@pytest.mark.slow  # trains or compiles: seconds
def test_half_precision_training_stays_finite_and_close_to_float32(small_text, tmp_path):
    """bfloat16 keeps 8 bits of mantissa, float16 11 (with its gradient scaler): over 20 steps
    the rounding moves the validation loss by a few thousandths, far less than training lowers
    it."""
    val = {}
    for dtype in ("float32", "bfloat16", "float16"):
        out = str(tmp_path / dtype)
        assert (
            ts.main(
                [
                    "--data",
                    small_text,
                    "--out",
                    out,
                    "--steps",
                    "20",
                    "--eval-every",
                    "20",
                    *TINY_FLAGS,
                    "--dtype",
                    dtype,
                ]
            )
            == 0
        )
        val[dtype] = json.load(open(os.path.join(out, "metrics.json")))["val_loss"]
    assert val["float32"] < math.log(len(set(open(small_text).read()))) - 0.3
    for dtype in ("bfloat16", "float16"):
        assert math.isfinite(val[dtype]) and abs(val[dtype] - val["float32"]) < 0.05, val


X86_FLAGS = {"fpu", "sse2", "avx2", "avx512f", "avx512bw", "fma"}  # a CPU's flags without bf16


@pytest.mark.parametrize(
    "machine, flags, chosen, why",
    [
        ("x86_64", X86_FLAGS | {"avx512_bf16"}, "bfloat16", "natively (avx512_bf16)"),
        ("x86_64", X86_FLAGS | {"amx_bf16", "avx512_bf16"}, "bfloat16", "amx_bf16, avx512"),
        ("x86_64", X86_FLAGS, "float32", "lists no avx512_bf16 or amx_bf16"),
        ("aarch64", {"fp", "asimd", "sve"}, "float32", "lists no avx512_bf16 or amx_bf16"),
        # Arm's bf16, and no /proc/cpuinfo: not known to be native to oneDNN, so float32
        ("aarch64", {"fp", "asimd", "bf16"}, "float32", "--dtype bfloat16 to try"),
        ("arm64", set(), "float32", "--dtype bfloat16 to try"),
    ],
)
def test_dtype_auto_picks_bf16_where_the_cpu_computes_it_natively(
    monkeypatch, machine, flags, chosen, why
):
    """--dtype auto on a CPU, whatever this one is: its flags are those of the CPU described
    (machine: which it is), and nothing is timed (the choice is the same under any load)."""
    monkeypatch.setattr(checks, "cpu_flags", lambda: set(flags))
    name, reason = checks.pick_dtype("auto", torch.device("cpu"))
    assert name == chosen and why in reason, reason
    assert reason.startswith("auto: ")
    for asked in ("float32", "bfloat16", "float16"):  # a dtype asked for is kept
        assert checks.pick_dtype(asked, torch.device("cpu")) == (asked, "as --dtype asked")


def test_dtype_auto_on_a_gpu_and_elsewhere(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "a GPU")
    for native, chosen in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(
            torch.cuda, "is_bf16_supported", lambda including_emulation, n=native: n
        )
        name, reason = checks.pick_dtype("auto", torch.device("cuda", 0))
        assert name == chosen and "a GPU" in reason, reason
    name, reason = checks.pick_dtype("auto", torch.device("mps"))
    assert name == "float32" and "not on mps" in reason
    # auto is what the commands choose by default
    assert bench.parse_args([]).dtype == "auto" and evaluate_command.parse_args([]).dtype == "auto"


def test_the_cpu_threads_are_the_cores_other_jobs_leave_free(monkeypatch):
    """Without OMP_NUM_THREADS, the commands compute on the cores the load average leaves free,
    at least one: OpenMP's spinning threads stall on a core another job holds."""
    before = torch.get_num_threads()
    monkeypatch.setattr(checks.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)  # torch's default: the 4 cores
    chosen = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    monkeypatch.delenv("OMP_NUM_THREADS")
    for load, threads in ((0.1, 4), (1.2, 3), (2.6, 1), (9.0, 1)):
        monkeypatch.setattr(checks.os, "getloadavg", lambda load=load: (load, load, load))
        said = checks.cpu_threads()
        assert chosen[-1] == threads and said.startswith(f"{threads} of 4 cores (load "), said
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's word decides
    chosen.clear()
    assert checks.cpu_threads() == "4, as OMP_NUM_THREADS says" and not chosen
    monkeypatch.undo()
    assert torch.get_num_threads() == before


def test_checkpoints_resume_and_evaluate_across_dtypes(small_text, tmp_path, monkeypatch, capsys):
    """A run in bf16 resumes in float32 and back, its checkpoint evaluates in either and samples;
    weights, optimizer state and memory stay float32 under autocast. Evaluation's default, auto,
    names what it chose and why."""
    out = str(tmp_path / "run")
    common = ["--data", small_text, "--out", out, *TINY_FLAGS, "--steps", "3"]
    assert ts.main([*common, "--dtype", "bfloat16", "--stop-after", "1"]) == 0
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    memory = [t for part in ckpt["memory"][0] if part is not None for t in part]
    tensors = [*ckpt["model"].values(), *memory]
    tensors += [v for s in ckpt["optimizer"]["state"].values() for v in s.values() if v.dim()]
    assert tensors and all(t.dtype == torch.float32 for t in tensors)
    assert ts.main([*common, "--dtype", "float32", "--stop-after", "1", "--resume"]) == 0
    assert ts.main([*common, "--dtype", "bfloat16", "--resume"]) == 0
    assert json.load(open(os.path.join(out, "metrics.json")))["step"] == 3
    monkeypatch.setattr(checks, "cpu_flags", lambda: X86_FLAGS | {"avx512_bf16"})
    capsys.readouterr()
    losses = {}
    for flags in ([], ["--dtype", "float32"]):
        assert evaluate_command.main(["--out", out, "--device", "cpu", *flags]) == 0
        printed = capsys.readouterr().out
        losses[bool(flags)] = json.load(open(os.path.join(out, "metrics.json")))["eval_only"]
        chosen = "float32 (as --dtype asked)" if flags else "bfloat16 (auto: the CPU computes"
        assert f"dtype {chosen}" in printed, printed
    assert abs(losses[True]["val_loss"] - losses[False]["val_loss"]) < 0.05, losses
    assert sample.main(["--out", out, "--chars", "5", "--device", "cpu"]) == 0


def count_host_reads(monkeypatch):
    """Count the reads of a tensor's value back to the host (.item(), bool()) made by the script,
    not those of compressive.py's token check, which runs on CPU tensors only (where a read
    waits for nothing; test_compressive.py proves forward reads nothing on an accelerator)."""
    reads = []

    def counting(original):
        def counted(self):
            if not inspect.currentframe().f_back.f_code.co_filename.endswith("compressive.py"):
                reads.append(1)
            return original(self)

        return counted

    for name in ("item", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    return reads


def test_the_loop_reads_the_device_per_log_line_not_per_step(small_text, tmp_path, monkeypatch):
    reads = count_host_reads(monkeypatch)
    counts = {}
    for steps, log_every in ((2, 2), (4, 4), (4, 1)):
        reads.clear()
        assert (
            ts.main(
                [
                    "--data",
                    small_text,
                    "--out",
                    str(tmp_path / f"{steps}_{log_every}"),
                    "--steps",
                    str(steps),
                    "--eval-every",
                    "100",
                    "--log-every",
                    str(log_every),
                    *TINY_FLAGS,
                ]
            )
            == 0
        )
        counts[steps, log_every] = len(reads)
    assert counts[4, 4] == counts[2, 2]  # twice the steps, the same reads
    assert counts[4, 1] == counts[4, 4] + 3 * 3  # three more log lines, three reads each


def test_resuming_a_finished_run_says_nothing_is_left_to_train(trained, small_text, capsys):
    path = os.path.join(trained, "ckpt.pt")
    good = open(path, "rb").read()
    capsys.readouterr()
    assert (
        ts.main(["--data", small_text, "--out", trained, "--resume", "--steps", "2", *TINY_FLAGS])
        == 2
    )
    assert "has already trained 2 steps, and --steps is 2: nothing is left" in error_line(capsys)
    assert open(path, "rb").read() == good


def test_a_non_finite_loss_stops_the_run_at_the_next_log_line(trained, small_text, capsys):
    path = os.path.join(trained, "ckpt.pt")
    good = open(path, "rb").read()
    capsys.readouterr()
    # resumed at step 2: step 3 blows the weights up, step 4's loss is not finite; the log line
    # of step 5 sees it and stops, before any checkpoint could be written
    assert (
        ts.main(
            [
                "--data",
                small_text,
                "--out",
                trained,
                "--resume",
                "--steps",
                "12",
                "--log-every",
                "5",
                "--eval-every",
                "100",
                *TINY_FLAGS,
                "--lr",
                "1e30",
            ]
        )
        == 2
    )
    line = error_line(capsys)
    assert "step 5: the training loss is not finite (seen within steps 3-5)" in line
    assert f"the last good checkpoint is kept at {path} (step 2)" in line
    assert open(path, "rb").read() == good


@pytest.mark.slow  # trains or compiles: seconds
def test_compile_traces_one_graph_once_the_memories_are_full(small_text, tmp_path, monkeypatch):
    graphs, compile = [], torch.compile

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    monkeypatch.setattr(
        torch, "compile", lambda model, **kw: compile(model, backend=counting_backend, **kw)
    )
    torch.compiler.reset()
    out = str(tmp_path / "compiled")
    assert (
        ts.main(
            [
                "--data",
                small_text,
                "--out",
                out,
                "--steps",
                "12",
                "--eval-every",
                "12",
                *TINY_FLAGS,
                "--compile",
            ]
        )
        == 0
    )
    assert len(graphs) == 1
    assert math.isfinite(json.load(open(os.path.join(out, "metrics.json")))["val_loss"])


@pytest.mark.slow  # trains or compiles: seconds
def test_compile_that_fails_says_so_once_and_trains_on_eagerly(
    small_text, tmp_path, monkeypatch, capsys
):
    """A backend that cannot compile the model: Dynamo raises BackendCompilerFailed on the first
    compiled step (the memories full), as it does where Inductor fails on a torch or device. The
    run says so in one line and takes every step eagerly, as without --compile."""
    compile = torch.compile

    def failing_backend(graph_module, example_inputs):
        raise NotImplementedError("this backend compiles nothing")

    monkeypatch.setattr(
        torch, "compile", lambda model, **kw: compile(model, backend=failing_backend, **kw)
    )
    torch.compiler.reset()
    # the memories are full from step 3 on (n_m = n_s = 16, n_cm = 8 of c = 2)
    common = ["--data", small_text, "--steps", "6", "--eval-every", "6", *TINY_FLAGS]
    assert ts.main([*common, "--out", str(tmp_path / "compiled"), "--compile"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "--compile" in line]
    assert len(said) == 1 and "training goes on eagerly" in said[0], said
    assert "this backend compiles nothing" in said[0]
    assert ts.main([*common, "--out", str(tmp_path / "eager")]) == 0
    compiled, eager = (
        json.load(open(tmp_path / name / "metrics.json"))["val_loss"]
        for name in ("compiled", "eager")
    )
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=0)  # the same eager steps


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")),
]


@pytest.mark.slow  # Inductor compiles a model: tens of seconds
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_gradient_is_the_gradient_of_its_own_forward_with_dropout(device):
    """Compiled training diverged on a GPU where eager did not, though one compiled step at
    dropout 0 computes the eager step's gradient. With dropout on, the backward must use the masks
    the forward drew: the same seed before each forward draws the same masks, so the gradient's
    dot product with a random direction equals the central difference of the language-model loss
    along it (f_c's loss is left out: it detaches its inputs, so its gradient is not that of its
    value). float64, but the softmax runs in float32: hence the tolerance."""
    from compressive import CompressiveConfig, CompressiveTransformer

    torch.manual_seed(0)
    cfg = CompressiveConfig(
        vocab_size=65, d_model=32, n_heads=2, n_layers=1, d_ff=64, seq_len=16, mem_len=16,
        c_mem_len=8, compression_rate=4, dropout=0.3, pre_norm=True,
    )  # fmt: skip
    model = CompressiveTransformer(cfg).to(device).double().train()
    with torch.no_grad():
        memory = None
        for _ in range(3):  # full memories, as when --compile takes over
            _, memory, _ = model(torch.randint(0, 65, (2, 16), device=device), memory)
    x, y = (torch.randint(0, 65, (2, 16), device=device) for _ in range(2))
    compiled = torch.compile(model, fullgraph=True, dynamic=False)

    def loss_with_masks_of_seed_1():
        torch.manual_seed(1)
        logits, _, _ = compiled(x, memory)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    loss_with_masks_of_seed_1().backward()
    params = [p for p in model.parameters() if p.grad is not None]
    direction = [torch.randn_like(p) for p in params]
    along = sum((p.grad * d).sum() for p, d in zip(params, direction)).item()
    eps, ends = 1e-5, []
    with torch.no_grad():
        for sign in (1, -2, 1):  # to +eps, to -eps, back
            for p, d in zip(params, direction):
                p.add_(sign * eps * d)
            ends.append(loss_with_masks_of_seed_1().item())
    difference = (ends[0] - ends[1]) / (2 * eps)
    assert abs(along - difference) <= 2e-3 * abs(difference), (along, difference)


def test_device_auto_picks_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert checks.pick_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert checks.pick_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert checks.pick_device("auto", local_rank=1) == torch.device("cuda", 1)


# ---------------------------------------------------------------- hostile files, bad flags


# what reads a checkpoint: sampling, evaluating, and a training run resumed
MODES = {
    "sample": lambda out, text: sample.main(["--out", out, "--chars", "5", "--device", "cpu"]),
    "evaluate": lambda out, text: evaluate_command.main(
        ["--out", out, "--data", text, "--device", "cpu", "--dtype", "float32"]
    ),
    "resume": lambda out, text: ts.main(
        ["--out", out, "--data", text, "--resume", "--steps", "4", *TINY_FLAGS]
    ),
}


@pytest.mark.parametrize("mode", MODES)
def test_a_checkpoint_is_data_and_cannot_run_code(mode, trained, small_text, tmp_path, capsys):
    marker = tmp_path / "pwned"
    craft(os.path.join(trained, "ckpt.pt"), str(marker))
    capsys.readouterr()
    assert MODES[mode](trained, small_text) == 2
    assert not marker.exists()
    assert "is not a readable checkpoint" in error_line(capsys)


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("mode", MODES)
def test_a_damaged_checkpoint_gives_one_error_line(mode, how, trained, small_text, capsys):
    path = os.path.join(trained, "ckpt.pt")
    damaged = damage(path, how)
    capsys.readouterr()
    assert MODES[mode](trained, small_text) == 2
    assert "checkpoint" in error_line(capsys)
    assert open(path, "rb").read() == damaged  # nothing overwritten


def test_a_checkpoint_whose_weights_do_not_fit_its_config_gives_one_error_line(
    trained, small_text, capsys
):
    path = os.path.join(trained, "ckpt.pt")
    ckpt = torch.load(path, weights_only=True)
    ckpt["model"]["head.weight"] = ckpt["model"]["head.weight"][:, :3]
    resave(path, ckpt)
    capsys.readouterr()
    assert sample.main(["--out", trained, "--chars", "5", "--device", "cpu"]) == 2
    assert "do not fit" in error_line(capsys)


def test_data_that_is_not_utf8_text_gives_one_error_line(tmp_path, capsys):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Caf\xe9 au lait\n".encode("latin-1") * 200)
    assert ts.main(["--data", str(path), "--out", str(tmp_path / "run"), *TINY_FLAGS]) == 2
    assert "is not UTF-8 text" in error_line(capsys)


@pytest.mark.parametrize("command", ["train", "sample", "evaluate"])
def test_out_naming_a_file_gives_one_error_line(command, small_text, tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    main = {"train": ts.main, "sample": sample.main, "evaluate": evaluate_command.main}[command]
    data_flag = [] if command == "sample" else ["--data", small_text]
    assert main(["--out", str(path), "--device", "cpu", *data_flag]) == 2
    assert "exists and is not a folder" in error_line(capsys)
    assert path.read_text() == "keep me"


@pytest.mark.parametrize("flag", ["--lr", "--min-lr", "--weight-decay", "--grad-clip", "--dropout"])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_non_finite_hyper_parameters_are_rejected_up_front(
    flag, value, small_text, tmp_path, capsys
):
    out = tmp_path / "run"
    assert ts.main(["--data", small_text, "--out", str(out), *TINY_FLAGS, f"{flag}={value}"]) == 2
    assert f"{flag} must be a finite number" in error_line(capsys)
    assert not out.exists()


def test_a_diverging_run_stops_and_writes_nothing_when_it_has_no_checkpoint(
    small_text, tmp_path, capsys
):
    out = tmp_path / "run"
    # lr 1e30 is finite, so it passes the flag checks; one AdamW step then makes the weights huge
    assert (
        ts.main(
            ["--data", small_text, "--out", str(out), "--steps", "1", *TINY_FLAGS, "--lr", "1e30"]
        )
        == 2
    )
    line = error_line(capsys)
    assert "validation loss is not finite" in line and "no checkpoint was written" in line
    assert os.listdir(out) == []


@pytest.mark.parametrize("steps,what", [(3, "validation loss"), (4, "training loss")])
def test_a_diverging_run_keeps_the_last_good_checkpoint(steps, what, trained, small_text, capsys):
    path = os.path.join(trained, "ckpt.pt")
    good = open(path, "rb").read()
    metrics = open(os.path.join(trained, "metrics.json")).read()
    capsys.readouterr()
    # resumed at step 2: step 3 blows the weights up; --steps 3 validates right after it (the
    # training loss it saw was still finite), --steps 4 first sees a non-finite training loss
    assert (
        ts.main(
            [
                "--data",
                small_text,
                "--out",
                trained,
                "--resume",
                "--steps",
                str(steps),
                *TINY_FLAGS,
                "--lr",
                "1e30",
            ]
        )
        == 2
    )
    line = error_line(capsys)
    assert f"{what} is not finite" in line
    assert f"the last good checkpoint is kept at {path} (step 2)" in line
    assert open(path, "rb").read() == good
    assert open(os.path.join(trained, "metrics.json")).read() == metrics


def test_checkpoints_reach_the_disk_before_they_replace_the_old_one(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os,
        "fsync",
        lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[
            1
        ],
    )
    monkeypatch.setattr(
        os, "replace", lambda a, b: (events.append(("replace", b)), real_replace(a, b))[1]
    )
    path = str(tmp_path / "ckpt.pt")
    files.write_atomically(path, lambda f: torch.save({"x": torch.ones(3)}, f))
    assert events == [("fsync", path + ".tmp"), ("replace", path), ("fsync", str(tmp_path))]
    assert torch.load(path, weights_only=True)["x"].sum() == 3
    assert os.listdir(tmp_path) == ["ckpt.pt"]


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_weights(small_text, tmp_path):
    common = ["--data", small_text, "--steps", "20", "--eval-every", "5", *TINY_FLAGS]
    whole, killed = str(tmp_path / "whole"), str(tmp_path / "killed")
    threads = str(torch.get_num_threads())  # as in this process, so the arithmetic is the same
    run = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "train_shakespeare.py"), *common, "--out", killed],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS=threads),
    )
    ckpt = os.path.join(killed, "ckpt.pt")
    while not os.path.exists(ckpt) and run.poll() is None:
        time.sleep(0.005)
    run.kill()  # SIGKILL: no handler runs, whatever the process was doing
    run.wait()
    assert torch.load(ckpt, weights_only=True)["step"] < 20  # it died mid-run
    assert ts.main([*common, "--out", killed, "--resume"]) == 0
    assert ts.main([*common, "--out", whole]) == 0
    a = torch.load(os.path.join(whole, "ckpt.pt"), weights_only=True)
    b = torch.load(ckpt, weights_only=True)
    assert a["step"] == b["step"] == 20
    for name, tensor in a["model"].items():
        torch.testing.assert_close(b["model"][name], tensor, rtol=0, atol=0, msg=name)


def test_the_shipped_text_is_tiny_shakespeare_and_an_altered_copy_is_one_error_line(
    tmp_path, monkeypatch
):
    with open(SHAKESPEARE, "rb") as f:
        shipped = f.read()
    assert len(shipped) == 1_115_394
    assert hashlib.sha256(shipped).hexdigest() == data.DATA_SHA256
    assert data.load_text(None).startswith("First Citizen:\n")
    altered = tmp_path / "tinyshakespeare.txt"
    altered.write_bytes(shipped.replace(b"ROMEO", b"ROMEA", 1))
    monkeypatch.setattr(data, "DEFAULT_DATA", str(altered))
    with pytest.raises(checks.UserError, match="is not the Tiny Shakespeare this repository ships"):
        data.load_text(None)
    assert data.load_text(str(altered)).count("ROMEA") == 1  # as --data FILE it is any text


def test_a_checkpoint_trained_on_a_data_file_is_evaluated_on_that_file(
    small_text, tmp_path, monkeypatch, capsys
):
    out = str(tmp_path / "run")
    relative = os.path.relpath(small_text)  # the path as given, from the current folder
    assert ts.main(["--data", relative, "--out", out, "--steps", "2", *TINY_FLAGS]) == 0
    monkeypatch.chdir(tmp_path)  # the checkpoint keeps where the file is, not how it was named
    monkeypatch.setattr(data, "DEFAULT_DATA", str(tmp_path / "absent.txt"))  # no default text
    capsys.readouterr()
    assert evaluate_command.main(["--out", out, "--device", "cpu", "--dtype", "float32"]) == 0
    assert f"validation text: {small_text}" in capsys.readouterr().out


def test_a_checkpoint_of_another_version_is_refused_in_one_line(trained, small_text, capsys):
    """No shim reads the layouts of earlier commits: their checkpoints are refused in one line that
    says which commit wrote them and what to do, in every command that reads one."""
    path = os.path.join(trained, "ckpt.pt")
    ckpt = torch.load(path, weights_only=True)
    commit = ckpt["made_with"]["commit"]
    for format, by, then in (
        (1, f"(commit {commit})", f"train again, or check out {commit.split('+')[0]} to use it"),
        (None, "(an earlier commit, which it does not name)", "cannot read; train again"),
    ):
        older = {**ckpt, "format": format}
        if format is None:
            del older["format"], older["made_with"]
        resave(path, older)
        capsys.readouterr()
        for mode in MODES:
            assert MODES[mode](trained, small_text) == 2, mode
            line = error_line(capsys)
            assert "written by another version of this script" in line and by in line, line
            assert line.endswith(then), line


def test_the_projects_own_f_c_trains_resumes_and_evaluates(small_text, tmp_path, capsys):
    """--compression overlap_max_pool: the checkpoint's config names this project's own f_c
    (beyond_the_paper/overlap_pool.py), and its model is built again with it."""
    out = str(tmp_path / "run")
    common = ["--data", small_text, "--out", out, *TINY_FLAGS, "--compression", "overlap_max_pool"]
    assert ts.main([*common, "--steps", "2"]) == 0
    path = os.path.join(out, "ckpt.pt")
    assert torch.load(path, weights_only=True)["config"]["compression"] == "overlap_max_pool"
    model, _ = checkpoint.load_model(out, torch.device("cpu"))
    assert type(model.layers[0].compress).__module__ == "beyond_the_paper.overlap_pool"
    flags = ["--out", out, "--data", small_text, "--device", "cpu", "--dtype", "float32"]
    assert evaluate_command.main(flags) == 0
    assert ts.main([*common, "--steps", "3", "--resume"]) == 0
    assert torch.load(path, weights_only=True)["step"] == 3
    capsys.readouterr()
    assert ts.main([*common[:-2], "--steps", "4", "--resume"]) == 2
    line = error_line(capsys)
    assert "flags differ from the checkpoint's" in line
    assert "--compression (conv here, overlap_max" in line
    # the memory continues streams cut alike: another --batch-size would cut them otherwise
    assert ts.main([*common, "--steps", "4", "--resume", "--batch-size", "2"]) == 2
    assert "--batch-size (2 here, 4 in the checkpoint)" in error_line(capsys)


@pytest.mark.parametrize(
    "kind, flags, refusal",
    [
        ("compressive", [], None),
        ("overlap_max_pool", ["--compression", "overlap_max_pool"], "overlap_pool.py"),
        ("feedback", ["--model", "feedback"], "model 'feedback'"),
    ],
)
def test_a_checkpoint_rebuilt_by_compressive_py_alone_is_its_model_or_refused(
    small_text, tmp_path, kind, flags, refusal
):
    """The script's checkpoint read as compressive.py's note reads a saved config: the model that
    was trained, or one line that says what else builds it (and what it says, done, is that
    model): the same outputs as the model the commands load."""
    out = str(tmp_path / kind)
    assert ts.main(["--data", small_text, "--out", out, "--steps", "2", *TINY_FLAGS, *flags]) == 0
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    loaded, _ = checkpoint.load_model(out, torch.device("cpu"))
    if refusal is None:
        rebuilt = CompressiveTransformer(CompressiveConfig(**ckpt["config"]))
    else:
        with pytest.raises(ValueError, match=refusal) as refused:
            CompressiveTransformer(CompressiveConfig(**ckpt["config"]))
        assert "\n" not in str(refused.value) and "model_from_config" in str(refused.value)
        from beyond_the_paper import model_from_config

        rebuilt = model_from_config(ckpt["config"])
    rebuilt.load_state_dict(ckpt["model"])
    x = torch.randint(0, len(ckpt["vocab"]), (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(x)[0], loaded(x)[0])


# ---------------------------------------------------------------- plots (optional)


@pytest.mark.slow  # trains or compiles: seconds
def test_the_loss_curve_is_a_valid_png(fresh_pyplot, small_text, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    out = str(tmp_path / "plots")
    common = ["--data", small_text, "--out", out, "--steps", "4", "--eval-every", "4"]
    assert ts.main([*common, *TINY_FLAGS]) == 0
    path = os.path.join(out, "loss.png")
    printed = capsys.readouterr().out
    assert f"wrote {path}" in printed and "matplotlib is not installed" not in printed
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    image = imread(path)  # decodes the whole file
    assert image.ndim == 3 and min(image.shape[:2]) >= 200 and image.std() > 0.01


def test_without_matplotlib_no_plot_is_drawn_and_that_is_said_once(
    fresh_pyplot, small_text, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" raises ImportError
    out = str(tmp_path / "plots")
    common = ["--data", small_text, "--out", out, "--steps", "4", "--eval-every", "2"]
    assert ts.main([*common, *TINY_FLAGS]) == 0
    printed = capsys.readouterr().out
    assert printed.count("matplotlib is not installed, so no plots are drawn") == 1
    assert "wrote" not in printed and "loss.png" not in os.listdir(out)


def test_the_recall_flags_are_the_recall_tasks_own(small_text, tmp_path, capsys):
    """The script's flags are the training's own; a study's flags are its command's."""
    with pytest.raises(SystemExit) as exited:
        ts.main(["--data", small_text, "--out", str(tmp_path), "--max-distance", "50"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --max-distance 50" in capsys.readouterr().err


# ---------------------------------------------------------------- torchrun, --bench


@pytest.mark.slow
def test_torchrun_two_processes_step_like_one_process_on_the_same_streams(small_text, tmp_path):
    """2 ranks x 4 streams against 1 process x 8 streams: each rank's memory is its rows of the
    single run's, the gradients agree (AdamW's first moment, a weighted sum of the gradients of
    every step, f_c's included), and DDP has nothing to warn about."""
    ddp, single = str(tmp_path / "ddp"), str(tmp_path / "single")
    common = ["--data", small_text, "--steps", "4", "--eval-every", "4", *TINY_FLAGS]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        os.path.join(ROOT, "train_shakespeare.py"),
        *common,
        "--out",
        ddp,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("done: 4 steps") == 1 and "2 process(es)" in result.stdout
    assert "find_unused_parameters" not in result.stderr and "Traceback" not in result.stderr
    assert json.load(open(os.path.join(ddp, "metrics.json")))["tokens_seen"] == 4 * 2 * 4 * 16
    assert ts.main([*common, "--batch-size", "8", "--out", single]) == 0
    a = torch.load(os.path.join(ddp, "ckpt.pt"), weights_only=True)
    b = torch.load(os.path.join(single, "ckpt.pt"), weights_only=True)
    assert len(a["memory"]) == 2 and len(b["memory"]) == 1
    for part in (0, 1):  # mem, c_mem of every layer
        for rows, whole in zip(
            zip(a["memory"][0][part], a["memory"][1][part]), b["memory"][0][part]
        ):
            torch.testing.assert_close(torch.cat(rows), whole, rtol=1e-4, atol=1e-5)
    # AdamW's state follows make_optimizer's order: matrices (decayed) first, then the rest
    names = sorted(b["model"], key=lambda name: b["model"][name].dim() < 2)
    for i, (sa, sb) in enumerate(
        zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values())
    ):
        scale = sb["exp_avg"].abs().max().item()
        assert scale > 0, names[i]  # every parameter was trained, f_c's by its own loss
        torch.testing.assert_close(
            sa["exp_avg"], sb["exp_avg"], rtol=1e-3, atol=1e-4 * scale, msg=names[i]
        )


@pytest.mark.slow  # trains: seconds
def test_bench_prints_its_summary_as_the_last_line(capsys):
    assert bench.main(["--bench-steps", "2", *TINY_FLAGS]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.fullmatch(
        r"bench tokens_per_s=([\d.]+) ms_per_step=([\d.]+) peak_mem_mb=([\d.]+) "
        r"mfu=([\d.]+)",
        last,
    )
    assert match, last
    tokens_per_s, ms_per_step = float(match[1]), float(match[2])
    # the same rate twice, each rounded as printed: ms_per_step to 0.01 ms, tokens_per_s to 0.1,
    # which on a slow (loaded) machine moves 64000 / tokens_per_s by up to 64000 * 0.05 / t^2
    from_rate = 4 * 16 / tokens_per_s * 1000
    assert abs(ms_per_step - from_rate) <= 0.005 + from_rate * 0.05 / tokens_per_s + 1e-6
    assert float(match[3]) > 0 and 0 < float(match[4]) < 10


def test_bench_profile_splits_the_steps_time_into_forward_backward_and_optimizer(capsys):
    assert bench.main(["--profile", "--bench-steps", "1", *TINY_FLAGS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "dtype float32 (as --dtype asked)"
    assert lines[1].startswith("profile of 1 training step(s)")
    phases = {}
    for line in lines[1:]:
        match = re.fullmatch(r"(\w+) +([\d.]+) ms/step +([\d.]+)%", line)
        if match:
            phases[match[1]] = float(match[3])
    assert {"forward", "backward", "optimizer"} <= set(phases), phases
    assert set(phases) <= {"forward", "backward", "optimizer", "rest"}, phases
    assert abs(sum(phases.values()) - 100) < 0.5, phases  # every operator in one phase
    # each phase's operators follow it: a matmul among the forward's and the backward's, the
    # fused AdamW kernel among the optimizer's
    for phase, operator in [("forward", "aten::mm"), ("backward", "aten::mm")]:
        at = next(i for i, line in enumerate(lines) if line.startswith(phase))
        assert any(line.split()[0] == operator for line in lines[at + 1 : at + 9]), lines
    at = next(i for i, line in enumerate(lines) if line.startswith("optimizer"))
    assert any(line.split()[0] == "aten::_fused_adamw_" for line in lines[at + 1 : at + 9])
    assert bench.main(["--profile", "--compile", *TINY_FLAGS]) == 2
    assert error_line(capsys) == "error: --profile profiles eager steps: drop --compile"


def test_a_checkpoint_says_how_it_was_made(trained):
    """For the captions of the figures drawn from a checkpoint: its command and the flags that
    differ from the defaults, its seed and step, the torch and threads its numbers depend on."""
    ckpt = torch.load(os.path.join(trained, "ckpt.pt"), weights_only=True)
    threads = torch.get_num_threads()
    assert ckpt["made_with"] == {
        "torch": str(torch.__version__),
        "threads": threads,
        "commit": files.repository_commit(),
    }
    defaults = vars(ts.parse_args([]))
    said = checkpoint.training_command(ckpt, defaults)
    assert said.startswith("python train_shakespeare.py --d-model 32 --n-layers 2")
    assert "--steps 2" in said and "--out" not in said and "--seed" not in said
    assert said.endswith(f"(seed 1337, step 2; torch {torch.__version__}, {threads} thread(s))")
    # a study's flags, the script's defaults: its own flags are said, its command named
    study = {**ckpt, "args": {**ckpt["args"], "task": "recall", "live_facts": 2}}
    said = checkpoint.training_command(study, defaults)
    assert said.startswith("python -m research.recall --d-model 32") and "--live-facts 2" in said


# ---------------------------------------------------------------- no run lost


def test_a_run_into_a_folder_holding_a_checkpoint_refuses_unless_told(trained, small_text, capsys):
    path = os.path.join(trained, "ckpt.pt")
    good = open(path, "rb").read()
    common = ["--data", small_text, "--out", trained, "--steps", "3", *TINY_FLAGS]
    capsys.readouterr()
    assert ts.main(common) == 2
    line = error_line(capsys)
    assert f"{trained} holds a checkpoint (ckpt.pt)" in line
    assert "--resume" in line and "another --out" in line and "--overwrite" in line
    assert open(path, "rb").read() == good
    assert ts.main([*common, "--overwrite"]) == 0  # trained again from step 0
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["step"] == 3 and [h["step"] for h in ckpt["history"]] == [3]


def zip_entries(path: str) -> dict:
    """{name: (offset, size)} of the files inside a torch.save archive (stored uncompressed)."""
    import zipfile

    entries = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            f.seek(info.header_offset + 26)  # the local header's name and extra lengths
            name_len, extra_len = (
                int.from_bytes(f.read(2), "little"),
                int.from_bytes(f.read(2), "little"),
            )
            start = info.header_offset + 30 + name_len + extra_len
            entries[info.filename.split("/", 1)[1]] = (start, info.file_size)
    return entries


def flip_bits(path: str, where: str) -> None:
    """Invert up to 4 KiB in the middle of the largest tensor of the checkpoint's weights, or of
    AdamW's state (torch.save writes the weights' storages first, numbered in order), or change
    its record (a value of its metadata) as a careless edit would, its digest left as it was."""
    if where == "metadata":
        ckpt = torch.load(path, weights_only=True)
        ckpt["history"][-1]["val_loss"] -= 0.01
        torch.save(ckpt, path)
        return
    n_weights = len(torch.load(path, weights_only=True)["model"])
    data = {int(k.split("/")[1]): v for k, v in zip_entries(path).items() if k.startswith("data/")}
    keys = range(n_weights) if where == "weights" else range(n_weights, max(data) + 1)
    start, size = max((data[k] for k in keys), key=lambda entry: entry[1])
    n = min(4096, size // 2)
    with open(path, "r+b") as f:
        f.seek(start + size // 4)
        flipped = bytes(255 - b for b in f.read(n))
        f.seek(start + size // 4)
        f.write(flipped)


@pytest.mark.parametrize("where", ["weights", "optimizer", "metadata"])
@pytest.mark.parametrize("mode", [*MODES, "explorer"])
def test_a_checkpoint_damaged_since_it_was_saved_is_refused(
    where, mode, trained, small_text, capsys
):
    """A flipped bit loads as if whole (torch reads no checksum of its own): the digest the
    checkpoint was saved with catches it, in every command that reads one (the explorer loads
    through checkpoint.load_model)."""
    path = os.path.join(trained, "ckpt.pt")
    flip_bits(path, where)
    damaged = open(path, "rb").read()
    capsys.readouterr()
    if mode == "explorer":
        with pytest.raises(checks.UserError) as refused:
            checkpoint.load_model(trained, torch.device("cpu"))
        line = f"error: {refused.value}"
    else:
        assert MODES[mode](trained, small_text) == 2
        line = error_line(capsys)
    assert f"{path} is a damaged checkpoint: its contents do not match the sha256 digest" in line
    assert "restore a copy, or train again" in line
    assert open(path, "rb").read() == damaged  # nothing overwritten


@pytest.mark.parametrize(
    "forged", ["no vocab", "a step in words", "a list for its model", "a vocab too short"]
)
@pytest.mark.parametrize("mode", MODES)
def test_a_checkpoint_written_by_hand_with_its_digest_is_one_line(
    forged, mode, trained, small_text, capsys
):
    """The digest is no signature: a file whose digest was computed again after an edit passes
    it, and a field it lacks, or of another kind, is said in one line, not in a traceback."""
    path = os.path.join(trained, "ckpt.pt")
    ckpt = torch.load(path, weights_only=True)
    del ckpt["sha256"]
    if forged == "no vocab":
        del ckpt["vocab"]
    elif forged == "a step in words":
        ckpt["step"] = "three"
    elif forged == "a vocab too short":
        ckpt["vocab"] = ckpt["vocab"][:10]
    else:
        ckpt["model"] = list(ckpt["model"].values())
    torch.save({**ckpt, "sha256": checkpoint.digest(ckpt)}, path)
    capsys.readouterr()
    assert MODES[mode](trained, small_text) == 2
    field = {"a step in words": "step", "a list for its model": "model"}.get(forged, "vocab")
    assert f"{path} is not a checkpoint that this script wrote (no {field} of the" in (
        error_line(capsys)
    )


def test_the_digest_covers_every_value_and_its_type():
    state = {"model": {"w": torch.arange(6.0).view(2, 3)}, "step": 3, "args": {"lr": 0.1}}
    sealed = checkpoint.digest(state)
    assert sealed == checkpoint.digest({**state}) and len(sealed) == 64
    changed = [
        {**state, "step": 4},
        {**state, "step": 3.0},
        {**state, "args": {"lr": 0.1000001}},
        {**state, "model": {"w": torch.arange(6.0).view(3, 2)}},
        {**state, "model": {"w": torch.arange(6.0).view(2, 3).double()}},
        {**state, "model": {"w": torch.arange(6.0).view(2, 3).flip(0)}},
        {"step": 3, **state},
    ]
    assert all(checkpoint.digest(other) != sealed for other in changed)
    w = state["model"]["w"]
    assert checkpoint.digest({**state, "model": {"w": w.t().contiguous().t()}}) == sealed


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_run_saves_a_checkpoint_and_resumes_to_the_same_weights(
    signum, small_text, tmp_path, monkeypatch, capsys
):
    """Ctrl-C (SIGINT) or SIGTERM during step 4: the run ends that step, saves, says how to go on
    and exits 130; --resume then ends where an uninterrupted run ends, bit for bit."""
    common = ["--data", small_text, "--steps", "6", "--eval-every", "100", *TINY_FLAGS]
    whole, stopped = str(tmp_path / "whole"), str(tmp_path / "stopped")
    assert ts.main([*common, "--out", whole]) == 0
    lr_at, sent = ts.lr_at, []

    def signalled_at_step_4(step, args):
        if step == 3 and not sent:  # once: a second signal acts at once
            sent.append(os.kill(os.getpid(), signum))
        return lr_at(step, args)

    monkeypatch.setattr(ts, "lr_at", signalled_at_step_4)
    capsys.readouterr()
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert ts.main([*common, "--out", stopped]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    ckpt = os.path.join(stopped, "ckpt.pt")
    name = signal.Signals(signum).name
    assert err == [f"{name}: saved step 4 in {ckpt}; continue with --resume"]
    assert torch.load(ckpt, weights_only=True)["step"] == 4
    # the handlers given back (SIGINT's is ignored where a shell started the tests in background)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    monkeypatch.setattr(ts, "lr_at", lr_at)
    assert ts.main([*common, "--out", stopped, "--resume"]) == 0
    a = torch.load(os.path.join(whole, "ckpt.pt"), weights_only=True)
    b = torch.load(ckpt, weights_only=True)
    for name, tensor in a["model"].items():
        torch.testing.assert_close(b["model"][name], tensor, rtol=0, atol=0, msg=name)


def test_a_resume_on_another_number_of_processes_says_what_it_drops(trained, small_text, capsys):
    path = os.path.join(trained, "ckpt.pt")
    ckpt = torch.load(path, weights_only=True)
    ckpt["memory"], ckpt["rng"] = ckpt["memory"] * 2, ckpt["rng"] * 2  # as 2 processes save it
    resave(path, ckpt)
    capsys.readouterr()
    flags = ["--data", small_text, "--out", trained, "--resume", "--steps", "3", *TINY_FLAGS]
    assert ts.main(flags) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert said == [
        f"note: {path} was saved by 2 process(es) and resumes in 1: the weights, the "
        "optimizer's state and the step carry on, each process's memory and random state do "
        "not (the memory starts empty, the random state from --seed)"
    ]


# ---------------------------------------------------------------- every message names the fix


def test_each_message_says_what_is_wrong_and_what_to_do(trained, small_text, tmp_path, capsys):
    run = ["--out", str(tmp_path / "run"), *TINY_FLAGS]
    assert ts.main(["--data", str(tmp_path), *run]) == 2
    assert f"--data {tmp_path} is a folder; pass a text file" in error_line(capsys)
    (tmp_path / "short.txt").write_text("to be")
    assert ts.main(["--data", str(tmp_path / "short.txt"), *run]) == 2
    assert "too short (5 characters; at least 1000 are needed)" in error_line(capsys)
    path = os.path.join(trained, "ckpt.pt")
    for written, says in ((b"some notes\n", "it is a text file"), (b"", "it is empty")):
        open(path, "wb").write(written)
        assert sample.main(["--out", trained, "--device", "cpu"]) == 2
        line = error_line(capsys)
        assert f"{path} is not a checkpoint ({says}); pass the --out of a training run" in line
    # the model flags that differ from the checkpoint's, each named
    out = str(tmp_path / "resumed")
    assert ts.main(["--data", small_text, "--out", out, "--steps", "2", *TINY_FLAGS]) == 0
    flags = ["--data", small_text, "--out", out, "--resume", *TINY_FLAGS, "--n-heads", "4"]
    assert ts.main([*flags, "--no-post-norm", "--model", "xl"]) == 2
    line = error_line(capsys)
    assert "--n-heads (4 here, 2 in the checkpoint)" in line
    assert "--post-norm (pre_norm) (True here, False in the checkpoint)" in line
    assert "--c-mem-len (0 here, 8 in the checkpoint)" in line
    assert "--model (xl here, compressive in the checkpoint)" in line
    assert "pass the checkpoint's, or train a new model into another --out" in line


def test_a_problem_is_said_by_the_first_process_alone(monkeypatch, capsys):
    """Under torchrun every process meets the same problem; one line says it, from rank 0."""

    def fails():
        raise checks.UserError("a problem")

    for rank, said in (("0", ["error: a problem"]), ("1", [])):
        monkeypatch.setenv("RANK", rank)
        assert checks.exit_status(fails) == 2
        assert capsys.readouterr().err.splitlines() == said


def test_every_flag_of_the_commands_says_what_it_does():
    for parser, usage in (
        (ts.training_flags(prog="python train_shakespeare.py"), "python train_shakespeare.py"),
        (bench_parser(), "python bench.py"),
        (sample_parser(), "python sample.py"),
        (evaluate_parser(), "python evaluate.py"),
    ):
        assert parser.format_usage().startswith(f"usage: {usage} ")
        silent = [a.dest for a in parser._actions if not a.help and a.dest != "help"]
        assert silent == [], (usage, silent)


def parser_of(parse_args):
    """The parser a command's parse_args builds, caught as it parses --help."""
    import argparse

    caught = []
    original = argparse.ArgumentParser.parse_args

    def catch(self, *args, **kwargs):
        caught.append(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = catch
    try:
        with pytest.raises(SystemExit):
            parse_args([])
    finally:
        argparse.ArgumentParser.parse_args = original
    return caught[0]


bench_parser = lambda: parser_of(bench.parse_args)
sample_parser = lambda: parser_of(sample.parse_args)
evaluate_parser = lambda: parser_of(evaluate_command.parse_args)


def test_the_feedback_transformer_trains_samples_and_evaluates(small_text, tmp_path):
    out = str(tmp_path / "feedback")
    flags = ["--data", small_text, "--out", out, "--steps", "2", *TINY_FLAGS, "--model", "feedback"]
    assert ts.main(flags) == 0
    model, _ = checkpoint.load_model(out, torch.device("cpu"))
    assert type(model).__name__ == "FeedbackTransformer"
    assert sample.main(["--out", out, "--chars", "5", "--device", "cpu"]) == 0
    assert evaluate_command.main(["--out", out, "--device", "cpu", "--dtype", "float32"]) == 0


def test_the_script_reads_top_to_bottom_and_imports_four_modules_of_the_repository():
    """Each function of train_shakespeare.py stands above its first use, as in nanoGPT's train.py;
    besides compressive.py it imports four of the repository's modules."""
    tree = ast.parse(open(ts.__file__, encoding="utf-8").read())
    defined = {
        node.name: node.lineno
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    }
    used_above = [
        (node.id, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.lineno < defined.get(node.id, 0)
    ]
    assert used_above == []
    modules = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] != "compressive":
            folder = os.path.join(ROOT, *node.module.split("."))
            for alias in node.names:  # a module imported from its package, or names from one
                is_module = os.path.exists(os.path.join(folder, alias.name + ".py"))
                modules.add(f"{node.module}.{alias.name}" if is_module else node.module)
    ours = {m for m in modules if os.path.exists(os.path.join(ROOT, m.split(".")[0]))}
    assert ours == {"training.checkpoint", "training.checks", "training.data", "training.evaluate"}


def test_a_training_step_runs_the_scripts_code_and_compressive_py_alone(small_text):
    """What a step of the loop calls, traced: of the repository, train_shakespeare.py's step and
    the model in compressive.py, its memories filling, f_c compressing and learning."""
    args = ts.parse_args(["--data", small_text, *TINY_FLAGS])
    text = data.load_data(args)
    model = checkpoint.make_model(dataclasses.asdict(ts.model_config(args, len(text.vocab))))
    step = ts.make_train_step(model, ts.make_optimizer(model, args), args, torch.device("cpu"))
    batch = ts.make_streams(text.train, args.batch_size)[:, : args.seq_len + 1]
    called, memory = set(), None

    def tracer(frame, event, arg):
        if event == "call":  # a frame of Python code: its file (or <string>, <frozen ...>)
            called.add(frame.f_code.co_filename)

    for _ in range(4):  # the memories fill, then overflow into c_mem
        sys.setprofile(tracer)
        try:
            _, recon_loss, memory = step(batch[:, :-1], batch[:, 1:], memory)
        finally:
            sys.setprofile(None)
    assert recon_loss.item() > 0 and memory.c_mem[0].size(1) > 0
    ours = {
        os.path.relpath(path, ROOT)
        for path in called
        if os.path.isabs(path) and path.startswith(ROOT + os.sep) and "site-packages" not in path
    }
    assert ours == {"train_shakespeare.py", "compressive.py"}


@pytest.mark.slow  # a fresh Python that imports torch
def test_importing_the_script_loads_only_what_it_uses():
    """Not the agent's memory (beyond_the_paper/agent.py), which only the Feedback Transformer
    imports, where --model feedback builds one."""
    code = "import sys, train_shakespeare; print(sorted(sys.modules))"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    loaded = ast.literal_eval(found.stdout)  # the list of module names the line above printed
    ours = sorted(m for m in loaded if m.split(".")[0] in ("training", "beyond_the_paper"))
    assert ours == [
        "beyond_the_paper",  # model_from_config, which imports each model where it is built
        "training",
        "training.checkpoint",
        "training.checks",
        "training.data",
        "training.evaluate",
        "training.files",
        "training.plots",
    ]
