"""Grading one submission: each exercise's check runs in a test process of its own
(grading_child.py), in a fresh folder holding the teacher's original and tests alone, with the
exercise's function a proxy to a worker in the submission's sandbox (sandbox.py, started here:
StudentSandbox), which holds the original with only the student's function put in
(exercises.splice). A check is the tests that fail with the function blanked for real
(compute_checks), less those that fail with the original's own function in the sandbox
(make_assignment). grade_class grades a class, students side by side, one per core.
"""

import ast
import atexit
import collections
import contextlib
import errno
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import queue
import select
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path, PurePosixPath
from typing import Dict, List, NamedTuple, Optional, Tuple

from teachers_kit import audit
from teachers_kit.exercises import (
    KitError,
    blank,
    compile_tests,
    file_order,
    functions,
    hidden_tests,
    parse,
    splice,
)

KIT = Path(__file__).resolve().parent
CHILD = KIT / "grading_child.py"
SANDBOX = KIT / "sandbox.py"
FORMAT = 4  # of assignment.json
TIMEOUT_S = 300  # one run of one exercise's check; the original's takes about 10 s on 2 cores
VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")  # Gradescope's
SHOWN_FAILURES = 8  # per exercise, in the printed grade and in results.json
# As root, each submission runs as a uid of the kit's own, one submission a uid at a time: never
# a user's, and when it ends the kit kills whatever that uid still runs.
SANDBOX_UIDS = range(2_100_000_000, 2_100_000_064)


class Layout(NamedTuple):
    """An exercise's module and test file, from the repository's top, and the repository's files
    they import (path -> text), which a run holds as they are."""

    module: str = "compressive.py"
    tests: str = "test_compressive.py"
    support: Dict[str, str] = {}


COMPRESSIVE = Layout()


class Graded(NamedTuple):
    function: str
    sandbox: "StudentSandbox"


class Run(NamedTuple):
    tests: List[str]  # the tests collected, in order
    outcomes: Dict[str, str]  # node id -> passed | failed | skipped (the worst of its phases)
    messages: Dict[str, str]  # node id -> the first line of its failure
    problem: str  # "" when the run ended and its report is whole; else why it is worth nothing
    versions: Dict[str, str]  # torch and pytest in the run
    printed: str = ""  # what the student's code printed (capped: Printed)
    regrade: bool = False  # the problem is the machine's, not the submission's code


def workers() -> int:
    return len(os.sched_getaffinity(0))  # the cores this grader may use


def child_environment() -> Dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        env.pop(name, None)  # compressive is the run's own, and pytest runs as the kit says
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # no plugin of the machine's reorders or reseeds
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # one thread a run: runs go side by side, one per core, and a run's tiny models are no
    # faster on two threads (and much slower on a busy machine)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    return env


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


# ---------------------------------------------------------------- the sandbox ---------------------
# As root, one sandbox serves the grading, each submission's workers a uid of the kit's own
# (SANDBOX_UIDS); else each submission has a sandbox of its own. In bubblewrap where it runs;
# else (by name only) Python alone, and Confinement.note says so.


class Confinement(NamedTuple):
    bwrap: str  # bubblewrap's path; "" where it does not run
    note: str  # the one line that says what is missing ("" when nothing is)


INSIDE = "/sandbox"  # where a sandbox's folder appears in bubblewrap, read-only
TMP_BYTES = 64 << 20  # a submission's /tmp, in a tmpfs of the sandbox's own
AS_ROOT = os.geteuid() == 0

# What one process could leave in the kernel for the next of its uid (a key lives as long as the
# machine), or use to escape: the filter refuses them (EPERM), and new user namespaces (clone3,
# whose flags it cannot read, answers ENOSYS, and the C library then calls clone).
REFUSED_CALLS = """keyctl add_key request_key shmget msgget semget mq_open memfd_create socket
    ptrace process_vm_readv process_vm_writev""".split()
CLONE_NEWUSER = 0x10000000


@functools.lru_cache(maxsize=None)
def kernel_filter():
    """The sandbox's seccomp filter, by libseccomp (another architecture's calls kill)."""
    import pyseccomp as seccomp

    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for call in REFUSED_CALLS:
        rules.add_rule(seccomp.ERRNO(errno.EPERM), call)
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    new_user = seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    for call in ("unshare", "clone"):  # their first argument holds the flags
        rules.add_rule(seccomp.ERRNO(errno.EPERM), call, new_user)
    return rules


def filter_file():
    """The filter as BPF in a file of its own, for bubblewrap's --seccomp (its fd)."""
    bpf = tempfile.TemporaryFile()
    kernel_filter().export_bpf(bpf)
    bpf.seek(0)
    return bpf


def torch_folder() -> Path:
    """The site folder torch lies in, found without importing it (the grader never does)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise KitError("torch is not installed for this Python")
    return Path(spec.origin).resolve().parent.parent


def python_folders() -> List[str]:
    """The folders a Python with torch needs outside /usr: its prefixes, torch's site folder."""
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    folders |= {str(torch_folder()), str(Path(sys.executable).resolve().parent.parent)}
    kept = []
    for folder in sorted(folders, key=len):
        system = folder == "/usr" or folder.startswith("/usr/")
        if not system and not any(folder.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(folder)
    return kept


def sandbox_environment(count_processes: bool) -> Dict[str, str]:
    """All a sandbox's environment holds (KIT_COUNT_PROCESSES: sandbox.main says why)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp"}
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"  # tiny models: one thread is fastest
    if count_processes:
        env["KIT_COUNT_PROCESSES"] = "1"
    return env


def sandbox_command(bwrap: str, folder: str, argv: List[str], seccomp: int) -> list:
    """Python with argv in a sandbox on folder, all of it bubblewrap's options (README, "The
    sandbox"). As root, without a user namespace, its first process holding the capabilities
    to change uid and give a folder away alone; else in a user namespace of its own, none
    nested. Without bwrap, Python alone."""
    python = sys.executable  # a virtual environment's own (its pyvenv.cfg beside it)
    if not bwrap:
        return [python, *argv]
    if not AS_ROOT:
        args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
    else:
        args = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        for capability in ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN"):
            args += ["--cap-add", capability]
    args += ["--die-with-parent", "--new-session", "--clearenv", "--seccomp", str(seccomp)]
    for name, value in sandbox_environment(True).items():
        args += ["--setenv", name, value]
    # its own /tmp, root's (each submission's folder in it its own), before a Python under /tmp
    tmp_bytes = TMP_BYTES * (workers() if AS_ROOT else 1)  # as root, the submissions side by side
    args += ["--size", str(tmp_bytes), "--tmpfs", "/tmp", "--chmod", "0711", "/tmp"]
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # links into /usr, or not
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    made = {"/", "/tmp"}
    for path in python_folders():
        for above in reversed(Path(path).parents):  # readable by any uid, as they are not always
            if str(above) not in made:
                made.add(str(above))
                args += ["--perms", "0755", "--dir", str(above)]
        args += ["--ro-bind", path, path]
    args += ["--ro-bind", folder, INSIDE, "--chdir", INSIDE]
    args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    return [*args, "--", python, *argv]


def probe(bwrap: str, uid: Optional[int]) -> str:
    """Why a sandbox cannot start this way ("" when it can): torch's files seen from it as uid."""
    torch_init = torch_folder() / "torch" / "__init__.py"
    look = f"sys.exit(0 if os.path.isfile({str(torch_init)!r}) else 3)"
    if uid is not None and bwrap:  # a worker's uid taken
        look = f"os.setgroups([]); os.setgid({uid}); os.setuid({uid}); {look}"
    user = {"user": uid, "group": uid, "extra_groups": []} if uid and not bwrap else {}
    try:
        with tempfile.TemporaryDirectory(prefix="kit-probe-") as folder, filter_file() as bpf:
            os.chmod(folder, 0o755)
            argv = ["-I", "-c", f"import os, sys; {look}"]
            done = subprocess.run(
                sandbox_command(bwrap, folder, argv, bpf.fileno()),
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=60,
                pass_fds=(bpf.fileno(),),
                **user,
            )
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    if done.returncode == 3:
        return f"torch ({torch_init}) cannot be read there"
    lines = (done.stderr or done.stdout).strip().splitlines()
    return "" if done.returncode == 0 else (lines or [f"exit status {done.returncode}"])[-1]


@functools.lru_cache(maxsize=None)
def confinement() -> Confinement:
    """bubblewrap where it runs; else a uid of the kit's own (the grader is root, and that uid
    can run this Python: else a KitError) or the grader's own user, said in a line."""
    uid = SANDBOX_UIDS[0] if AS_ROOT else None
    bwrap = shutil.which("bwrap") or ""
    why = "bwrap is not installed (Debian and Ubuntu: apt-get install bubblewrap)"
    if bwrap:
        why = probe(bwrap, uid)
        if not why:
            return Confinement(bwrap, "")
        why = f"bwrap does not run here ({why})"
    cannot = probe("", uid) if AS_ROOT else ""
    if cannot:
        raise KitError(
            f"cannot grade here: {why}, and Python cannot run as an unprivileged user "
            f"({cannot}): install bubblewrap, or a Python that other users can read"
        )
    who = "a uid of its own, which can read what every user can"
    who = who if AS_ROOT else "this user and can read what it can"
    return Confinement("", f"no sandbox: {why}; student code runs as {who}")


STARTUP_S = 120  # for a sandbox's first process to import torch

SLOTS: "queue.Queue[int]" = queue.Queue()
for _uid in SANDBOX_UIDS:
    SLOTS.put(_uid)


class SandboxFailed(Exception):
    """The machine's failure, not the submission's: the sandbox did not start."""


class Worker(NamedTuple):
    """An exercise's worker: its test process's socket, its output, how it ended."""

    socket_fd: int
    output_fd: int
    status_fd: int


PRINTED_BYTES = 4000  # of a submission's output, kept for each exercise: the rest is counted


class Printed:
    def __init__(self):
        self.kept, self.seen = b"", 0

    def add(self, data: bytes) -> None:
        self.kept += data[: PRINTED_BYTES - len(self.kept)]
        self.seen += len(data)

    def text(self) -> str:
        text = self.kept.decode("utf-8", "replace")
        if self.seen > len(self.kept):
            text += f"\n[... {self.seen - len(self.kept)} more bytes of output not shown]"
        return text


class Box:
    """A sandbox (sandbox.py main) on a folder of its own: a copy of sandbox.py and the project
    files the module imports, none of the tests. As root one serves every submission (shared);
    else each submission starts its own."""

    lock = threading.Lock()
    running: Dict[tuple, "Box"] = {}
    # bubblewrap's --die-with-parent ends a sandbox when the thread that started it ends (the
    # kernel's parent-death signal follows a thread), so the shared one is started by a thread
    # that lives as long as the grader's process, never by the first submission's, which ends
    starters: Dict[int, ThreadPoolExecutor] = {}

    @classmethod
    def shared(cls, layout: Layout) -> "Box":
        key = (os.getpid(), tuple(sorted(layout.support.items())))
        with cls.lock:
            box = cls.running.get(key)
            if box is None or box.process.poll() is not None:
                starter = cls.starters.setdefault(os.getpid(), ThreadPoolExecutor(1))
                box = cls.running[key] = starter.submit(cls, layout).result()
                atexit.register(box.stop)
            return box

    def __init__(self, layout: Layout):
        self.lock, self.stopped = threading.Lock(), False
        bwrap = confinement().bwrap
        self.folder = folder = Path(tempfile.mkdtemp(prefix="kit-sandbox-"))
        for path, text in layout.support.items():
            if not PurePosixPath(path).name.startswith("test_"):
                write(folder / path, text)
        shutil.copyfile(SANDBOX, folder / SANDBOX.name)
        folder.chmod(0o755)  # the project's own, readable by the sandbox's uids
        base = INSIDE if bwrap else str(folder)
        # the submissions' temporary folders, emptied between exercises: in bubblewrap's /tmp,
        # else in this folder (not the machine's /tmp)
        tmp_folder = "/tmp" if bwrap else str(folder / "tmp")
        env = sandbox_environment(count_processes=bool(bwrap) or AS_ROOT)
        if not bwrap:
            os.mkdir(tmp_folder, 0o711)
            env["TMPDIR"] = env["HOME"] = tmp_folder
        self.control, theirs = socket.socketpair()
        argv = ["-I", "-B", f"{base}/{SANDBOX.name}", str(theirs.fileno()), tmp_folder, base]
        self.log = tempfile.TemporaryFile()
        # the filter: bubblewrap installs it; without it, libseccomp in the new process before
        # it runs Python (no thread of the grader runs there)
        with filter_file() as bpf:
            self.process = subprocess.Popen(
                sandbox_command(bwrap, str(folder), [*argv, str(torch_folder())], bpf.fileno()),
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self.log,
                stderr=self.log,
                pass_fds=(theirs.fileno(), *([bpf.fileno()] if bwrap else [])),
                start_new_session=True,  # its own process group, killed whole when it ends
                preexec_fn=None if bwrap else kernel_filter().load,
            )
        theirs.close()

    def request(self, op: str, uid: Optional[int], cgroup_fds: List[int] = ()) -> socket.socket:
        """A socket to the process started for op ("start": a submission's first process; "end":
        the one that ends every process of uid and empties its temporary folder)."""
        ours, theirs = socket.socketpair()
        with self.lock:
            try:
                message = json.dumps({"op": op, "uid": uid}).encode()
                socket.send_fds(self.control, [message], [theirs.fileno(), *cgroup_fds])
            except OSError:
                pass  # it has ended: the socket says so, closed
            finally:
                theirs.close()
        return ours

    def last_line(self) -> str:
        """The last line of its log (read without moving it: threads share a log)."""
        size = os.fstat(self.log.fileno()).st_size
        tail = os.pread(self.log.fileno(), 4000, max(0, size - 4000))
        lines = tail.decode("utf-8", "replace").strip().splitlines()
        return lines[-1][:300] if lines else ""

    def stop(self) -> None:
        """Its processes killed (its process group; bubblewrap's die with it), its files gone."""
        with self.lock:
            if self.stopped:
                return
            self.stopped = True
            self.control.close()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.log.close()
            shutil.rmtree(self.folder, ignore_errors=True)


class StudentSandbox:
    """Where one submission runs, from its first exercise to close(): a first process of its own
    in a Box (as root the shared one, and a uid of the kit's own), which starts a worker for each
    exercise in turn; the worker's socket goes to the exercise's test process, which sends it its
    module (spliced: exercise -> the original with only that function the student's). Once
    started: its first process's socket (control) and what it said once it could serve (word);
    as root, its uid, that uid's lock (claim) and its cgroup where the machine offers one."""

    def __init__(self, spliced: Dict[str, str], layout: Layout, timeout_s: float):
        self.spliced, self.layout, self.timeout_s = spliced, layout, timeout_s
        self.lock = threading.Lock()
        self.box = self.control = self.word = self.uid = self.uid_lock = self.cgroup = None

    def start(self) -> None:
        if AS_ROOT:
            self.uid, self.uid_lock = free_uid()
            self.cgroup = SubmissionCgroup.make(self.uid)
        self.box = Box.shared(self.layout) if AS_ROOT else Box(self.layout)
        fds = self.cgroup.procs_fds if self.cgroup else []
        self.control = self.box.request("start", self.uid, fds)

    def open(self) -> Worker:
        """A new worker for an exercise's test process; SandboxFailed where the sandbox did not
        start."""
        if self.box is None:
            self.start()
        with self.lock:
            if self.word is None:
                self.control.settimeout(STARTUP_S)
                try:
                    self.word = self.control.recv(16)
                except OSError:
                    self.word = b""
                self.control.settimeout(None)
            if self.word != b"started":
                why = self.box.last_line() or self.word[:20]
                raise SandboxFailed(f"the sandbox did not start ({why!r})")
            ours, theirs = socket.socketpair()
            for end in (ours, theirs):  # a step's parameters in one write, not many
                end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            output_r, output_w = os.pipe()
            status_r, status_w = os.pipe()
            try:
                job = json.dumps({"seconds": max(1, int(self.timeout_s))}).encode()
                socket.send_fds(self.control, [job], [theirs.fileno(), output_w, status_w])
            except OSError:
                pass  # it has ended: the worker's socket says so, closed
            finally:
                theirs.close()
                os.close(output_w)
                os.close(status_w)
            return Worker(ours.detach(), output_r, status_r)

    def close(self) -> None:
        """Every process of the submission ended (its first process ends the others once its
        socket closes, then itself); as root, every process of its uid, its uid and cgroup freed
        for the next; else its sandbox stopped."""
        with self.lock:
            if self.box is None:
                return
            box, self.box = self.box, None
            with contextlib.suppress(OSError):
                self.control.shutdown(socket.SHUT_WR)
            closed(self.control, 30)
            if not AS_ROOT:
                box.stop()
                return
            closed(box.request("end", self.uid), 60)
            gone_by = time.monotonic() + 30  # its processes killed, then reaped
            while uid_in_use(self.uid) and time.monotonic() < gone_by:
                time.sleep(0.05)
            if self.cgroup:
                self.cgroup.remove()
            os.close(self.uid_lock)
            SLOTS.put(self.uid)


def closed(end: socket.socket, timeout_s: float) -> None:
    """Once the other end of a socket has closed (timeout_s at most), this end closed too."""
    end.settimeout(timeout_s)
    with contextlib.suppress(OSError):
        while end.recv(1 << 16):
            pass
    end.close()


# ---------------------------------------------------------------- a submission's cgroup -----------
# As root, where the machine lets it, each submission's processes share a cgroup: SUBMISSION_MEMORY
# together (shared memory and tmpfs included) and one core's processor time, so that no number of
# busy processes slows a classmate more than one busy core does. cgroup v2's controllers where the
# grader's cgroup hands them to its children (the root of a cgroup namespace, or a delegated one,
# as systemd-run -p Delegate=yes makes); else cgroup v1's, where writable; else cgroup_note.
SUBMISSION_MEMORY = 4 << 30
CPU_PERIOD_US = 100_000
CGROUPS = Path("/sys/fs/cgroup")


def cgroup_folders() -> Dict[str, Tuple[str, Path]]:
    """{controller: (its cgroup version, the grader's own cgroup folder)} for memory and cpu
    where a submission's cgroup can be made below it (none where the grader is not root)."""
    own, found = {}, {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines() if AS_ROOT else ():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else ["v2"]:
                own[controller] = path.lstrip("/")
    if "v2" in own and (CGROUPS / "cgroup.controllers").is_file():
        control = CGROUPS / own["v2"] / "cgroup.subtree_control"
        with contextlib.suppress(OSError):  # the controllers handed to its children
            control.write_text("+memory +cpu")
        with contextlib.suppress(OSError):
            handed = control.read_text().split()
            found = {c: ("v2", control.parent) for c in ("memory", "cpu") if c in handed}
    for controller in ("memory", "cpu"):
        folder = CGROUPS / controller / own.get(controller, "")
        if controller in own and controller not in found and os.access(folder, os.W_OK):
            found[controller] = ("v1", folder)
    return found


def cgroup_note() -> str:
    """What a submission's cgroup does not bound here ("" when it bounds both)."""
    what = {
        "cpu": "its share of the processors not at all (its own processor time is its limit)",
        "memory": "its memory only per process (6 GB of address space, 32 processes)",
    }
    missing = [controller for controller in what if controller not in cgroup_folders()]
    if not missing:
        return ""
    return (
        f"no cgroup {' or '.join(missing)} controller for the kit here (v2 handed to the "
        f"grader's children, or v1 writable): a submission bounds "
        + " and ".join(what[m] for m in missing)
    )


class SubmissionCgroup(NamedTuple):
    folders: List[Path]
    procs_fds: List[int]  # each folder's cgroup.procs, open for writing: "0" moves the writer

    @classmethod
    def make(cls, uid: int) -> Optional["SubmissionCgroup"]:
        memory, period = str(SUBMISSION_MEMORY), str(CPU_PERIOD_US)
        limits = {  # the files to write (a swap limit where there is one)
            ("v1", "memory"): {
                "memory.limit_in_bytes": memory,
                "memory.memsw.limit_in_bytes": memory,
            },
            ("v1", "cpu"): {"cpu.cfs_period_us": period, "cpu.cfs_quota_us": period},
            ("v2", "memory"): {"memory.max": memory, "memory.swap.max": "0"},
            ("v2", "cpu"): {"cpu.max": f"{period} {period}"},
        }
        folders, fds = [], []
        for controller, (kind, parent) in cgroup_folders().items():
            folder = parent / f"kit-{os.getpid()}-{uid}"
            try:
                folder.mkdir(exist_ok=True)
                for name, value in limits[kind, controller].items():
                    with contextlib.suppress(OSError if "swap" in name else ()):
                        (folder / name).write_text(value)
                if folder not in folders:  # v2: one folder holds both controllers
                    fds.append(os.open(folder / "cgroup.procs", os.O_WRONLY))
                    folders.append(folder)
            except OSError:
                with contextlib.suppress(OSError):
                    folder.rmdir()
        return cls(folders, fds) if folders else None

    def oom_kills(self) -> int:
        for folder in self.folders:
            for name in ("memory.oom_control", "memory.events"):  # v1's, v2's
                with contextlib.suppress(OSError, ValueError):
                    counts = (folder / name).read_text().split()
                    return int(counts[counts.index("oom_kill") + 1])
        return 0

    def remove(self) -> None:
        for fd in self.procs_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for folder in self.folders:
            for _ in range(100):  # its last processes may still be leaving
                with contextlib.suppress(OSError):
                    folder.rmdir()
                    break
                time.sleep(0.05)


FREE_UID_WAIT_S = 120
# Graders side by side on one machine (two classes at once) draw from the same uids, in the same
# order: a lock file of each uid, held (flock) while a submission runs as it, keeps them apart.
UID_LOCKS = Path("/run/teachers_kit")


def free_uid() -> Tuple[int, int]:
    """(uid, its lock) of a uid of SLOTS of which nothing lives (uid_in_use) and no other grader
    holds the lock (claim), waited for FREE_UID_WAIT_S at most."""
    deadline = time.monotonic() + FREE_UID_WAIT_S
    while time.monotonic() < deadline:
        for _ in range(len(SANDBOX_UIDS)):
            uid = SLOTS.get()
            lock = claim(uid)
            if lock is not None and not uid_in_use(uid):
                return uid, lock
            if lock is not None:
                os.close(lock)
            SLOTS.put(uid)  # to the back, tried again later
        time.sleep(0.5)
    raise SandboxFailed("no uid of the kit's own is free of an earlier submission")


def claim(uid: int) -> Optional[int]:
    """The open lock file of uid, locked by this grader, or None where another grader holds it
    (the kernel drops the lock when its holder ends, however it ends)."""
    try:
        UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(UID_LOCKS / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as e:  # the submission is not graded, and is to be graded again
        raise SandboxFailed(f"the uids' locks cannot be kept in {UID_LOCKS} ({e})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def uid_in_use(uid: int) -> bool:
    """Whether a process of uid lives, or the kernel holds a key of its (/proc/key-users: the
    sandbox refuses keys, and this is the second line)."""
    with contextlib.suppress(OSError):
        with open("/proc/key-users") as keys:
            if any(line.split(":")[0].strip() == str(uid) for line in keys):
                return True
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}").st_uid == uid:
                return True
    return False


# ---------------------------------------------------------------- runs ----------------------------


class Zygote:
    """The process that forks test processes (grading_child.serve): started on first use, and
    again where the last has gone or the grader forked; none where it failed to start (a thread
    in it, its Python failed): runs then say so."""

    lock = threading.Lock()
    connection: Optional[socket.socket] = None
    owner = 0  # the process id that started it: a forked grader starts its own
    broken = False

    @classmethod
    def ensure(cls) -> bool:
        """Start it unless it runs; False when there is none to be had."""
        with cls.lock:
            if not cls.broken and (cls.connection is None or cls.owner != os.getpid()):
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                process = subprocess.Popen(
                    [sys.executable, str(CHILD), str(theirs.fileno())],
                    env=child_environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                )
                theirs.close()
                ours.settimeout(120)
                ready = b""
                with contextlib.suppress(OSError):
                    ready = ours.recv(16)
                ours.settimeout(None)
                cls.broken = ready != b"ready"
                if cls.broken:
                    ours.close()
                    process.kill()
                else:
                    cls.connection, cls.owner = ours, os.getpid()
                    atexit.register(ours.close)  # its recv then ends, and so does it
            return not cls.broken

    @classmethod
    def send(cls, job: dict, fds: List[int]) -> bool:
        """Ask for a run (of a new zygote, where the last has gone); False when there is none."""
        for _ in range(2):
            if not cls.ensure():
                return False
            with cls.lock:
                try:
                    socket.send_fds(cls.connection, [json.dumps(job).encode()], fds)
                    return True
                except OSError:
                    cls.connection = None
        return False


# A graded run waits GRACE_S past its processor time for a worker that does not compute: one
# that has neither finished nor used that time by then waited or was kept from the processor
# (regrade). One that computes may go on (Sandbox.due), at most COMPUTING_FACTOR times it and a
# minute.
GRACE_S = 45
COMPUTING_FACTOR = 3


def run_tests(
    compressive: str,
    tests: str,
    selected: Optional[List[str]] = None,
    names: Optional[List[str]] = None,
    leave_out: Optional[List[str]] = None,
    layout: Layout = COMPRESSIVE,
    graded: Optional[Graded] = None,
    wrong: Optional[Tuple[str, str]] = None,
    timeout_s=TIMEOUT_S,
) -> Run:
    """Run tests (a test file's text) on compressive (the text of layout's module) in a fresh
    process and folder: selected node ids, or names of test functions (neither: every test),
    less leave_out; graded: the function whose calls go to the sandbox, for timeout_s of
    processor time; wrong: (function, kind), the original's function made wrong."""
    # beyond_the_paper/feedback.py -> beyond_the_paper.feedback
    module = str(PurePosixPath(layout.module).with_suffix("")).replace("/", ".")
    control = {"tests": selected, "names": names, "leave_out": leave_out or []}
    control.update(test_file=layout.tests, timeout_s=timeout_s + GRACE_S)
    if wrong:  # grading_child.WrongBody
        control["wrong"] = {"module": module, "function": wrong[0], "kind": wrong[1]}
    worker, box = None, graded.sandbox if graded else None
    # the sandbox started first: the watch (how the test process tells whether the submission
    # computes, and the last it waits for it) names its uid or its process
    if graded:
        try:
            worker = box.open()
        except SandboxFailed as e:
            return Run([], {}, {}, str(e), {}, regrade=True)
        watch = {"uid": box.uid} if AS_ROOT else {"pid": box.box.process.pid}
        watch["hard_s"] = COMPUTING_FACTOR * timeout_s + 60
        source = box.spliced[graded.function]
        control["graded"] = dict(
            function=graded.function, module=module, source=source, watch=watch
        )
    printed = Printed()
    limit_s = COMPUTING_FACTOR * timeout_s + 75  # the run stops its worker before, itself
    try:
        with tempfile.TemporaryDirectory(prefix="kit-run-") as folder:
            folder = Path(folder)
            files = {**layout.support, layout.module: compressive, layout.tests: tests}
            # this folder is pytest's rootdir, and the top the tests import the modules from
            files["pytest.ini"] = "[pytest]\npythonpath = .\n"
            for path, text in files.items():
                write(folder / path, text)
            (folder / "tmp").mkdir()  # the run's own temporary folder (TMPDIR), private
            record, output, timed_out = start_and_read(folder, control, limit_s, worker, printed)
        ended = ended_how(worker, record) if worker else None
    finally:
        for fd in worker or ():
            with contextlib.suppress(OSError):
                os.close(fd)
    run = read_record(record, selected, output, timeout_s)
    if timed_out:
        problem = f"the test process did not end within {limit_s:g} s"
        run = run._replace(problem=problem, regrade=True)
    elif ended:
        run = judged_end(run, ended, timeout_s, bool(box.cgroup and box.cgroup.oom_kills()))
    return run._replace(printed=printed.text())


def ended_how(worker: Worker, record: Optional[dict]) -> Optional[Tuple[int, float]]:
    """(wait status, processor time) of a worker that ended before its test process did; None
    when it served to the end, or its sandbox never said."""
    if record is not None and not record.get("worker_ended") and not record.get("problem"):
        return None
    ready = select.select([worker.status_fd], [], [], 5)[0]
    words = os.read(worker.status_fd, 100).decode("ascii", "replace").split() if ready else []
    with contextlib.suppress(ValueError):
        if len(words) == 3 and words[0] == "ended":
            return int(words[1]), float(words[2])
    return None


def judged_end(run: Run, ended: Tuple[int, float], timeout_s: float, own_oom: bool) -> Run:
    """A worker that ended early: at its processor time or its cgroup's memory (own_oom), a 0;
    killed by anything else, regrade; by its own code (an exit, a crash), the failures stand."""
    status, cpu_s = ended
    signalled = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    # the kernel's SIGXCPU at the limit, or its SIGKILL a second later where that was caught
    if signalled == signal.SIGXCPU or (signalled == signal.SIGKILL and cpu_s >= timeout_s - 1):
        problem = f"it used up its {timeout_s:g} s of processor time (an endless loop?)"
        return run._replace(problem=problem, regrade=False)
    if signalled == signal.SIGKILL and own_oom:
        problem = f"it used more than its {SUBMISSION_MEMORY >> 30} GB of memory"
        return run._replace(problem=problem, regrade=False)
    if signalled == signal.SIGKILL:
        problem = "its process was killed by something other than its own limits"
        return run._replace(problem=problem, regrade=True)
    return run


def start_and_read(folder: Path, control: dict, limit_s: float, worker, printed: Printed):
    """The test process on folder, forked by the zygote: its record, its output's last 16 KB,
    whether it was killed at limit_s. What the worker prints goes to printed as it comes and
    after, never waited for (a process it left may hold its pipe)."""
    report_fd, report_w = os.pipe()
    with tempfile.TemporaryFile() as output:  # the test process's stdout and stderr
        try:
            job = {"folder": str(folder), "control": control}
            fds = [report_w, output.fileno(), *([worker.socket_fd] if worker else [])]
            started = Zygote.send(job, fds)
        finally:
            os.close(report_w)
        selector = selectors.DefaultSelector()
        selector.register(report_fd, selectors.EVENT_READ)
        if worker:
            os.set_blocking(worker.output_fd, False)
            selector.register(worker.output_fd, selectors.EVENT_READ)
        report, deadline = b"", time.monotonic() + limit_s
        try:
            while report_fd in selector.get_map() and time.monotonic() < deadline:
                for key, _ in selector.select(deadline - time.monotonic()):
                    data = read_some(key.fd)
                    if data == b"":
                        selector.unregister(key.fd)
                    elif key.fd == report_fd:
                        report += data
                    elif data:
                        printed.add(data)
            timed_out = report_fd in selector.get_map()
            for _ in range(64) if worker and worker.output_fd in selector.get_map() else ():
                data = read_some(worker.output_fd)
                if not data:
                    break
                printed.add(data)
        finally:
            selector.close()
            os.close(report_fd)
        output.seek(max(0, output.seek(0, os.SEEK_END) - (1 << 14)))
        tail = output.read()
    if not started:
        tail = b"no test process started: the process that forks them did not start"
    pid, _, record = report.partition(b"\n")
    if timed_out and pid.strip().isdigit():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pid), signal.SIGKILL)
    with contextlib.suppress(ValueError):
        return json.loads(record) if record else None, tail, timed_out
    return None, tail, timed_out


def read_some(fd: int) -> Optional[bytes]:
    """What fd holds now (b"" at its end; None where a non-blocking one holds nothing yet)."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None


def read_record(
    record: Optional[dict], selected: Optional[List[str]], output: bytes, timeout_s
) -> Run:
    """A run's outcomes from its record, and why it is worth nothing, if it is."""
    if record is None:
        tail = output.decode("utf-8", "replace").strip().splitlines()
        last = f"; its last output: {tail[-1][:200]}" if tail else ""
        problem = f"the test process ended without its report{last}"
        return Run([], {}, {}, problem, {}, regrade=True)
    versions = record.get("versions", {})
    if record["problem"]:  # the worker neither answered nor used its time: it was kept from it
        problem = (
            f"it neither finished nor used its {timeout_s:g} s of processor time within "
            f"{timeout_s + GRACE_S:g} s, and was not computing (its code waited, or the "
            "machine was busy)"
        )
        return Run(record["collected"] or [], {}, {}, problem, versions, regrade=True)
    tests, outcomes, messages = record["collected"] or [], record["outcomes"], record["messages"]
    collect_error = record["collect_error"]
    if selected is not None:
        for test in selected:
            if test not in outcomes:
                outcomes[test] = "failed"
                messages[test] = collect_error or "this test does not exist in the test file"
        tests = list(selected)
    elif collect_error:
        return Run(tests, outcomes, messages, f"the tests do not collect: {collect_error}", {})
    return Run(tests, outcomes, messages, "", versions)


def run_many(jobs: List[tuple]) -> List[Run]:
    """run_tests on each job (its arguments, in order), side by side, one per core."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), workers()))) as pool:
        return list(pool.map(lambda job: run_tests(*job), jobs))


def failing(run: Run, tests: List[str]) -> List[str]:
    return [t for t in tests if run.outcomes.get(t) != "passed"]


# ---------------------------------------------------------------- checks --------------------------


def compute_checks(
    reference: str,
    tests: str,
    names: List[str],
    only: Optional[List[str]] = None,
    leave_out: Optional[List[str]] = None,
    layout: Layout = COMPRESSIVE,
) -> Tuple[Dict[str, List[str]], Dict[str, str]]:
    """Each exercise's check (the tests, of only if given, less leave_out, that fail with its
    function alone blanked) and the versions that ran them."""
    tree = parse(reference, "the original")
    sources = [reference] + [blank(reference, tree, [name]) for name in names]
    original, *blanked = run_many(
        [(text, tests, None, only, leave_out, layout) for text in sources]
    )
    if original.problem or not original.tests:
        raise KitError(f"the tests do not run on the original: {original.problem or 'no test'}")
    failed = failing(original, original.tests)
    if failed:
        failed_names = " ".join(sorted({base_name(t) for t in failed}))
        raise KitError(
            f"{len(failed)} tests fail on the original on this machine, so no check can be "
            f"computed: {failed_names} (the first says: "
            f"{original.messages.get(failed[0], '')[:200]}); leave them out of the assignment "
            f"with --leave-out {failed_names}"
        )
    checks = {}
    for name, run in zip(names, blanked):
        if run.problem:  # a function that runs when compressive.py is imported, say
            raise KitError(f"with {name} blanked, the tests do not run: {run.problem}")
        checks[name] = failing(run, original.tests)
        if not checks[name]:
            raise KitError(f"no test fails with {name} blanked: it would have no check")
    return checks, original.versions


WRONG_BODIES = ("zeros", "perturbed", "inputs")  # grading_child.WrongBody's


def base_name(node_id: str) -> str:
    """test_compressive.py::test_x[param] -> test_x"""
    return node_id.split("::")[-1].split("[")[0]


def short(node_id: str) -> str:
    return node_id.split("::", 1)[-1]


# ---------------------------------------------------------------- the assignment ------------------


class Check(NamedTuple):
    name: str  # the exercise, as the kit's table writes it
    points: float
    tests: List[str]  # its check, in file order
    hidden: List[str]  # those of its tests that the student's copy of the tests leaves out
    unsandboxed: List[str] = []  # left out: they fail with the original's function in the sandbox
    measured: List[str] = []  # those every wrong body fails: what partial credit counts


class Assignment(NamedTuple):
    folder: Path
    reference: str  # the original module (compressive.py, say): the solution
    tests: str  # the teacher's test file of it: every test, the hidden ones too
    exercises: List[Check]
    partial: bool  # proportional credit, not all or nothing
    hidden_visibility: str
    timeout_s: float
    versions: Dict[str, str]
    left_out: Dict[str, List[str]] = {}  # why -> the test functions no exercise is graded with
    layout: Layout = COMPRESSIVE


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def make_assignment(
    folder: Path,
    reference: str,
    tests: str,
    names: List[str],
    points: Dict[str, float],
    partial: bool = False,
    hidden_visibility: str = "after_published",
    only: Optional[List[str]] = None,
    leave_out: Optional[List[str]] = None,
    layout: Layout = COMPRESSIVE,
) -> Assignment:
    """Compute each exercise's check and write the teacher's folder: the original, every test,
    assignment.json."""
    names = file_order(names, parse(reference, "the original"))
    for name in names:
        try:
            audit.audit(reference, reference, [name])
        except audit.Refusal as refusal:
            why = f"{name} cannot be graded: the audit refuses its original ({refusal})"
            raise KitError(why) from None
    known_tests = {n.name for n in ast.parse(tests).body if isinstance(n, ast.FunctionDef)}
    unknown = sorted(set(leave_out or []) - known_tests)
    if unknown:
        raise KitError(f"--leave-out names no test of the file: {', '.join(unknown)}")
    left_out = {"torch.compile": compile_tests(tests), "by the teacher": sorted(leave_out or [])}
    all_left_out = left_out["torch.compile"] + left_out["by the teacher"]
    checks, versions = compute_checks(reference, tests, names, only, all_left_out, layout)
    # out of each check, the tests that fail with the original's own function in the sandbox
    boxes = {n: StudentSandbox({n: reference}, layout, TIMEOUT_S) for n in names}
    try:
        runs = run_many(
            [(reference, tests, checks[n], None, None, layout, Graded(n, boxes[n])) for n in names]
        )
    finally:
        for box in boxes.values():
            box.close()
    unsandboxed = {}
    for name, run in zip(names, runs):
        if run.problem:
            raise KitError(f"{name} cannot be graded here: in the sandbox, {run.problem}")
        unsandboxed[name] = failing(run, checks[name])
        checks[name] = [t for t in checks[name] if t not in unsandboxed[name]]
        if not checks[name]:
            raise KitError(f"no test of {name}'s check passes with its function in the sandbox")
    # what partial credit counts: the tests of each check that every wrong body fails
    jobs = [(name, kind) for name in names for kind in WRONG_BODIES]
    runs = run_many(
        [(reference, tests, checks[n], None, None, layout, None, (n, kind)) for n, kind in jobs]
    )
    measured = dict(checks)
    for (name, _), run in zip(jobs, runs):
        if not run.problem:  # a wrong body that stops the tests says nothing of them
            measured[name] = failing(run, measured[name])
    hidden = set(hidden_tests(tests))
    exercises = [
        Check(
            n,
            float(points.get(n, 1.0)),
            checks[n],
            [t for t in checks[n] if base_name(t) in hidden],
            unsandboxed[n],
            measured[n],
        )
        for n in names
    ]
    files = {layout.module: reference, layout.tests: tests, **layout.support}
    for path, text in files.items():
        write(folder / path, text)
    record = {
        "format": FORMAT,
        "exercises": [c._asdict() for c in exercises],
        "partial": partial,
        "hidden_visibility": hidden_visibility,
        "timeout_s": TIMEOUT_S,
        "versions": versions,
        "left_out": left_out,
        "module": layout.module,
        "tests": layout.tests,
        "sha256": {path: digest(text) for path, text in files.items()},  # its files, all of them
    }
    write(folder / "assignment.json", json.dumps(record, indent=1) + "\n")
    return load_assignment(folder)


def load_assignment(folder: Path) -> Assignment:
    """The assignment in folder (the handout's teacher/ folder, or the folder above it)."""
    if not (folder / "assignment.json").is_file() and (folder / "teacher").is_dir():
        folder = folder / "teacher"
    if not (folder / "assignment.json").is_file():
        raise KitError(
            f"{folder} holds no assignment.json: name the folder the handout command wrote "
            f"(python -m teachers_kit.handout EXERCISES --out FOLDER)"
        )
    try:
        record = json.loads((folder / "assignment.json").read_text(encoding="utf-8"))
        if record.get("format") != FORMAT:
            raise KitError(f"{folder} is of format {record.get('format')}, this kit reads {FORMAT}")
        module, tests = record["module"], record["tests"]
        files = {path: (folder / path).read_text(encoding="utf-8") for path in record["sha256"]}
        support = {path: text for path, text in files.items() if path not in (module, tests)}
        fields = ("partial", "hidden_visibility", "timeout_s", "versions", "left_out")
        assignment = Assignment(
            folder,
            files[module],
            files[tests],
            [Check(**exercise) for exercise in record["exercises"]],
            **{field: record[field] for field in fields},
            layout=Layout(module, tests, support),
        )
        known = functions(parse(assignment.reference, f"{folder / module}"))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise KitError(f"{folder} is not an assignment the kit can read: {e}") from None
    if record["sha256"] != {path: digest(text) for path, text in files.items()}:
        raise KitError(
            f"{folder}'s {module}, {tests} or a file they import changed after its checks were "
            f"computed: make the assignment again"
        )
    bad = [
        c.name for c in assignment.exercises if c.name not in known or not c.tests or c.points < 0
    ]
    if bad or assignment.hidden_visibility not in VISIBILITIES or not assignment.exercises:
        raise KitError(f"{folder} is not a valid assignment ({', '.join(bad) or 'its visibility'})")
    return assignment


def check_torch(assignment: Assignment) -> None:
    """A KitError unless this Python's torch is the assignment's (a tag such as +cpu aside)."""
    wanted = assignment.versions.get("torch", "").split("+")[0]
    try:
        here = version("torch").split("+")[0]
    except PackageNotFoundError:
        here = "none"
    if wanted and here != wanted:
        raise KitError(
            f"the assignment's checks were computed with torch {wanted}, and this Python "
            f"({sys.executable}) has torch {here}: grade with torch {wanted}, or make the "
            f"assignment again with this one"
        )


# ---------------------------------------------------------------- grading -------------------------


class Grade(NamedTuple):
    name: str
    points: float
    score: float
    tests: List[str]  # its check
    hidden: List[str]
    failures: List[Tuple[str, str]]  # (node id, the first line of why), in file order
    problem: str  # why the whole run is worth nothing ("" if it is not)
    refused: str = ""  # the audit's one line on this exercise alone ("" if it ran)
    regrade: bool = False  # not graded for the machine's fault: grade it again, it is no 0
    printed: str = ""  # what its code printed, capped (never graded)


class Grading(NamedTuple):
    submission: str  # the path graded, as given
    grades: List[Grade]
    refused: str  # the audit's one line on the whole file ("" if the file was accepted)
    partial: bool
    seconds: float

    @property
    def score(self) -> float:
        return sum(g.score for g in self.grades)

    @property
    def max_score(self) -> float:
        return sum(g.points for g in self.grades)


def read_submission(path: Path, name: str = "compressive.py") -> str:
    """The text of the file to grade: path, or the one named name in the folder path (at its
    top, or the only one below, as Gradescope unpacks). A regular file only: a link, a device,
    a pipe is refused, never opened."""
    file = path
    if path.is_dir() and not path.is_symlink():
        found = [
            Path(folder) / name
            for folder, subfolders, files in sorted(os.walk(path))  # links to folders: not walked
            if name in files
        ]
        found = [f for f in found if f.parent == path] or found
        if len(found) != 1:
            many = f"{len(found)} files named" if found else "no"
            raise audit.Refusal(f"the submission {path} holds {many} {name}")
        file = found[0]
    if file.is_symlink():
        raise audit.Refusal(f"{file} is a symbolic link: submit the file itself")
    try:
        # O_NOFOLLOW: a link put in place after the check above is refused all the same;
        # O_NONBLOCK: a pipe does not hang the grader (fstat refuses it next)
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise audit.Refusal(f"{file} cannot be opened as a file: {e.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise audit.Refusal(f"{file} is not a regular file")
        if info.st_nlink != 1:
            raise audit.Refusal(f"{file} is a hard link to another file: submit a copy")
        data = handle.read(audit.MAX_BYTES + 1)
    try:
        return data.decode("utf-8-sig")  # a byte order mark (Notepad's) is no part of the text
    except UnicodeDecodeError:
        raise audit.Refusal("it is not UTF-8 text") from None


class Prepared(NamedTuple):
    refused: str  # why the whole file is refused ("" if it is not)
    refusals: Dict[str, str]  # exercise -> why it alone is refused
    spliced: Dict[str, str]  # exercise -> the original with the student's function put in


# Python 3.11's ast is not safe in two threads at once ("SystemError: AST constructor recursion
# depth mismatch"): submissions are read, audited and spliced one at a time
PARSING = threading.Lock()


def prepare(submission: Path, assignment: Assignment, audited: bool = True) -> Prepared:
    """A submission read, audited (unless --no-audit) and each accepted exercise spliced."""
    names = [c.name for c in assignment.exercises]
    with PARSING:
        try:
            text = read_submission(submission, PurePosixPath(assignment.layout.module).name)
            if audited:
                refusals = audit.audit_each(text, assignment.reference, names)
            else:
                found = functions(parse(text, "the submission"))
                refusals = {n: f"it has no function {n}" for n in names if n not in found}
        except (KitError, audit.Refusal) as e:
            return Prepared(str(e), {}, {})
        spliced = {}
        for name in names:
            if name not in refusals:
                try:
                    spliced[name] = splice(assignment.reference, text, name)
                except KitError as e:
                    refusals[name] = str(e)
    return Prepared("", refusals, spliced)


def run_submission(prepared: Prepared, assignment: Assignment, timeout_s: float) -> Dict[str, Run]:
    """Each exercise of a submission run, one at a time, in the submission's sandbox."""
    box = StudentSandbox(prepared.spliced, assignment.layout, timeout_s)
    try:
        if prepared.spliced:  # the sandbox imports torch while the test processes' zygote does
            try:
                box.start()
            except SandboxFailed as e:
                return dict.fromkeys(prepared.spliced, Run([], {}, {}, str(e), {}, regrade=True))
            Zygote.ensure()
        return {
            c.name: run_tests(
                assignment.reference,
                assignment.tests,
                c.tests,
                layout=assignment.layout,
                graded=Graded(c.name, box),
                timeout_s=timeout_s,
            )
            for c in assignment.exercises
            if c.name in prepared.spliced
        }
    finally:
        box.close()


def score(check: Check, run: Run, partial: bool) -> Grade:
    """All of an exercise's points when its whole check passes; none when its run is worth
    nothing. partial: none when a measuring test fails (the values are wrong), else the share
    of its tests that pass; where no test measures, all or nothing."""
    failed = failing(run, check.tests)
    if run.problem:
        points = 0.0
    elif partial and failed and check.measured and not set(failed) & set(check.measured):
        points = check.points * (len(check.tests) - len(failed)) / len(check.tests)
    else:
        points = 0.0 if failed else check.points
    failures = [(t, run.messages.get(t, "")) for t in failed]
    return Grade(
        check.name,
        check.points,
        round(points, 4),
        check.tests,
        check.hidden,
        failures,
        run.problem,
        regrade=run.regrade,
        printed=run.printed,
    )


def grade_class(
    submissions: Dict[str, Path],
    assignment: Assignment,
    partial: Optional[bool] = None,
    timeout_s: Optional[float] = None,
    graded=lambda student, grading: None,
    audited: bool = True,
) -> Dict[str, Grading]:
    """Each student's submission (student -> path) graded, side by side, one per core: each
    exercise alone, its refusal or its run; graded(student, grading) as each one ends."""
    partial = assignment.partial if partial is None else partial

    def graded_alone(path: Path) -> Grading:
        began = time.monotonic()
        ready = prepare(path, assignment, audited)
        runs = run_submission(ready, assignment, timeout_s or assignment.timeout_s)
        grades = []
        for c in assignment.exercises:
            why = ready.refusals.get(c.name, ready.refused)
            refused = Grade(c.name, c.points, 0.0, c.tests, c.hidden, [], "", why)
            grades.append(score(c, runs[c.name], partial) if c.name in runs else refused)
        return Grading(str(path), grades, ready.refused, partial, time.monotonic() - began)

    gradings = {}
    with ThreadPoolExecutor(max_workers=workers()) as pool:
        futures = {pool.submit(graded_alone, path): who for who, path in submissions.items()}
        for future in as_completed(futures):
            gradings[futures[future]] = future.result()
            graded(futures[future], gradings[futures[future]])
    return {student: gradings[student] for student in submissions}


def grade(
    submission: Path,
    assignment: Assignment,
    partial: Optional[bool] = None,
    timeout_s: Optional[float] = None,
    audited: bool = True,
) -> Grading:
    """A student's file graded, as grade_class grades a class of one."""
    return grade_class({"": submission}, assignment, partial, timeout_s, audited=audited)[""]


def failed_most(gradings: List[Grading]) -> List[Tuple[str, int]]:
    """Each test that failed for some student, with how many, most first (runs worth nothing
    left out)."""
    counts = collections.Counter()  # a test counts once a student, whichever checks hold it
    for grading in gradings:
        counts.update({t for g in grading.grades if not g.problem for t, _ in g.failures})
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


# ---------------------------------------------------------------- reporting -----------------------


def audit_line(why: str, whole: bool = True) -> str:
    graded = "nothing of the file was graded" if whole else "the other exercises were graded"
    return f"refused: {why} ({graded})"


def why_not_graded(grade: Grade) -> str:
    """Its own code's doing (it scores 0), or the machine's (to grade again: it is no 0)."""
    return f"{'regrade: ' if grade.regrade else ''}{grade.problem}"


def summary(grade: Grade) -> str:
    """An exercise's verdict in one line: refused, not graded, not written, passed or failed."""
    hidden = f", {len(grade.hidden)} of them hidden" if grade.hidden else ""
    if grade.refused:
        return audit_line(grade.refused, whole=False)
    if grade.problem:
        return f"not graded: {why_not_graded(grade)}"
    if not grade.failures:
        return f"passed its {len(grade.tests)} tests{hidden}"
    unwritten = all(m.startswith("NotImplementedError") for _, m in grade.failures)
    if unwritten and len(grade.failures) == len(grade.tests):
        return "not written yet (it raises NotImplementedError)"
    return f"failed {len(grade.failures)} of its {len(grade.tests)} tests{hidden}"


def failure_lines(grade: Grade, hidden: bool) -> List[str]:
    """The failing tests (the hidden ones, or the others) with the first line of why, those
    that share it on one line; none where the run is worth nothing."""
    reasons: Dict[str, List[str]] = {}
    for test, message in [] if grade.problem else grade.failures:
        if (test in grade.hidden) == hidden:
            reasons.setdefault(message, []).append(short(test))
    # a test's own words first ("AssertionError: mem should hold ..."), then bare assertions and
    # errors raised on the way (a shape error deep in the model), each in file order
    worded = [m for m in reasons if m.startswith("AssertionError: ") and "assert " not in m[:24]]
    lines = []
    for message in (worded + [m for m in reasons if m not in worded])[:SHOWN_FAILURES]:
        tests = reasons[message]
        more = f" and {len(tests) - 2} more" if len(tests) > 3 else ""
        lines.append(f"{', '.join(tests[:2] if more else tests)}{more}: {message}")
    if len(reasons) > SHOWN_FAILURES:
        lines.append(f"... and {len(reasons) - SHOWN_FAILURES} more reasons")
    return lines


def shown(text: str) -> str:
    """text with every control character but a line feed and a tab escaped (ESC as \\x1b): what
    a submission printed or raised moves no cursor and rewrites no line of the grade."""
    return "".join(c if c in "\n\t" or c.isprintable() else ascii(c)[1:-1] for c in text)


def report(grading: Grading) -> str:
    """The grade as --grade prints it and a student's feedback file holds it."""
    lines = [f"{grading.submission}: {audit_line(grading.refused)}"] if grading.refused else []
    width = max(len(g.name) for g in grading.grades)
    for g in grading.grades:
        verdict = "refused" if grading.refused else summary(g)
        score = "regrade" if g.regrade else f"{g.score:g}"
        lines.append(f"{g.name:<{width}}  {score}/{g.points:g}  {verdict}")
        if not verdict.startswith("not written"):
            lines += [f"    {line}" for line in failure_lines(g, hidden=False)]
            lines += [f"    (hidden) {line}" for line in failure_lines(g, hidden=True)]
        if g.printed:
            lines += ["    what it printed (not graded):", textwrap.indent(g.printed, "      ")]
    lines.append(f"total {grading.score:g}/{grading.max_score:g} ({grading.seconds:.0f} s)")
    return shown("\n".join(lines))


def results_json(grading: Grading, assignment: Assignment) -> dict:
    """Gradescope's results.json: one scored entry per exercise, and for one with hidden tests
    an entry without points naming those that failed, shown as hidden_visibility says."""

    def entry(name, score, points, passed, output, visibility="visible"):
        status = "passed" if passed else "failed"
        return {
            "name": name,
            "score": score,
            "max_score": points,
            "status": status,
            "output": shown(output),
            "visibility": visibility,
        }

    scored, hidden = [], []
    for g in grading.grades:
        lines = [audit_line(grading.refused) if grading.refused else summary(g)]
        lines += failure_lines(g, hidden=False)
        failed_hidden = failure_lines(g, hidden=True)
        if failed_hidden:
            lines.append(f"and {sum(t in g.hidden for t, _ in g.failures)} hidden tests failed")
        if g.printed:
            lines.append(f"\nWhat your function printed (it counts for nothing):\n{g.printed}")
        scored.append(entry(g.name, g.score, g.points, g.score == g.points, "\n".join(lines)))
        if g.hidden and not (grading.refused or g.refused or g.problem):
            output = "\n".join(failed_hidden) or f"all {len(g.hidden)} hidden tests passed"
            visibility = assignment.hidden_visibility
            hidden.append(
                entry(f"{g.name}: hidden tests", 0.0, 0.0, not failed_hidden, output, visibility)
            )
    credit = "partial credit for right values" if grading.partial else "all or nothing"
    intro = (
        "Each exercise is graded alone: the original compressive.py with only your function put "
        f"in, against the teacher's tests ({credit})."
    )
    return {
        "score": round(grading.score, 4),
        "execution_time": round(grading.seconds),
        "output": shown(audit_line(grading.refused)) if grading.refused else intro,
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": scored + hidden,
    }
