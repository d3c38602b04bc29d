"""The README's two commands on a machine that other jobs keep busy: the default training run and
`pytest`, each timed as a newcomer types it, beside --busy processes (plain Python loops that stop
after --limit seconds, or as soon as the command ends) spinning on the CPU. What it measured is in
the README, beside the two commands.

    python bench_busy.py                  # both commands, two busy processes beside them
    python bench_busy.py --busy 0         # the same on the machine as it is
    python bench_busy.py --only pytest    # one of them
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def timed(command: list, env: dict) -> tuple:
    """(seconds, exit status, last line printed) of a run of command, its lines shown as it goes."""
    start, last = time.monotonic(), ""
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        for line in process.stdout:
            print("    " + line.rstrip(), flush=True)
            last = line.strip() or last
    return time.monotonic() - start, process.returncode, last


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python bench_busy.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside each command")
    parser.add_argument("--only", choices=["train", "pytest"], help="time one command alone")
    parser.add_argument("--limit", type=int, default=1800, help="seconds a busy process spins")
    args = parser.parse_args()
    if args.busy < 0 or args.limit < 1:
        print("error: --busy must be >= 0 and --limit >= 1", file=sys.stderr)
        return 2
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    print(f"{os.cpu_count()} cores, {args.busy} busy processes beside each command")
    with tempfile.TemporaryDirectory(prefix="bench_busy_") as out:  # the run's checkpoint
        commands = {
            "train": [sys.executable, "train_shakespeare.py", "--out", out],
            "pytest": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        }
        for name in [args.only] if args.only else commands:
            spin = [sys.executable, "-c", SPIN.format(seconds=args.limit)]
            busy = [subprocess.Popen(spin) for _ in range(args.busy)]
            try:
                seconds, status, last = timed(commands[name], env)
            finally:
                for process in busy:
                    process.kill()
                    process.wait()
            load = os.getloadavg()[0]
            print(f"{name}: {seconds:.0f} s, exit {status}, load {load:.1f} at the end: {last}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
