"""The Gradescope autograder bundle of an assignment, in the layout of Gradescope's
specifications (https://gradescope-autograders.readthedocs.io/en/latest/specs/): setup.sh,
run_autograder (which grades with python -m teachers_kit.handout --grade), the kit's code and,
under assignment/, the teacher's files; nothing of the student's."""

import zipfile
from pathlib import Path

KIT = Path(__file__).resolve().parent
# the kit's code, its table of exercises and its own requirements, which setup.sh installs
KIT_FILES = sorted(p.name for p in KIT.glob("*.py") if not p.name.startswith("test_"))
KIT_FILES += ["exercises.json", "requirements.txt"]
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def setup_sh(versions: dict) -> str:
    # the versions the assignment's checks were computed with, less a local tag such as +cpu
    torch_version = versions.get("torch", "2.13.0").split("+")[0]
    pytest_version = versions.get("pytest", "9.2.0").split("+")[0]
    return f"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the image (an Ubuntu image whose python3
# torch {torch_version} supports). It needs the network (apt, the Python package index, torch's
# index); grading needs none. The CPU build of torch, and pytest, as the checks were computed.
set -euo pipefail
apt-get update
apt-get install -y python3 python3-venv bubblewrap libseccomp2
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --no-cache-dir torch=={torch_version} --index-url {TORCH_CPU_INDEX}
/autograder/venv/bin/pip install --no-cache-dir pytest=={pytest_version}
/autograder/venv/bin/pip install --no-cache-dir -r /autograder/source/teachers_kit/requirements.txt
"""


RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: it grades submission/ with source/assignment/ and
# writes results/results.json. The root holds source/, submission/ and results/: where this
# script lies (/autograder on Gradescope) or the folder above (AUTOGRADER_ROOT says otherwise);
# the Python is setup.sh's, or else python3 (AUTOGRADER_PYTHON says otherwise). source/ is made
# root's alone, so no student code reads the teacher's original in it.
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


def write_bundle(assignment, zip_path: Path) -> None:
    """The bundle of an assignment (a grading.Assignment) at zip_path, the teacher's alone; each
    file dated alike, so the same assignment makes the same bytes."""
    layout = assignment.layout
    files = {
        "setup.sh": setup_sh(assignment.versions).encode(),
        "run_autograder": RUN_AUTOGRADER.encode(),
        **{f"teachers_kit/{name}": (KIT / name).read_bytes() for name in KIT_FILES},
    }
    for name in [layout.module, layout.tests, *layout.support, "assignment.json"]:
        files[f"assignment/{name}"] = (assignment.folder / name).read_bytes()
    staging = zip_path.with_name(f".{zip_path.name}.tmp")
    with zipfile.ZipFile(staging, "w") as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            executable = name in ("setup.sh", "run_autograder")
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    staging.chmod(0o600)  # the solution and the hidden tests
    staging.replace(zip_path)
