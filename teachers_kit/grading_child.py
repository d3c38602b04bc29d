"""The test process of the teachers' kit: pytest on the teacher's files in a folder of its own,
its outcomes sent to the grader as one JSON record; to grade an exercise, its function a proxy to
the worker (sandbox.py): this process, which decides, never runs a line of a submission.
`python grading_child.py FD` forks a run for each job the grader sends on the socket FD.
"""

import gc
import importlib
import json
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest
import torch

sys.path[0] = os.getcwd()  # the run's folder: its module and tests, not the kit's
sys.path.append(str(Path(__file__).resolve().parent))
import sandbox  # noqa: E402  the kit's own, beside this file

gc.freeze()  # pytest collects garbage five times as it ends: not through torch's objects


def first_line(report) -> str:
    """The first line of why a test failed or was skipped."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        text = str(report.longrepr[-1])
    else:
        text = str(report.longrepr)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:500] if lines else "failed"


class WrongBody:
    """A wrong answer made of any function, each floating-point tensor of the original's value
    replaced. "zeros": times 0; "perturbed": plus noise as large as itself (its gradients right);
    "inputs": the argument of its shape and dtype (an update returning its inputs)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.noise = torch.Generator().manual_seed(0)  # the tests' own random stream untouched

    def __call__(self, target, args, kwargs):
        value = target(*args, **kwargs)
        inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        return self.replaced(value, inputs)

    def replaced(self, value, inputs):
        if isinstance(value, (tuple, list)):
            items = [self.replaced(item, inputs) for item in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.is_meta:
            return value
        if self.kind == "inputs":
            same = [a for a in inputs if a.shape == value.shape and a.dtype == value.dtype]
            return same[0] if same else value * 0
        if self.kind == "zeros":
            return value * 0
        noise = torch.randn(value.shape, generator=self.noise, dtype=value.dtype)
        return value + noise * (value.detach().abs().mean() + 1)


def run(control: dict, sandbox_fd: Optional[int]) -> dict:
    """pytest on this folder's test file; the record. sandbox_fd: the graded function's worker."""
    selected, names = control.get("tests"), control.get("names")
    leave_out = set(control.get("leave_out") or [])
    record = {"collected": None, "outcomes": {}, "messages": {}, "collect_error": "", "problem": ""}
    record["versions"] = {"torch": torch.__version__, "pytest": pytest.__version__}
    box = None
    graded, wrong = control.get("graded"), control.get("wrong")
    if graded:  # the proxy in place before the tests import anything of the module
        module = importlib.import_module(graded["module"])  # the teacher's original, from here
        classes = sandbox.named_tuples(os.getcwd())
        box = sandbox.Sandbox(sandbox_fd, graded, control["timeout_s"], classes)
        sandbox.install(module, graded["function"], lambda _, args, kwargs: box.call(args, kwargs))
    elif wrong:
        module = importlib.import_module(wrong["module"])
        sandbox.install(module, wrong["function"], WrongBody(wrong["kind"]))
    rank = ["passed", "skipped", "failed"]

    class Reporter:
        def pytest_collection_modifyitems(self, session, config, items):
            keep = [
                item
                for item in items
                if (selected is None or item.nodeid in selected)
                and (names is None or item.originalname in names)
                and item.originalname not in leave_out
            ]
            config.hook.pytest_deselected(items=[item for item in items if item not in keep])
            items[:] = keep

        def pytest_collectreport(self, report):
            if report.failed and not record["collect_error"]:
                record["collect_error"] = first_line(report)

        def pytest_collection_finish(self, session):
            record["collected"] = [item.nodeid for item in session.items]

        def pytest_runtest_logreport(self, report):
            outcomes, test = record["outcomes"], report.nodeid
            outcomes[test] = max(outcomes.get(test, "passed"), report.outcome, key=rank.index)
            if not report.passed and test not in record["messages"]:
                record["messages"][test] = first_line(report)
            if report.when == "teardown" and box is not None:
                box.reset()  # the sandbox forgets the graphs of this test's calls

    # --tb=no: the grader reads a failure's first line, and a traceback costs more than the test
    args = ["-q", "-p", "no:cacheprovider", "--no-header", "--tb=no", control["test_file"]]
    try:
        pytest.main(args, plugins=[Reporter()])
    finally:
        if box is not None:
            record["problem"] = box.problem
            record["worker_ended"] = box.gone == sandbox.WORKER_ENDED
            box.close()
    return record


# ---------------------------------------------------------------- the zygote ----------------------


def serve(socket_fd: int) -> int:
    """Imports once (about 2 s), says whether forking is safe here, then forks a run for each
    job: its folder and control, its pipes (report, output) and its worker's socket."""
    connection = socket.socket(fileno=socket_fd)
    import torch.testing  # noqa: F401

    try:  # what torch.testing.assert_close imports on its first call, and torch.compile's tracer
        import torch._dynamo  # noqa: F401
        import torch.distributed.tensor  # noqa: F401
    except ImportError:
        pass
    gc.freeze()
    connection.sendall(b"ready" if sandbox.alone() else b"unsafe")
    if not sandbox.alone():
        return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the runs reap themselves
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        except OSError:
            return 0
        if not message:  # the grader has gone
            return 0
        if os.fork() == 0:  # a run: never returns into this loop
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                connection.close()
                job = json.loads(message)
                os.setsid()  # its own process group, which the grader kills whole at its limit
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(fds[1], 1)
                os.dup2(fds[1], 2)
                os.chdir(job["folder"])
                sys.path[0] = job["folder"]
                os.environ["TMPDIR"] = os.path.join(job["folder"], "tmp")  # the run's own
                tempfile.tempdir = None
                # this process's id first (the grader kills its group at its limit), then the record
                with os.fdopen(fds[0], "w", encoding="utf-8") as channel:
                    channel.write(f"{os.getpid()}\n")
                    channel.flush()
                    channel.write(json.dumps(run(job["control"], fds[2] if len(fds) > 2 else None)))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
