"""The specification of train_shakespeare.py and its helpers in training/, as tests: flags, data,
checkpoints, the recall task, --analyze, --bench, plots and torchrun. The model's own
specification is test_compressive.py at the top of the repository. Run: pytest -q"""

import hashlib
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

import train_shakespeare as ts
from compressive import CompressiveTransformer, FeedbackTransformer, Memory
from test_compressive import make, tiny, tokens  # the model spec's small models
from lesson import memory_picture
from research import attention as analysis
from research import recall
from training import data, files, plots

torch.set_num_threads(min(2, torch.get_num_threads()))
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
SHAKESPEARE = data.DEFAULT_DATA  # the text the repository ships


@pytest.fixture
def small_text(tmp_path):
    """The first 6000 characters of the shipped Tiny Shakespeare, as a --data file."""
    with open(SHAKESPEARE, encoding="utf-8") as f:
        text = f.read()[:6000]
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture(autouse=True)
def plots_only_where_tested(request, monkeypatch):
    """With matplotlib installed every run would draw its loss curve, a few tenths of a second
    each; the runs here draw none (as without matplotlib, but silently), except in the tests of
    the plots themselves, which ask for fresh_pyplot. The picture's drawing is tested apart."""
    if "fresh_pyplot" not in request.fixturenames:
        monkeypatch.setattr(plots, "pyplot", lambda: None)


TINY_FLAGS = [
    "--d-model",
    "32",
    "--n-layers",
    "2",
    "--n-heads",
    "2",
    "--d-ff",
    "64",
    "--seq-len",
    "16",
    "--mem-len",
    "16",
    "--c-mem-len",
    "8",
    "--compression-rate",
    "2",
    "--batch-size",
    "4",
    "--lr",
    "3e-3",
    "--warmup",
    "5",
    "--device",
    "cpu",
]


def test_streams_stay_contiguous_across_steps():
    data = torch.arange(1001)
    streams = ts.make_streams(data, 4)
    assert streams.shape == (4, 251)
    assert streams[1, 0] == streams[0, -1]  # strand b ends where strand b+1 begins
    x0, y0, wrapped0 = ts.segment_at(streams, 0, 16)
    x1, y1, wrapped1 = ts.segment_at(streams, 1, 16)
    assert wrapped0 and not wrapped1
    assert (x1[:, 0] == x0[:, -1] + 1).all() and (y0 == x0 + 1).all()  # row b continues row b
    n_segments = 250 // 16
    assert ts.segment_at(streams, n_segments, 16)[2]  # wraps to the start after the last segment


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


def test_sample_and_eval_only_use_the_checkpoint_and_eval_only_writes_the_loss_by_copy_distance(
    small_text, tmp_path, capsys
):
    out = str(tmp_path / "run")
    assert ts.main(["--data", small_text, "--out", out, "--steps", "5", *TINY_FLAGS]) == 0
    capsys.readouterr()
    assert (
        ts.main(
            ["--out", out, "--sample", "40", "--prompt", "First", "--top-k", "5", "--device", "cpu"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert printed.startswith("First") and len(printed.rstrip("\n")) >= 45 - 1
    assert ts.main(["--out", out, "--eval-only", "--device", "cpu"]) == 0  # no --data: its own text
    printed = capsys.readouterr().out
    assert f"validation text: {small_text}" in printed and "val loss" in printed
    # the loss by copy distance, at the run's end and from --eval-only, and its ablation
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    rows = metrics["loss_by_copy_distance"]
    assert list(rows) == ["segment", "1-64", "65-96", "97-192", "193-1000", ">1000", "never"]
    assert abs(sum(r["share"] for r in rows.values()) - 1) < 1e-9
    assert (
        abs(
            sum(r["loss"] * r["share"] for r in rows.values() if r["chars"])
            - metrics["eval_only"]["val_loss"]
        )
        < 1e-4
    )  # the buckets part the validation text
    end_of_run = metrics["history"][-1]["loss_by_copy_distance"]  # 4 streams there, 12 here
    assert sum(r["chars"] for r in end_of_run.values()) == sum(r["chars"] for r in rows.values())
    assert (
        ts.main(
            [
                "--out",
                out,
                "--eval-only",
                "--data",
                small_text,
                "--device",
                "cpu",
                "--eval-c-mem-len",
                "0",
            ]
        )
        == 0
    )
    assert "memory cut to n_m=16 n_cm=0" in capsys.readouterr().out
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["loss_by_copy_distance"] == rows  # the full-memory figures are kept
    cut = metrics["ablations"]["n_m=16 n_cm=0"]
    assert cut["loss_by_copy_distance"]["segment"]["chars"] == rows["segment"]["chars"]
    assert cut["val_loss"] != metrics["eval_only"]["val_loss"]
    for bad, says in (
        (["--eval-mem-len", "17"], "trained with 16"),
        (["--eval-mem-len", "1"], "at least c = 2"),
        (["--eval-only", "--task", "code"], "trained on --task shakespeare"),
    ):
        args = bad if "--eval-only" in bad else ["--eval-only", "--data", small_text, *bad]
        assert ts.main(["--out", out, "--device", "cpu", *args]) == 2
        assert says in error_line(capsys)
    assert ts.main(["--out", out, "--eval-mem-len", "8"]) == 2
    assert "for --eval-only" in error_line(capsys)
    assert ts.main(["--out", out, "--analyze", "--device", "cpu", "--batch-size", "2"]) == 0
    report = capsys.readouterr().out
    assert f"validation text: {small_text}" in report
    assert "c_mem 1/4" in report and "segment 4/4" in report and "reconstruction loss" in report
    assert ts.main(["--out", out, "--eval-only", "--task", "recall", "--device", "cpu"]) == 2
    assert "trained on --task shakespeare" in error_line(capsys)  # before any text is read


def error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--seq-len", "0"], "--seq-len must be positive"),
        (["--mem-len", "-3"], "--mem-len must be >= 0"),
        (["--d-model", "30", "--n-heads", "4"], "divisible"),
        (["--data", "/nonexistent/file.txt"], "data file not found"),
        (["--sample", "10", "--out", "/nonexistent/dir"], "no checkpoint"),
        (["--batch-size", "100000"], "cannot feed"),
        (["--model", "feedback", "--mem-len", "0"], "needs mem_len >= 1"),
        (["--log-every", "0"], "--log-every must be positive"),
        (
            ["--task", "recall", "--curriculum-hold", "1.5"],
            "--curriculum-hold must be a fraction in [0, 1]",
        ),
        (
            ["--task", "recall", "--curriculum-hold", "0.5", "--seq-len", "6"],
            "no fact fits inside a segment",
        ),
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
    if "--data" not in flags and "recall" not in flags:  # never reach for the network
        flags = [*flags, "--data", small_text]
    if "--out" not in flags:
        flags = [*flags, "--out", str(tmp_path / "run")]
    assert ts.main(flags) == 2
    assert message in error_line(capsys)


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
    assert "lower --d-model" in str(ts.out_of_memory(cuda_error)) and ts.is_out_of_memory(
        cuda_error
    )
    assert not ts.is_out_of_memory(RuntimeError("shape mismatch"))


def test_the_command_line_reports_bad_input_without_a_traceback(tmp_path):
    script = os.path.join(HERE, "train_shakespeare.py")
    # one process (each costs a Python and torch start-up); argparse's own errors exit 2 alike
    result = subprocess.run(
        [sys.executable, script, "--data", str(tmp_path / "missing.txt")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "data file not found" in result.stderr
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr


# ---------------------------------------------------------------- device, precision, compile ------


def test_half_precision_training_stays_finite_and_close_to_float32(small_text, tmp_path):
    """bfloat16 keeps 8 bits of mantissa, float16 11 (with its gradient scaler): over 20 steps
    the rounding moves the validation loss by a few thousandths, far less than training lowers it."""
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


def count_host_reads(monkeypatch):
    """Count the reads of a tensor's value back to the host (.item(), bool()) made by the script,
    not those of compressive.py's token check, which runs on CPU tensors only (where a read
    waits for nothing; test_compressive.py proves forward reads nothing on an accelerator)."""
    reads = []
    for name in ("item", "__bool__"):

        def counted(self, _original=getattr(torch.Tensor, name)):
            if not inspect.currentframe().f_back.f_code.co_filename.endswith("compressive.py"):
                reads.append(1)
            return _original(self)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def test_the_loop_reads_the_device_per_log_line_not_per_step(small_text, tmp_path, monkeypatch):
    reads = count_host_reads(monkeypatch)
    counts = {}
    for steps, log_every in ((4, 4), (8, 8), (8, 2)):
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
    assert counts[8, 8] == counts[4, 4]  # twice the steps, the same reads
    assert counts[8, 2] == counts[8, 8] + 3 * 3  # three more log lines, three reads each


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


def test_device_auto_picks_cuda_then_mps_then_cpu(monkeypatch):
    from training import device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device, "mps_available", lambda: False)
    assert device.pick_device("auto") == torch.device("cpu")
    monkeypatch.setattr(device, "mps_available", lambda: True)
    assert device.pick_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device.pick_device("auto", local_rank=1) == torch.device("cuda", 1)


# ---------------------------------------------------------------- hostile files, bad flags ---------


@pytest.fixture(scope="session")
def trained_once(tmp_path_factory):
    """A real checkpoint after 2 steps on small_text's characters, trained once per test run."""
    folder = tmp_path_factory.mktemp("trained_once")
    with open(SHAKESPEARE, encoding="utf-8") as f:
        (folder / "text.txt").write_text(f.read()[:6000], encoding="utf-8")
    out = str(folder / "trained")
    assert (
        ts.main(
            [
                "--data",
                str(folder / "text.txt"),
                "--out",
                out,
                "--steps",
                "2",
                "--eval-every",
                "2",
                *TINY_FLAGS,
            ]
        )
        == 0
    )
    return out


@pytest.fixture
def trained(trained_once, tmp_path):
    """A folder of this test's own with that checkpoint (and its metrics), to damage at will."""
    out = str(tmp_path / "trained")
    shutil.copytree(trained_once, out)
    return out


class CreatesAFile:
    """Unpickling this calls open(path, "w"): what a crafted checkpoint could do with any call."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


MODES = {
    "sample": ["--sample", "5"],
    "eval-only": ["--eval-only"],
    "analyze": ["--analyze"],
    "resume": ["--resume", "--steps", "4"],
}


@pytest.mark.parametrize("mode", MODES)
def test_a_checkpoint_is_data_and_cannot_run_code(mode, trained, small_text, tmp_path, capsys):
    marker = tmp_path / "pwned"
    ckpt = torch.load(os.path.join(trained, "ckpt.pt"), weights_only=True)
    ckpt["history"] = [CreatesAFile(str(marker))]
    torch.save(ckpt, os.path.join(trained, "ckpt.pt"))
    capsys.readouterr()
    assert ts.main(["--out", trained, "--data", small_text, *MODES[mode], *TINY_FLAGS]) == 2
    assert not marker.exists()
    assert "is not a readable checkpoint" in error_line(capsys)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "not a dict", "no weights"])
@pytest.mark.parametrize("mode", MODES)
def test_a_damaged_checkpoint_gives_one_error_line(mode, damage, trained, small_text, capsys):
    path = os.path.join(trained, "ckpt.pt")
    good = open(path, "rb").read()
    if damage == "not a dict":
        torch.save([1, 2, 3], path)
    elif damage == "no weights":
        ckpt = torch.load(path, weights_only=True)
        del ckpt["model"]
        torch.save(ckpt, path)
    else:
        payload = {"truncated": good[: len(good) // 2], "garbage": os.urandom(4096), "empty": b""}
        open(path, "wb").write(payload[damage])
    damaged = open(path, "rb").read()
    capsys.readouterr()
    assert ts.main(["--out", trained, "--data", small_text, *MODES[mode], *TINY_FLAGS]) == 2
    assert "checkpoint" in error_line(capsys)
    assert open(path, "rb").read() == damaged  # nothing overwritten


def test_a_checkpoint_whose_weights_do_not_fit_its_config_gives_one_error_line(
    trained, small_text, capsys
):
    path = os.path.join(trained, "ckpt.pt")
    ckpt = torch.load(path, weights_only=True)
    ckpt["model"]["head.weight"] = ckpt["model"]["head.weight"][:, :3]
    torch.save(ckpt, path)
    capsys.readouterr()
    assert ts.main(["--out", trained, "--sample", "5", "--device", "cpu"]) == 2
    assert "do not fit" in error_line(capsys)


def test_data_that_is_not_utf8_text_gives_one_error_line(tmp_path, capsys):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Caf\xe9 au lait\n".encode("latin-1") * 200)
    assert ts.main(["--data", str(path), "--out", str(tmp_path / "run"), *TINY_FLAGS]) == 2
    assert "is not UTF-8 text" in error_line(capsys)


@pytest.mark.parametrize("mode", [[], ["--sample", "5"], ["--eval-only"]])
def test_out_naming_a_file_gives_one_error_line(mode, small_text, tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    assert ts.main(["--data", small_text, "--out", str(path), *mode, *TINY_FLAGS]) == 2
    assert "exists and is not a folder" in error_line(capsys)
    assert path.read_text() == "keep me"


@pytest.mark.parametrize(
    "flag", ["--lr", "--min-lr", "--weight-decay", "--grad-clip", "--dropout", "--temperature"]
)
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


def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_weights(small_text, tmp_path):
    common = ["--data", small_text, "--steps", "20", "--eval-every", "5", *TINY_FLAGS]
    whole, killed = str(tmp_path / "whole"), str(tmp_path / "killed")
    threads = str(torch.get_num_threads())  # as in this process, so the arithmetic is the same
    run = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "train_shakespeare.py"), *common, "--out", killed],
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
    with pytest.raises(ts.UserError, match="is not the Tiny Shakespeare this repository ships"):
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
    for mode in (["--eval-only"], ["--analyze", "--batch-size", "2"]):
        assert ts.main(["--out", out, "--device", "cpu", *mode]) == 0
        assert f"validation text: {small_text}" in capsys.readouterr().out


# ---------------------------------------------------------------- the recall task -----------------


@pytest.mark.parametrize("live_facts, distractors", [(1, False), (3, False), (3, True)])
def test_recall_text_is_deterministic_in_range_and_every_answer_is_in_the_text_before_it(
    live_facts, distractors
):
    make = lambda seed: recall.make_recall_text(
        20000, recall.TRAINING_KEYS, 8, 300, 20, live_facts, seed, distractors=distractors
    )
    a, b, c = make("s"), make("s"), make("t")
    assert a.text == b.text and a.answers.equal(b.answers) and a.text != c.text
    text, answers = a.text, a.answers.tolist()
    assert len(answers) > 50 and set(text) <= set(recall.VOCAB)
    pending = 0
    for position, distance in answers:
        assert 8 <= distance <= 300
        key = text[position - 3 : position - 1]
        assert (
            text[position - 4] == " " and text[position - 1] == "?" and key in recall.TRAINING_KEYS
        )
        # the latest statement of this key before the query is the fact, and its digit the answer
        fact = text.rfind(f" {key}=", 0, position - 4)
        assert fact + 4 == position - distance and text[fact + 4] == text[position]
    # never more facts waiting for their query than asked for
    events = sorted([(p - d, 1) for p, d in answers] + [(p, -1) for p, d in answers])
    for _, change in events:
        pending += change
        assert pending <= live_facts


def test_recall_with_k_facts_waiting_each_answer_needs_its_key():
    """With K facts waiting, the answer is its own key's latest digit, and the digit of the most
    recent fact (whatever its key) is right less and less often as K grows. Not 1/K: D is
    log-uniform, so the fact stated last is often the one asked first (K = 4: 0.40 of the
    queries, a digit's chance of 0.10 included)."""
    share = {}
    for live_facts in (1, 2, 4, 8):
        made = recall.make_recall_text(100_000, recall.TRAINING_KEYS, 8, 400, 5, live_facts, "k")
        text, hits, between = made.text, [], []
        for position, distance in made.answers.tolist():
            key = text[position - 3 : position - 1]
            assert text[text.rfind(f" {key}=", 0, position - 4) + 4] == text[position]
            hits.append(text[text.rfind("=", 0, position - 4) + 1] == text[position])
            between.append(text.count("=", position - distance, position))
        share[live_facts] = sum(hits) / len(hits)
        # the scoring finds the same latest fact (a perfect reader said it whenever it was right)
        ids = ts.encode(text, recall.VOCAB)
        scored = recall.score(ids, ids, made.answers, n_streams=1, seq_len=32)
        assert scored.latest_right.float().mean().item() == pytest.approx(share[live_facts])
        assert scored.said_latest.equal(scored.latest_right)
        assert scored.facts_after.tolist() == between  # the facts stated after the asked one
        assert scored.latest_right[scored.facts_after == 0].all()
        assert (scored.facts_after > 0).any() == (live_facts > 1)
    assert share[1] == 1.0 > share[2] > share[4] > share[8] and share[4] < 0.45 and share[8] < 0.35


def test_recall_distractors_leave_only_the_key_to_find_a_fact_beyond_the_segment():
    """Facts stated while K wait and never asked: the latest fact stated before a query is then
    seldom its own, and from D = 32 on (a segment of the recipes) about as often right as a
    random digit. Without them, short distances are nearly all answered by the latest fact."""

    def latest_right(distractors):
        made = recall.make_recall_text(
            100_000, recall.TRAINING_KEYS, 8, 400, 5, 4, "d", distractors=distractors
        )
        ids = ts.encode(made.text, recall.VOCAB)
        scored = recall.score(ids, ids, made.answers, n_streams=1, seq_len=32)
        far = scored.distance >= 32
        stated = made.text.count("=")
        return scored.latest_right[far].float().mean().item(), len(made.answers), stated

    far_plain, asked_plain, stated_plain = latest_right(False)
    far, asked, stated = latest_right(True)
    assert stated_plain == asked_plain and stated > 1.5 * asked  # the rest are distractors
    assert abs(asked - asked_plain) < 0.1 * asked_plain  # as many queries to learn from
    assert far < 0.15 < far_plain


def test_recall_loss_on_answers_keeps_exactly_the_answer_digits():
    made = recall.make_recall_text(3000, recall.TRAINING_KEYS, 8, 100, 5, 2, "t")
    ids = torch.tensor([recall.VOCAB.index(ch) for ch in made.text])
    x, y = ids[:-1], ids[1:]
    args = ts.parse_args(["--task", "recall", "--loss-on", "answers"])
    kept = recall.loss_targets(args)(x, y)
    assert set((kept != recall.IGNORE).nonzero().flatten().add(1).tolist()) == set(
        made.answers[:, 0].tolist()
    )  # y[t] is the character at t + 1
    assert kept[kept != recall.IGNORE].equal(y[kept != recall.IGNORE])
    assert recall.loss_targets(ts.parse_args(["--task", "recall"]))(x, y) is y


def test_validation_loss_on_answers_is_the_mean_loss_over_the_answer_digits():
    from contextlib import nullcontext

    made = recall.make_recall_text(400, recall.TRAINING_KEYS, 8, 60, 5, 1, "v")
    data = torch.tensor([recall.VOCAB.index(ch) for ch in made.text])
    model = make(vocab_size=len(recall.VOCAB), seq_len=len(data) - 1).eval()
    targets = recall.loss_targets(ts.parse_args(["--task", "recall", "--loss-on", "answers"]))
    loss, _, _ = ts.evaluate(model, data, 1, len(data) - 1, nullcontext(), targets)  # one segment
    with torch.no_grad():
        logits, _, _ = model(data[None, :-1])
    at = made.answers[:, 0] - 1  # the '?' before each answer digit
    expected = F.cross_entropy(logits[0, at], data[at + 1])
    assert math.isclose(loss, expected.item(), rel_tol=1e-5)


def test_recall_validation_shares_no_fact_with_training():
    assert set(recall.VALIDATION_KEYS).isdisjoint(recall.TRAINING_KEYS)
    assert len(recall.VALIDATION_KEYS) + len(recall.TRAINING_KEYS) == 26 * 26
    val = recall.make_recall_text(20000, recall.VALIDATION_KEYS, 8, 300, 20, 2, "validation")
    train = recall.make_recall_text(20000, recall.TRAINING_KEYS, 8, 300, 20, 2, "train")
    facts = lambda text: {text[i + 1 : i + 5] for i in range(len(text) - 4) if text[i + 3] == "="}
    assert facts(val.text) and facts(train.text) and not facts(val.text) & facts(train.text)


def test_recall_curriculum_widens_the_distances_along_the_text():
    r = recall.make_recall_text(40000, recall.TRAINING_KEYS, 8, 400, 10, 1, "c", widen_over=20000)
    position, distance = r.answers.unbind(1)
    early = distance[position - distance < 5000]
    assert early.max() <= 8 + (400 - 8) * 5000 / 20000 and distance.max() > 300
    # held inside a segment of 32 for the first 10,000 characters, then widened from D = 31
    r = recall.make_recall_text(
        40000,
        recall.TRAINING_KEYS,
        8,
        400,
        10,
        1,
        "c",
        widen_over=20000,
        hold_over=10000,
        hold_distance=31,
    )
    position, distance = r.answers.unbind(1)
    fact = position - distance
    assert distance[fact < 10000].max() <= 31 and distance[fact < 10000].min() == 8
    assert 31 < distance[fact < 15000].max() <= 31 + (400 - 31) * 5000 / 20000
    assert distance.max() > 300


def test_recall_accuracy_by_distance_on_a_hand_made_case():
    # 2 streams of 100 characters (data has 201), read 16 at a time; answers at known places
    data = torch.zeros(201, dtype=torch.long)
    answers = torch.tensor([[40, 10], [60, 30], [90, 70], [110, 20], [120, 15], [150, 45]])
    data[answers[:, 0]] = 7
    predictions = torch.zeros(201, dtype=torch.long)
    predictions[[40, 90, 120, 150]] = 7  # right at distances 10, 70, 15 and 45; wrong at 30
    scored = recall.score(predictions, data, answers, n_streams=2, seq_len=16)
    # the query at 110 (stream 1 starts at 100) asks about 90, in stream 0: not scored
    assert scored.distance.tolist() == [10, 30, 70, 15, 45]
    assert scored.correct.tolist() == [True, False, True, True, True]
    assert scored.fact_offset.tolist() == [30, 30, 20, 5, 5]  # fact digit's place in its stream
    # the '?' at 39 is read in the segment from 32, 2 after the digit at 30; the one at 59 in the
    # segment from 48, 18 after it; the one at 89 from 80, 60 after the digit at 20; in stream 1,
    # the '?'s at 119 and 149 (offsets 19 and 49) from 16 and 48, 11 and 43 after the digit at 5
    assert scored.fact_back.tolist() == [2, 18, 60, 11, 43]
    cfg = tiny(seq_len=16, mem_len=16, c_mem_len=4, compression_rate=4)  # reach 16, 32, 48
    rows = recall.by_distance(scored, CompressiveTransformer(cfg).reach(), cfg.seq_len)
    got = [(r["from"], r["to"], r["region"], r["queries"], r["accuracy"]) for r in rows]
    assert got == [
        (10, 15, "segment", 2, 1.0),
        (16, 31, "mem", 1, 0.0),
        (32, 47, "c_mem", 1, 1.0),
        (64, 70, "beyond", 1, 1.0),
    ]
    # a Feedback token sees the last n_m memory vectors wherever it sits: one edge, at n_m
    rows = recall.by_distance(scored, FeedbackTransformer(tiny(seq_len=16, mem_len=16)).reach(), 16)
    got = [(r["from"], r["to"], r["region"], r["queries"]) for r in rows]
    assert got == [
        (10, 15, "mem", 2),
        (16, 31, "beyond", 1),
        (32, 47, "beyond", 1),
        (64, 70, "beyond", 1),
    ]


def test_recall_scoring_finds_the_segment_of_a_query_read_in_the_tail():
    # 4 streams of 50 (data has 204), each read 0-15, 16-31, 32-47, 48-49; the last 4 characters
    # (200-202 predicting 201-203) continue stream 3 (from 150) as one more segment, from offset 50
    data = torch.zeros(204, dtype=torch.long)
    answers = torch.tensor([[203, 30], [199, 30]])  # '?' at offsets 52 and 48; digits at 23, 19
    scored = recall.score(data.clone(), data, answers, n_streams=4, seq_len=16)
    assert scored.fact_offset.tolist() == [23, 19] and scored.fact_back.tolist() == [
        50 - 23,
        48 - 19,
    ]


def test_recall_phase_split_on_a_hand_made_case():
    """The queries whose fact is held in c_mem when they are read (here 16 < fact_back <= 32),
    all together and split by where the digit sits in its block of c (its stream offset mod c)."""
    cfg = tiny(seq_len=16, mem_len=16, c_mem_len=4, compression_rate=4)  # c_mem: D 32-47
    edges = CompressiveTransformer(cfg).reach()
    scored = recall.Scored(
        distance=torch.tensor([33, 40, 47, 35, 44, 38, 20, 60, 30]),
        correct=torch.tensor([True, True, False, False, False, True, True, True, True]),
        fact_offset=torch.tensor([8, 12, 4, 9, 13, 2, 1, 3, 7]),
        fact_back=torch.tensor([20, 32, 31, 25, 28, 22, 16, 33, 17]),
        latest_right=torch.ones(9, dtype=torch.bool),
        said_latest=torch.ones(9, dtype=torch.bool),
        facts_after=torch.zeros(9, dtype=torch.long),
    )
    # D 20 and 60 are held in mem (16) and beyond (33); D 30, in the mem region by distance, was
    # asked early in its segment and is held in c_mem (17)
    phases = recall.by_phase(scored, edges, rate=4)
    assert phases == [
        {"phase": "all", "queries": 7, "accuracy": pytest.approx(4 / 7)},
        {"phase": 0, "queries": 3, "accuracy": pytest.approx(2 / 3)},
        {"phase": 1, "queries": 2, "accuracy": 0.0},
        {"phase": 2, "queries": 1, "accuracy": 1.0},
        {"phase": 3, "queries": 1, "accuracy": 1.0},
    ]
    assert recall.by_phase(scored, CompressiveTransformer(tiny(c_mem_len=0)).reach(), 4) == []
    assert recall.summary(scored, edges, 4) == (
        "mem 1.000, c_mem 0.500, beyond 1.000; held in c_mem "
        "0.571 (by phase 0.667 / 0.000 / 1.000 / 1.000)"
    )


def test_recall_key_use_sets_the_model_against_a_reader_blind_to_the_key():
    # one stream of 100: facts' digits 3 at 10 and 5 at 20, asked at 30 and 40 (D 20, in mem)
    data = torch.zeros(101, dtype=torch.long)
    data[[9, 19]] = recall.VOCAB.index("=")
    data[[10, 20, 30, 40]] = torch.tensor([3, 5, 3, 5])
    answers = torch.tensor([[30, 20], [40, 20]])
    predictions = data.clone()
    predictions[30] = 5  # the model answers both with the latest fact stated
    scored = recall.score(predictions, data, answers, n_streams=1, seq_len=16)
    assert scored.latest_right.tolist() == [False, True] and scored.said_latest.tolist() == [
        True,
        True,
    ]
    edges = CompressiveTransformer(tiny(seq_len=16, mem_len=16, c_mem_len=0)).reach()
    assert scored.facts_after.tolist() == [1, 0]  # the fact at 20 was stated after the one at 10
    # a reader of recency: right where the asked fact is the latest, wrong behind one more
    assert recall.key_use(scored, edges) == [
        {
            "region": "mem",
            "queries": 2,
            "accuracy": 0.5,
            "latest_fact_right": 0.5,
            "said_latest": 1.0,
            "by_facts_after": [1.0, 0.0, None, None],
        }
    ]
    # one fact waiting at a time: the latest fact is always the one asked for, nothing to show
    assert recall.key_use(recall.score(predictions, data, answers[1:], 1, 16), edges) == []


def test_recall_fact_slots_find_the_digit_and_its_marker_in_c_mem():
    # n_m 16, c 4, 4 slots held: the newest slot (3) holds the 4 characters 17-20 before the
    # segment, the oldest (0) those 29-32
    assert recall.fact_slots(17, n_m=16, rate=4, n_held=4) == (
        3,
        3,
    )  # '=' (18 back) in the same slot
    assert recall.fact_slots(20, n_m=16, rate=4, n_held=4) == (3, 2)  # the digit opens its block
    assert recall.fact_slots(25, n_m=16, rate=4, n_held=4) == (1, 1)
    assert recall.fact_slots(32, n_m=16, rate=4, n_held=4) == (0, -1)  # its '=' has left c_mem


def recall_table_rows(printed: str):
    """The rows of the last "recall accuracy by distance" table in printed output, wherever it
    stands among other lines (a plot's "wrote ..." line may follow it)."""
    lines = printed.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("recall accuracy by distance"))
    rows = []
    for line in lines[start + 2 :]:  # after the title and the column names
        match = re.fullmatch(r"\s*(\d+)-(\d+)\s+(\w+)\s+(\d+)\s+([\d.]+)", line)
        if not match:
            break
        rows.append(
            {
                "from": int(match[1]),
                "to": int(match[2]),
                "region": match[3],
                "queries": int(match[4]),
                "accuracy": float(match[5]),
            }
        )
    return rows


def test_task_recall_trains_evaluates_and_reports_by_distance(tmp_path, capsys):
    out = str(tmp_path / "recall")
    flags = [
        "--task",
        "recall",
        "--out",
        out,
        "--steps",
        "30",
        "--eval-every",
        "30",
        "--val-chars",
        "4000",
        "--max-distance",
        "120",
        *TINY_FLAGS,
    ]
    assert ts.main(flags) == 0
    printed = capsys.readouterr().out
    assert "recall accuracy by distance" in printed and "recall accuracy:" in printed
    table = printed[printed.index("recall accuracy by distance") :].splitlines()
    assert "segment < 16, mem < 32, c_mem < 48" in table[0]
    rows = recall_table_rows(printed)
    assert (rows[0]["from"], rows[0]["to"], rows[0]["region"]) == (8, 15, "segment")
    assert {"c_mem", "beyond"} <= {row["region"] for row in rows}
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert sum(row["queries"] for row in metrics["recall"]["by_distance"]) > 20
    assert all(0.0 <= row["accuracy"] <= 1.0 for row in metrics["recall"]["by_distance"])
    held, *phases = metrics["recall"]["by_phase"]  # the facts held in c_mem, then each phase
    assert held["phase"] == "all" and held["queries"] == sum(row["queries"] for row in phases) > 0
    assert "facts held in c_mem when asked" in printed and "held in c_mem" in printed
    # --analyze shows, per phase and layer, where the '?' of queries held in c_mem looks
    assert ts.main(["--out", out, "--analyze", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    looks = printed[printed.index("where the '?' of a query held in c_mem looks") :].splitlines()[
        3:
    ]
    rows = [
        line.split()
        for line in looks
        if re.fullmatch(r"\s*\d+\s+\d+\s+\d+\s+[\d.]+\s+\S+\s+[\d.]+", line)
    ]
    assert {(int(r[0]), int(r[2])) for r in rows} == {(p, l) for p in range(2) for l in range(2)}
    for phase, _, _, digit, marker, c_mem in rows:
        assert 0.0 <= float(digit) + (float(marker) if phase == "0" else 0.0) <= float(c_mem) + 1e-3
        assert (marker == "-") == (phase != "0")
    # and, for the queries whose fact is held in mem, on the digit's and the '='s own slots
    in_mem = [line.split() for line in looks if line.split()[:1] == ["mem"]]
    assert [int(r[2]) for r in in_mem] == [0, 1] and len({r[1] for r in in_mem}) == 1
    for _, queries, _, digit, marker, c_mem in in_mem:
        assert int(queries) > 0 and float(digit) + float(marker) + float(c_mem) <= 1 + 1e-3
    # --sample starts from the recall text's filler by default: it has no newline
    assert ts.main(["--out", out, "--sample", "20", "--device", "cpu"]) == 0
    assert set(capsys.readouterr().out.strip()) <= set(recall.VOCAB)
    # --eval-only takes the task from the checkpoint; the distance flags may widen it
    assert (
        ts.main(
            [
                "--out",
                out,
                "--eval-only",
                "--device",
                "cpu",
                "--batch-size",
                "4",
                "--val-chars",
                "4000",
                "--max-distance",
                "200",
            ]
        )
        == 0
    )
    rows = recall_table_rows(capsys.readouterr().out)
    assert rows and rows[-1]["to"] > 120  # the farthest bucket lies beyond what training asked


# ---------------------------------------------------------------- plots (optional) -----------------

PLOTS = ("loss.png", "recall.png", "attention.png")


@pytest.fixture
def fresh_pyplot():
    """pyplot() remembers whether matplotlib imports; forget it around a test that changes that."""
    plots.pyplot.cache_clear()
    yield
    plots.pyplot.cache_clear()


def draw_every_plot(out, capsys):
    """A few recall steps (loss.png, recall.png), then --analyze (attention.png): what each of the
    two runs printed."""
    assert (
        ts.main(
            [
                "--task",
                "recall",
                "--out",
                out,
                "--steps",
                "4",
                "--eval-every",
                "4",
                "--val-chars",
                "4000",
                "--max-distance",
                "60",
                *TINY_FLAGS,
            ]
        )
        == 0
    )
    trained = capsys.readouterr().out
    plots.pyplot.cache_clear()  # a second run in this process
    assert ts.main(["--out", out, "--analyze", "--device", "cpu", "--batch-size", "2"]) == 0
    return trained, capsys.readouterr().out


def test_every_plot_the_readme_promises_is_a_valid_png(fresh_pyplot, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    out = str(tmp_path / "plots")
    printed = "".join(draw_every_plot(out, capsys))
    for name in PLOTS:
        path = os.path.join(out, name)
        assert f"wrote {path}" in printed
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        image = imread(path)  # decodes the whole file
        assert image.ndim == 3 and min(image.shape[:2]) >= 200
        assert image.std() > 0.01, f"{name} is blank"
    assert "matplotlib is not installed" not in printed
    # the plots of the finished run are drawn again from its files
    for name in ("loss.png", "recall.png"):
        os.remove(os.path.join(out, name))
    assert plots.main([out]) == 0
    printed = capsys.readouterr().out
    for name in ("loss.png", "recall.png"):
        assert f"wrote {os.path.join(out, name)}" in printed
        assert imread(os.path.join(out, name)).std() > 0.01
    assert plots.main([str(tmp_path / "nothing")]) == 2
    assert "no metrics.json or ckpt.pt in" in error_line(capsys)


def test_without_matplotlib_no_plot_is_drawn_and_that_is_said_once(
    fresh_pyplot, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" raises ImportError
    out = str(tmp_path / "plots")
    for printed in draw_every_plot(out, capsys):
        assert printed.count("matplotlib is not installed, so no plots are drawn") == 1
        assert "wrote" not in printed
    assert not set(PLOTS) & set(os.listdir(out))
    assert plots.main([out]) == 2  # drawing them again needs matplotlib, and says so
    assert "matplotlib is not installed" in error_line(capsys)


def test_recall_flags_need_the_recall_task(small_text, tmp_path, capsys):
    assert (
        ts.main(
            [
                "--data",
                small_text,
                "--out",
                str(tmp_path / "x"),
                "--max-distance",
                "50",
                *TINY_FLAGS,
            ]
        )
        == 2
    )
    assert "for --task recall only" in error_line(capsys)
    assert ts.main(["--task", "recall", "--data", small_text, *TINY_FLAGS]) == 2
    assert "--data is for --task shakespeare" in error_line(capsys)


# ---------------------------------------------------------------- attention analysis -------------


def full_memory_model(pre_norm=False):
    model = make(pre_norm=pre_norm).eval()
    memory = None
    with torch.no_grad():
        for n in range(5):
            _, memory, _ = model(tokens(2, 6, seed=n), memory)
    assert memory.mem[0].size(1) == 8 - 2 and memory.c_mem[0].size(1) == 4
    return model, memory


def test_attention_buckets_sum_to_one_for_every_query():
    model, memory = full_memory_model()
    with torch.no_grad(), analysis.recorded_attention(model) as attention:
        model(tokens(2, 6, seed=9), memory)
    for weights in attention:
        buckets = analysis.attention_buckets(weights, 4, 6)
        assert buckets.shape == (2, 2, 6, 3 * analysis.BUCKETS_PER_REGION)
        torch.testing.assert_close(buckets.sum(-1), torch.ones(2, 2, 6))


def test_attention_buckets_line_up_with_the_memory_layout():
    model, memory = full_memory_model()
    with (
        torch.no_grad()
    ):  # no content or position signal: each query spreads evenly over what it sees
        for layer in model.layers:
            layer.attn.qkv.weight.zero_()
            layer.attn.position.weight.zero_()
        with analysis.recorded_attention(model) as attention:
            model(tokens(2, 6, seed=9), memory)
    buckets = analysis.attention_buckets(attention[0], 4, 6)[0, 0]  # [T, buckets]
    n = analysis.BUCKETS_PER_REGION
    for i in range(6):
        visible = 4 + 6 + i + 1
        assert math.isclose(buckets[i, :n].sum().item(), 4 / visible, rel_tol=1e-5)
        assert math.isclose(buckets[i, n : 2 * n].sum().item(), 6 / visible, rel_tol=1e-5)
        assert math.isclose(buckets[i, 2 * n :].sum().item(), (i + 1) / visible, rel_tol=1e-5)
    assert buckets[0, 2 * n + 1 :].sum() == 0  # the first query sees only the first segment bucket


def test_attention_forced_onto_memory_shows_in_the_memory_buckets():
    model = make(pre_norm=False).eval()  # post-LN: layer 0 attends over raw embeddings and memory
    d, dh = 16, 8
    with torch.no_grad():
        model.embed.weight[:, 0] = 0.0
        for layer in model.layers:
            attn = layer.attn
            attn.qkv.weight.zero_()
            attn.position.weight.zero_()
            attn.content_bias.zero_()
            attn.content_bias[:, 0, 0] = 40.0  # every head's content bias looks along key dim 0
            for h in range(2):
                attn.qkv.weight[d + h * dh, 0] = 1.0  # key dim 0 of each head reads feature 0
        mem = torch.randn(2, 8, d)
        mem[..., 0] = 1.0  # only memories carry feature 0
        c_mem = torch.randn(2, 4, d)
        c_mem[..., 0] = 0.0
        memory = Memory([mem, mem], [c_mem, c_mem])
        with analysis.recorded_attention(model) as attention:
            model(tokens(2, 6), memory)
    buckets = analysis.attention_buckets(attention[0], 4, 8).mean(dim=(0, 1, 2))
    n = analysis.BUCKETS_PER_REGION
    assert buckets[n : 2 * n].sum() > 0.99
    assert buckets[:n].sum() < 0.01 and buckets[2 * n :].sum() < 0.01


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
        os.path.join(HERE, "train_shakespeare.py"),
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


def test_bench_prints_its_summary_as_the_last_line(capsys):
    assert ts.main(["--bench", "--bench-steps", "2", *TINY_FLAGS]) == 0
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


def test_code_study_reads_what_the_far_memory_is_worth_from_the_same_checkpoint(tmp_path, capsys):
    """The study's summary on hand-made results: the compressed memory's worth in the zone beyond
    XL-96 and within the compressive model's reach, and the share of XL-192's it keeps."""
    from research import copies, study

    def rows(loss, zone=0.0):
        return {
            b: {"loss": loss + (zone if b == study.ZONE else 0.0), "share": 1 / 7, "chars": 9}
            for b in copies.bucket_names()
        }

    def run(model, ablations):
        return {
            "model": model,
            "budget": "default",
            "seed": 1,
            "extra": [],
            "commit": "c",
            "val_loss": 1.0,
            "loss_by_copy_distance": rows(1.0),
            "history": [{"step": 5, "loss_by_copy_distance": rows(1.2, -0.1)}],
            "ablations": {
                k: {"val_loss": 1.0, "loss_by_copy_distance": v} for k, v in ablations.items()
            },
        }

    results = {
        "conv": run("conv", {"no c_mem": rows(1.0, 0.02), "no mem": rows(1.3)}),
        "xl192": run("xl192", {"mem 96": rows(1.01, 0.05)}),
        "xl96": run("xl96", {}),
        "lever": {
            **run("conv", {"no c_mem": rows(0.95, 0.08)}),
            "val_loss": 0.9,
            "extra": ["--lr", "1e-3"],
            "loss_by_copy_distance": rows(0.9, 0.01),
        },
    }
    worth = study.worth(results["xl192"], "mem 96")
    assert worth[study.ZONE] == pytest.approx(0.06) and worth["1-64"] == pytest.approx(0.01)
    study.tables(results, figure=None)
    printed = capsys.readouterr().out
    assert "conv c_mem +0.0200, XL-192 mem beyond 96 +0.0600: 33%" in printed
    assert "| conv | default | 1 | +0.0000 | +0.0000 | +0.0000 | +0.0200 |" in printed
    assert "conv     default  seed 1: 5: -0.100" in printed  # the zone against beyond every reach
    # the means over seeds, and their differences from XL-96 trained alike
    assert (
        "| conv | default | 1 | 1.0000 (1.000-1.000) | 1.0000 (1.000-1.000) | +0.0000 | +0.0000 "
        "| 0.0200 (0.020-0.020) |"
    ) in printed
    # a lever against its model trained alike without it, on the same seed
    assert (
        "| conv --lr 1e-3 | default | 1 | 0.9000 | -0.1000 | -0.0900 | +0.1200 (+0.0200) |"
        in printed
    )


def test_the_study_evaluates_a_finished_run_again_without_training_it_again(trained):
    """A run whose training finished (its checkpoint at the last step, metrics.json written) but
    whose ablations failed is only evaluated again; a checkpoint short of its steps is retrained."""
    from research import study

    assert study.trained_config(trained, 2)["mem_len"] == 16  # TINY_FLAGS
    assert study.trained_config(trained, 3) is None  # stopped before the last step
    os.remove(os.path.join(trained, "metrics.json"))
    assert study.trained_config(trained, 2) is None  # training did not get to its end


def test_bench_reach_times_both_models_at_each_reach_and_counts_their_state(
    tmp_path, capsys, monkeypatch
):
    from research import reach_cost

    monkeypatch.setattr(reach_cost, "plot", lambda *a: None)  # the figure: a test of plots
    flags = [
        *TINY_FLAGS,
        "--bench",
        "--bench-reach",
        "16",
        "--bench-steps",
        "1",
        "--out",
        str(tmp_path),
    ]
    args = ts.parse_args(flags)
    (_, equal), (_, reach) = reach_cost.pairs(args)
    assert (reach["xl"].mem_len, reach["xl"].c_mem_len) == (16, 0)
    assert (reach["compressive"].mem_len, reach["compressive"].c_mem_len) == (4, 6)  # 4 + 2 * 6
    assert (equal["xl"].mem_len, equal["compressive"].mem_len) == (24, 16)
    equal_rows, reach_rows = reach_cost.run(args, ts)
    printed = capsys.readouterr().out
    assert "24 slots" in printed and "reach 16" in printed and printed.count("ratio") == 2
    for kind, flags_ in reach.items():
        model = ts.make_model(kind, ts.model_config(flags_, 65))
        memory = reach_cost.full_memory(model, 4, torch.device("cpu"))
        # the state figure: every memory tensor's bytes, n_m + n_cm vectors of d_model floats a row
        assert (
            reach_cost.state_bytes(memory)
            == sum(t.numel() * t.element_size() for t in memory.mem + memory.c_mem)
            == 4 * 2 * (flags_.mem_len + flags_.c_mem_len) * 32 * 4
        )
        row = reach_rows[kind]
        assert row["state_bytes"] == reach_cost.state_bytes(memory)
        assert row["train_ms"] > 0 and row["gen_ms"] > 0
        assert row["peak_mib"] is None or row["peak_mib"] >= 0  # None: not Linux nor CUDA
        assert row["keys"] == flags_.mem_len + flags_.c_mem_len + 16
    assert reach_rows["compressive"]["f_c_gflop"] > 0 == reach_rows["xl"]["f_c_gflop"]
    assert equal_rows["compressive"]["keys"] == equal_rows["xl"]["keys"] == 24 + 16
    assert ts.main([*flags[:-4], "--bench-reach", "10"]) == 2
    assert "multiple of 4" in error_line(capsys)
    assert ts.main([*TINY_FLAGS, "--bench-reach", "16"]) == 2
    assert "for --bench" in error_line(capsys)


# ---------------------------------------------------------------- the teachers' handout -----------


def test_handout_the_model_and_its_specification_import_only_torch_pytest_and_the_stdlib():
    """A teacher hands out compressive.py and test_compressive.py alone (.ci/run runs them so)."""
    import ast

    for name in ("compressive.py", "test_compressive.py"):
        with open(os.path.join(HERE, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        imported = {
            (node.names[0].name if isinstance(node, ast.Import) else node.module).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
        }
        assert imported <= set(sys.stdlib_module_names) | {"torch", "pytest", "compressive"}, name
        with open(os.path.join(HERE, name), encoding="utf-8") as f:
            assert "../" not in f.read(), f"{name} names a path outside the repository"


# --------------------------------------------------------------------------------------------------
# The code corpus (--task code) and the loss by copy distance


def make_source_tree(root):
    """A made-up standard library: sources, tests, third-party code, build files."""
    sources = {
        "b.py": "x = 1\n",
        "a/mod.py": "def f():\n\treturn 'caf\u00e9'\r\n",
        "a/test/test_mod.py": "assert True\n",
        "tests/t.py": "pass\n",
        "site-packages/pkg.py": "pass\n",
        "__pycache__/c.py": "pass\n",
        "config-3.11-x86_64/p.py": "pass\n",
        "_sysconfigdata__linux.py": "build = {}\n",
        "a/data.txt": "not python\n",
        **{f"m{k:02d}.py": f"n = {k}\n" for k in range(30)},
    }
    for path, text in sources.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")


def test_code_corpus_is_built_deterministically_from_the_library_sources_alone(tmp_path):
    from research import corpus

    root = tmp_path / "lib"
    make_source_tree(root)
    train, val, manifest = corpus.load(str(tmp_path / "data"), str(root), say=lambda *a: None)
    headers = re.findall(r"^# file: (.*)$", train + val, flags=re.M)
    kept = ["a/mod.py", "b.py", *(f"m{k:02d}.py" for k in range(30))]
    assert sorted(headers) == kept  # no tests, site-packages, caches, build files or non-.py
    assert [h for h in headers if h in re.findall(r"^# file: (.*)$", train, flags=re.M)] == [
        h for h in kept if not corpus.is_validation(h)
    ]  # sorted order, whole files per split
    assert 0 < manifest["files"]["val"] < manifest["files"]["train"]
    assert "\t" not in train + val and "\r" not in train + val  # tabs and CRLF normalised
    assert "return 'caf\x1a'" in train + val  # outside the alphabet: the placeholder
    assert set(train + val) <= set(corpus.VOCAB) and len(corpus.VOCAB) == 97
    assert manifest["chars"] == {"train": len(train), "val": len(val)}
    assert manifest["sha256"]["val"] == hashlib.sha256(val.encode()).hexdigest()
    # a second run reuses it without reading the sources; a build cut short is not trusted
    (root / "m00.py").write_text("changed = True\n")
    assert corpus.load(str(tmp_path / "data"), str(root), say=lambda *a: None)[0] == train
    folder = corpus.folder_for(str(tmp_path / "data"))
    with open(os.path.join(folder, "val.txt"), "a") as f:
        f.write("half")
    said = []
    assert "changed = True" in "".join(
        corpus.load(str(tmp_path / "data"), str(root), say=said.append)[:2]
    )
    assert "do not match their manifest" in said[0]


def test_code_corpus_without_sources_is_one_error_line(tmp_path, monkeypatch, capsys):
    from research import corpus
    from training import data

    (tmp_path / "lib" / "test").mkdir(parents=True)
    (tmp_path / "lib" / "test" / "t.py").write_text("pass\n")
    monkeypatch.setattr(corpus, "stdlib_root", lambda: str(tmp_path / "lib"))
    monkeypatch.setattr(data, "DEFAULT_DATA", str(tmp_path / "data" / "tinyshakespeare.txt"))
    assert ts.main(["--task", "code", "--out", str(tmp_path / "run"), *TINY_FLAGS]) == 2
    assert "no Python sources" in error_line(capsys)
    assert not os.path.exists(tmp_path / "data" / "python3.11-stdlib" / "manifest.json")
    assert not (tmp_path / "run" / "ckpt.pt").exists()


def test_copy_distance_on_a_hand_made_string():
    from research import copies

    #       0123456789012345
    text = "abcXabcYabcZzabc"
    got = copies.copy_distances(text, n=3).tolist()
    want = [copies.NEVER] * len(text)
    want[6], want[10], want[15] = 4, 4, 5  # "abc" ends at 2, 6, 10, 15
    assert got == want
    assert copies.copy_distances("aaaaa", n=2).tolist() == [-1, -1, 1, 1, 1]  # "aa" first ends at 1


def test_copy_buckets_are_drawn_beyond_the_segment():
    from research import copies

    names = copies.bucket_names()
    assert names == ["segment", "1-64", "65-96", "97-192", "193-1000", ">1000", "never"]
    beyond = torch.tensor([-5, 0, 1, 64, 65, 96, 97, 192, 193, 1000, 1001, 7])
    distance = torch.tensor([1] * 11 + [copies.NEVER])
    assert [names[k] for k in copies.bucket_of(beyond, distance)] == [
        "segment",
        "segment",
        "1-64",
        "1-64",
        "65-96",
        "65-96",
        "97-192",
        "97-192",
        "193-1000",
        "193-1000",
        ">1000",
        "never",
    ]
    # the study's geometries: what holds each bucket's copy (n_s 64)
    regions = lambda **kw: copies.regions_of(make(seq_len=64, **kw).reach(), 64)
    assert regions(mem_len=64, c_mem_len=32, compression_rate=4)[:5] == [
        "segment",
        "mem",
        "c_mem",
        "c_mem",
        "beyond",
    ]
    assert regions(mem_len=96, c_mem_len=0)[:5] == ["segment", "mem", "mem", "beyond", "beyond"]
    assert regions(mem_len=192, c_mem_len=0)[:5] == ["segment", "mem", "mem", "mem", "beyond"]


def test_a_characters_zone_is_what_a_one_layer_model_can_see():
    """Change one token: exactly the characters whose copy of it would lie within reach (the
    segment, then n_m = 4, then c * n_cm = 4 more beyond it) change their loss, in its stream
    (the changed character itself, now another target, aside)."""
    from contextlib import nullcontext

    from research import copies

    torch.manual_seed(0)
    model = make(n_layers=1, seq_len=4, mem_len=4, c_mem_len=2, compression_rate=2).eval()
    data = torch.randint(0, model.cfg.vocab_size, (61,))
    text = "".join(chr(65 + int(t) % 26) for t in data)
    distance, index = copies.evaluation_geometry(text, 2, 4)
    assert index[1:6].tolist() == [0, 1, 2, 3, 0] and index[31:33].tolist() == [0, 1]  # stream 2
    _, _, before = ts.evaluate(model, data, 2, 4, nullcontext())
    for q in (3, 10, 33):
        changed = data.clone()
        changed[q] = (changed[q] + 1) % model.cfg.vocab_size
        _, _, after = ts.evaluate(model, changed, 2, 4, nullcontext())
        moved = {p for p in range(1, 61) if p != q and not torch.isclose(before[p], after[p])}
        stream_end = 31 if q < 30 else 61
        seen = {p for p in range(q + 1, stream_end) if (p - 1 - q) - index[p] <= 4 + 2 * 2}
        assert moved == seen, q


# ---------------------------------------------------------------- the memory picture --------------


def position_coded(**overrides):
    """A model whose layer-0 memories say which text positions they hold: the token at position p
    is p, embedded one-hot (post-LN, layer 0 stores its raw inputs in mem), and a pooling f_c, so
    a c_mem slot is the mean (or max) of its block's one-hots."""
    model = make(vocab_size=64, d_model=64, n_heads=2, n_layers=1, seq_len=5, **overrides).eval()
    with torch.no_grad():
        model.embed.weight.copy_(torch.eye(64))
    return model


def held_positions(memory):
    """(mem, c_mem) of layer 0, row 0, decoded into text positions."""
    mem = [int(v.argmax()) for v in memory.mem[0][0]]
    c_mem = [(row > 0).nonzero().flatten().tolist() for row in memory.c_mem[0][0]]
    return mem, c_mem


@pytest.mark.parametrize(
    "n_m, n_cm, c, f_c",
    [(7, 3, 3, "mean_pool"), (8, 2, 4, "max_pool"), (7, 0, 3, "mean_pool"), (0, 0, 3, "mean_pool")],
)
def test_the_pictures_fifo_bookkeeping_is_the_models_own_update_memory(n_m, n_cm, c, f_c):
    model = position_coded(mem_len=n_m, c_mem_len=n_cm, compression_rate=c, compression=f_c)
    lengths, start = [5, 5, 2, 5, 5, 5, 4, 5, 5], 3  # T = 2, 4, 5: not multiples of c
    steps = memory_picture.fifo_steps(start, lengths, n_m, n_cm, c)
    memory, position, overflowed = None, start, False
    with torch.no_grad():
        for length, step in zip(lengths, steps):
            _, memory, _ = model(torch.arange(position, position + length)[None], memory)
            position += length
            mem, c_mem = held_positions(memory)
            assert (mem, c_mem) == (step.mem, step.c_mem)
            for slot, block in zip(memory.c_mem[0][0] if n_cm else [], step.c_mem):
                expected = torch.zeros(64)
                expected[block] = 1.0 / c if f_c == "mean_pool" else 1.0
                torch.testing.assert_close(slot, expected)  # exactly the c characters of its block
            overflowed |= bool(step.dropped)
    assert overflowed == (n_cm > 0)  # c_mem filled and overflowed where there is one


def test_the_pictures_slots_are_the_keys_the_query_sees_and_its_weights_lie_on_them():
    model = position_coded(mem_len=7, c_mem_len=3, compression_rate=3, compression="mean_pool")
    ids, vocab = torch.arange(64), [chr(48 + i) for i in range(64)]
    picture = memory_picture.memory_picture(model, ids, vocab, start=3, query=40)
    data = picture.data
    assert set(data) == {"start", "seq_len", "query", "slots"} and data["seq_len"] == 5
    slots = data["slots"]
    # n_m = 7 is not a multiple of c = 3: eviction in whole blocks leaves mem 5 of 7 here
    assert [s["region"] for s in slots] == ["c_mem"] * 3 + ["mem"] * 5 + ["segment"] * 3
    positions = [p for s in slots for p in s["positions"]]
    assert positions == list(range(positions[0], 41))  # contiguous, oldest first, up to the query
    memory = None
    with torch.no_grad():  # the model's own memory before the query's segment (38-42)
        for a in range(3, 38, 5):
            _, memory, _ = model(ids[a : a + 5][None], memory)
    mem, c_mem = held_positions(memory)
    assert [s["positions"] for s in slots[:3]] == c_mem and [
        s["positions"][0] for s in slots[3:8]
    ] == mem
    assert all(s["text"] == "".join(vocab[p] for p in s["positions"]) for s in slots)
    assert math.isclose(sum(s["attention"][0] for s in slots), 1.0, rel_tol=1e-6)  # no key missing
    # a layer made to look for one position's feature puts its largest weight on the slot of it
    d_head = 32
    with torch.no_grad():
        attn = model.layers[0].attn
        attn.qkv.weight.zero_()
        attn.position.weight.zero_()
        attn.content_bias.zero_()
        attn.content_bias[:, 0, 0] = 400.0
        for target in (25, 35):  # in c_mem, in mem
            attn.qkv.weight[64 : 64 + 2 * d_head : d_head] = 0.0
            attn.qkv.weight[[64, 64 + d_head], target] = 1.0
            picture = memory_picture.memory_picture(
                model, ids, vocab, start=3, query=40, heads=True
            )
            ((k, weight),) = memory_picture.strongest(picture)
            assert target in picture.data["slots"][k]["positions"] and weight > 0.9
            by_head = picture.data["slots"][k]["attention_by_head"][0]
            assert math.isclose(sum(by_head) / 2, weight, rel_tol=1e-6)
    with pytest.raises(ValueError, match="outside the passage"):
        memory_picture.memory_picture(model, ids, vocab, start=10, query=5)
    with pytest.raises(ValueError, match="Feedback Transformer"):
        memory_picture.memory_picture(FeedbackTransformer(tiny()), ids, vocab)


def test_picture_of_a_checkpoint_writes_its_json_png_and_gif(
    trained, small_text, tmp_path, capsys, monkeypatch
):
    picture = ["--picture", "--data", small_text, "--device", "cpu"]
    with monkeypatch.context() as without:  # no matplotlib: the JSON, and one line saying so
        without.setitem(sys.modules, "matplotlib", None)
        assert ts.main(["--out", trained, *picture]) == 2
        assert "matplotlib is not installed" in error_line(capsys)
    assert "memory.json" in os.listdir(trained) and "memory.png" not in os.listdir(trained)
    data = json.load(open(os.path.join(trained, "memory.json")))
    # n_s 16, n_m 16, n_cm 8, c 2: by default 5 segments from 0, the query the last character;
    # before the query's segment 64-79, mem holds 48-63 and c_mem the pairs of 32-47
    assert (data["start"], data["seq_len"], data["query"]) == (0, 16, 79)
    assert [s["positions"] for s in data["slots"]] == (
        [[p, p + 1] for p in range(32, 48, 2)] + [[p] for p in range(48, 80)]
    )
    val = open(small_text).read()[int(0.9 * 6000) :]
    assert all(s["text"] == "".join(val[p] for p in s["positions"]) for s in data["slots"])
    assert all(len(s["attention"]) == 2 for s in data["slots"])
    for flags, message in [  # bad input: one line each
        (["--picture-query", "100000"], "the validation text has 600 characters"),
        (["--picture-start", "-1"], "the validation text has 600 characters"),
        (["--picture-start", "50", "--picture-query", "10"], "lies before --picture-start 50"),
        (["--picture-start", "590"], "the validation text ends 10 characters after it"),
    ]:
        assert ts.main(["--out", trained, *picture, *flags]) == 2
        assert message in error_line(capsys)
    assert ts.main(["--out", str(tmp_path / "none"), *picture]) == 2
    assert "no checkpoint at" in error_line(capsys)
    assert ts.main(["--out", trained, "--picture-query", "5"]) == 2
    assert "are for --picture" in error_line(capsys)
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread
    from PIL import Image

    assert (
        ts.main(["--out", trained, *picture, "--picture-start", "16", "--picture-query", "60"]) == 0
    )
    printed = capsys.readouterr().out
    for name in ("memory.json", "memory.png", "memory.gif"):
        assert f"wrote {os.path.join(trained, name)}" in printed
    image = imread(os.path.join(trained, "memory.png"))
    assert image.ndim == 3 and min(image.shape[:2]) >= 200 and image.std() > 0.01
    with Image.open(os.path.join(trained, "memory.gif")) as gif:
        assert gif.format == "GIF" and gif.n_frames == 2 * 3  # two frames a segment: 16-63


def test_picture_on_a_recall_text_picks_a_query_whose_fact_is_in_c_mem():
    cfg = tiny(
        seq_len=8, mem_len=8, c_mem_len=4, compression_rate=2
    )  # c_mem: 9-16 before a segment
    answers = torch.tensor([[30, 12], [60, 13], [90, 20]])  # (the answer digit's position, D)
    start, query, fact = memory_picture.recall_query(cfg, answers, 200)
    # the '?' at 89 ends the segment 82-89; mem holds 74-81, c_mem 66-73; the fact's digit is 70
    assert (query, fact) == (89, [66, 67, 68, 69, 70]) and start == 89 - 7 - 4 * 8  # 5 segments
    assert memory_picture.recall_fact(answers, 59) == [43, 44, 45, 46, 47]
