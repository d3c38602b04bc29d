"""The Gradescope autograder bundle of an assignment, in the layout of Gradescope's
specifications (https://gradescope-autograders.readthedocs.io/en/latest/specs/): autograder/'s
setup.sh (with the assignment's versions of torch and pytest) and run_autograder (which grades
with python -m teachers_kit.handout --grade), the kit's code and, under assignment/, the
teacher's files; nothing of the student's."""

import string
import zipfile
from pathlib import Path

KIT = Path(__file__).resolve().parent
# the kit's code, its table of exercises and its own requirements, which setup.sh installs
KIT_FILES = sorted(p.name for p in KIT.glob("*.py") if not p.name.startswith("test_"))
KIT_FILES += ["exercises.json", "requirements.txt"]
SCRIPTS = ("setup.sh", "run_autograder")  # at the bundle's top, executable


def write_bundle(assignment, zip_path: Path) -> None:
    """The bundle of an assignment (a grading.Assignment) at zip_path, the teacher's alone; each
    file dated alike, so the same assignment makes the same bytes."""
    setup = string.Template((KIT / "autograder" / "setup.sh").read_text(encoding="utf-8"))
    # the versions the checks were computed with, less a local tag such as +cpu
    pins = {name: assignment.versions[name].split("+")[0] for name in ("torch", "pytest")}
    files = {
        "setup.sh": setup.substitute(pins).encode(),
        "run_autograder": (KIT / "autograder" / "run_autograder").read_bytes(),
        **{f"teachers_kit/{name}": (KIT / name).read_bytes() for name in KIT_FILES},
    }
    for name in [assignment.layout.module, assignment.layout.tests, *assignment.layout.support]:
        files[f"assignment/{name}"] = (assignment.folder / name).read_bytes()
    files["assignment/assignment.json"] = (assignment.folder / "assignment.json").read_bytes()
    staging = zip_path.with_name(f".{zip_path.name}.tmp")
    with zipfile.ZipFile(staging, "w") as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100755 if name in SCRIPTS else 0o100644) << 16
            archive.writestr(info, data, zipfile.ZIP_DEFLATED)
    staging.chmod(0o600)  # the solution and the hidden tests
    staging.replace(zip_path)
