"""The test process of the teachers' kit: runs pytest on a test file of its folder (control's
"test_file", test_compressive.py unless it says another), and streams each test's outcome to the
grader as it happens.

    python grading_child.py FD          one run; the tests to run come on stdin
    python grading_child.py --zygote FD a process that starts runs by forking (Linux)

A run is told the tests to run: node ids ("tests"), names of test functions ("names"), or every
test (both null), less the test functions of "leave_out". It writes one JSON line per event to
the pipe FD: the tests collected, each phase of each test (setup, call, teardown) with its
outcome and the first line of why it failed, then the end of the run. Each line is written as
its test ends, before pytest returns, so nothing the tested code does afterwards (an atexit hook,
say) can change a line already sent; the pipe is closed before the process exits, and the grader
counts any line after the run's end, any missing test and any test reported twice as a forged
report.

Importing torch and the helpers its test functions load on first use takes about 1.6 s of CPU,
most of a small run. The zygote pays it once: it imports them, runs nothing, and for each run
the grader sends it forks a waiter, which forks the run itself and reports the run's process id
and exit status. Forking is safe only from a process with one thread; the zygote checks that it
has one before it says it is ready. Standard library, pytest and torch only.
"""

import gc
import json
import os
import sys


def first_line(report) -> str:
    """The first line of why a test failed (its assertion message or its exception), or of why it
    was skipped."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        text = str(report.longrepr[-1])
    else:
        text = str(report.longrepr)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:500] if lines else "failed"


def run(report_fd: int, control: dict) -> int:
    """pytest on the test file of the current folder, each event a line on report_fd."""
    channel = os.fdopen(report_fd, "w", encoding="utf-8", buffering=1)
    selected, names = control.get("tests"), control.get("names")
    leave_out = set(control.get("leave_out") or [])

    def send(**event):
        channel.write(json.dumps(event) + "\n")
        channel.flush()

    import pytest
    import torch

    # pytest collects garbage five times as it ends (to flush unraisable exceptions); frozen, the
    # objects of torch and pytest imported so far are not walked by each collection, which would
    # otherwise cost most of a small run.
    gc.freeze()

    class Reporter:
        def pytest_collection_modifyitems(self, session, config, items):
            if selected is None and names is None and not leave_out:
                return
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
            if report.failed:
                send(collect_error=first_line(report))

        def pytest_collection_finish(self, session):
            send(
                collected=[item.nodeid for item in session.items],
                versions={"torch": torch.__version__, "pytest": pytest.__version__},
            )

        def pytest_runtest_logreport(self, report):
            message = "" if report.passed else first_line(report)
            send(test=report.nodeid, when=report.when, outcome=report.outcome, message=message)

        def pytest_sessionfinish(self, session, exitstatus):
            send(finished=int(exitstatus))

    # --tb=no: the first line of each failure is all the grader reads, and a long traceback
    # through the model costs more than the test
    test_file = control.get("test_file") or "test_compressive.py"
    args = ["-q", "-p", "no:cacheprovider", "--no-header", "--tb=no", test_file]
    status = pytest.main(args, plugins=[Reporter()])
    channel.close()
    return int(status)


def main() -> int:
    control = json.loads(sys.stdin.readline())
    sys.stdin.close()
    return run(int(sys.argv[1]), control)


# ---------------------------------------------------------------- the zygote ----------------------


def serve(socket_fd: int) -> int:
    """Import what every run needs, say whether forking is safe here, then fork a waiter for each
    run the grader sends: its folder, what to run, and three pipes (report, output, status)."""
    import signal
    import socket
    import threading

    connection = socket.socket(fileno=socket_fd)
    import pytest  # noqa: F401
    import torch  # noqa: F401
    import torch.testing  # noqa: F401

    try:  # what torch.testing.assert_close imports on its first call, and torch.compile's tracer
        import torch._dynamo  # noqa: F401
        import torch.distributed.tensor  # noqa: F401
    except ImportError:
        pass
    one_thread = threading.active_count() == 1 and len(os.listdir("/proc/self/task")) == 1
    connection.sendall(b"ready" if one_thread else b"unsafe")
    if not one_thread:
        return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters reap themselves
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        except OSError:
            break
        if not message:  # the grader has gone
            break
        if os.fork() == 0:  # the waiter: never returns into this loop
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                connection.close()
                wait_for_run(json.loads(message), *fds)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
    return 0


def wait_for_run(job: dict, report_fd: int, output_fd: int, status_fd: int) -> None:
    """In the waiter: fork the run, send its process id, wait for it, send its exit status."""
    pid = os.fork()
    if pid == 0:
        os.close(status_fd)
        os.setsid()  # its own process group, which the grader kills whole at the timeout
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(output_fd)
        os.chdir(job["folder"])
        sys.path[0] = job["folder"]
        sys.argv = [os.path.join(job["folder"], "grading_child.py"), str(report_fd)]
        code = 1
        try:
            code = run(report_fd, job["control"])
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(report_fd)
    os.close(output_fd)
    os.write(status_fd, f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    os.write(status_fd, f"{os.waitstatus_to_exitcode(status)}\n".encode())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"]:
        sys.exit(serve(int(sys.argv[2])))
    sys.exit(main())
