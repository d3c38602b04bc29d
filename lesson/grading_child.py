"""The test process of the teachers' kit: runs pytest on the compressive.py and test_compressive.py
of its folder, and streams each test's outcome to the grader as it happens.

    python grading_child.py FD      (the grader starts it; the control message comes on stdin)

This process reads from stdin the tests to run: node ids ("tests"), names of test functions
("names"), or every test (both null). It writes one JSON line per event to the pipe FD: the tests
collected, each phase of each test (setup, call, teardown) with its outcome and the first line
of why it failed, then the session's end. Each line is written as its test ends, before pytest
returns, so nothing the tested code does afterwards (an atexit hook, say) can change a line
already sent; the pipe is closed before the process exits, and the grader counts any line after
the session's end, any missing test and any test reported twice as a forged report. Standard
library and pytest only.
"""

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


def main() -> int:
    channel = os.fdopen(int(sys.argv[1]), "w", encoding="utf-8", buffering=1)
    control = json.loads(sys.stdin.readline())
    sys.stdin.close()
    selected, names = control.get("tests"), control.get("names")

    def send(**event):
        channel.write(json.dumps(event) + "\n")
        channel.flush()

    import pytest
    import torch

    class Reporter:
        def pytest_collection_modifyitems(self, session, config, items):
            if selected is None and names is None:
                return
            keep = [
                item
                for item in items
                if (selected is None or item.nodeid in selected)
                and (names is None or item.originalname in names)
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

    args = ["-q", "-p", "no:cacheprovider", "--no-header", "--tb=short", "test_compressive.py"]
    status = pytest.main(args, plugins=[Reporter()])
    channel.close()
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
