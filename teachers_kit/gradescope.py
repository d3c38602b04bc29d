"""The Gradescope autograder bundle of an assignment: a zip whose run_autograder grades one
submission with the kit itself (python -m teachers_kit.handout --grade) and writes Gradescope's
results.json. Gradescope unpacks it into /autograder/source, runs setup.sh once when it builds
the image, then run_autograder from /autograder for each submission (its autograder
specifications: https://gradescope-autograders.readthedocs.io/en/latest/specs/).

The bundle holds the kit's code (teachers_kit/), the assignment (the original, every test, the
files they import, assignment.json) under assignment/, setup.sh and run_autograder; nothing of
the student's.
"""

import zipfile
from pathlib import Path
from typing import Dict, List

KIT = Path(__file__).resolve().parent
KIT_FILES = [
    "handout.py",
    "exercises.py",
    "audit.py",
    "grading.py",
    "grading_child.py",
    "sandbox.py",
    "gradescope.py",
    "exercises.json",  # the table of exercises, which exercises.py reads as it is imported
    "requirements.txt",  # the kit's own, which setup.sh installs
]
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def setup_sh(versions: Dict[str, str]) -> str:
    # the versions the assignment's checks were computed with, less a local tag such as +cpu
    torch_version = versions.get("torch", "2.13.0").split("+")[0]
    pytest_version = versions.get("pytest", "9.2.0").split("+")[0]
    return f"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (pick an Ubuntu base
# image whose python3 torch {torch_version} supports). It needs the network (apt's mirrors, the
# Python package index and torch's own index), as Gradescope's image builder has; grading itself
# needs none. Bubblewrap, the sandbox each student's function runs in (where the container
# forbids it, grading says so and runs that code as a uid of its own). A virtual environment of
# its own, so the system's packages play no part; the CPU build of torch (the GPU build is a
# multi-GB download a grader has no use for) and pytest, pinned to the versions the assignment's
# checks were computed with.
set -euo pipefail
apt-get update
apt-get install -y python3 python3-venv bubblewrap libseccomp2
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --no-cache-dir torch=={torch_version} --index-url {TORCH_CPU_INDEX}
/autograder/venv/bin/pip install --no-cache-dir pytest=={pytest_version}
/autograder/venv/bin/pip install --no-cache-dir -r /autograder/source/teachers_kit/requirements.txt
"""


RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: it grades the module the student uploaded
# (submission/) with the teacher's tests and original (source/assignment/) and writes
# results/results.json. Every exercise is graded alone, after a static audit of the whole file,
# the student's function in a sandbox; the student's other files are never read. source/ is
# made readable by root alone, so that no student code, whatever uid it runs as, reads the
# teacher's original in it. The root is the folder that holds source/,
# submission/ and results/: /autograder on Gradescope, where this script is copied to the root,
# or the folder above it when run from source/ (AUTOGRADER_ROOT overrides). The Python is
# setup.sh's, or else python3, said on stderr (AUTOGRADER_PYTHON overrides); the grade refuses a
# torch other than the assignment's, with a results.json that says so.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -n "${AUTOGRADER_ROOT:-}" ]; then
  root="$AUTOGRADER_ROOT"
elif [ -d "$here/source" ]; then
  root="$here"
else
  root="$(dirname "$here")"
fi
python="${AUTOGRADER_PYTHON:-/autograder/venv/bin/python3}"
if [ ! -x "$python" ]; then  # said, not silent: the grade then checks this Python's torch
  echo "no $python (did setup.sh run?): grading with $(command -v python3)" >&2
  python="$(command -v python3)"
fi
results="$root/results/results.json"
mkdir -p "$root/results"
rm -f "$results"
chmod go-rwx "$root/source"
cd "$root/source" || exit 1
"$python" -m teachers_kit.handout --grade "$root/submission" --assignment assignment \\
  --results "$results" --in-gradescope-container
status=$?
if [ ! -s "$results" ]; then  # the grader itself failed: a zero that says so, not a silent one
  why="The autograder failed (exit status $status): your teacher can see why in its output."
  printf '{"score": 0.0, "output": "%s", "tests": []}\\n' "$why" > "$results"
fi
exit 0
"""


def add(archive: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
    """One file, with a fixed date (the same assignment makes the same bytes)."""
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def assignment_files(assignment) -> List[str]:
    """The files of an assignment's folder (a grading.Assignment): its module, its tests, the
    files they import, and assignment.json."""
    layout = assignment.layout
    return [layout.module, layout.tests, *layout.support, "assignment.json"]


def write_bundle(assignment, zip_path: Path) -> None:
    """The bundle of an assignment (a grading.Assignment), at zip_path."""
    staging = zip_path.with_name(f".{zip_path.name}.tmp")
    with zipfile.ZipFile(staging, "w") as archive:
        add(archive, "setup.sh", setup_sh(assignment.versions).encode(), executable=True)
        add(archive, "run_autograder", RUN_AUTOGRADER.encode(), executable=True)
        for name in KIT_FILES:
            add(archive, f"teachers_kit/{name}", (KIT / name).read_bytes())
        for name in assignment_files(assignment):
            add(archive, f"assignment/{name}", (assignment.folder / name).read_bytes())
    staging.chmod(0o600)  # the solution and the hidden tests: the teacher's alone
    staging.replace(zip_path)
