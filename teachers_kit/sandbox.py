"""Where a student's function runs, and the only place it runs: a worker in a sandbox, which
computes values and decides nothing (teachers_kit/README.md, "What a grade rests on").

    python sandbox.py CONTROL_FD TMP FOLDER [PATH ...]     a sandbox's first process

The sandbox's first process forks each submission's first process, which forks a worker for
each exercise in turn. The test process (grading_child.py) puts a proxy in place of the
exercise's function (install), whose calls go to the worker (Sandbox). The way in is trusted, a
pickle; the way out is one safetensors file a reply, its structure as JSON in a tensor of its
own, every field checked before a value is made of it: nothing a sandbox sends is unpickled.
"""

import builtins
import contextlib
import copyreg
import ctypes
import functools
import gc
import importlib
import importlib.util
import inspect
import io
import json
import math
import os
import pickle
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections import OrderedDict
from typing import Dict, List, NamedTuple, Optional

import safetensors.torch
import torch
from torch import nn

DTYPES = {
    name: getattr(torch, name)
    for name in """bool uint8 int8 int16 int32 int64 float16 bfloat16 float32 float64 complex64
    complex128""".split()
}
MAX_BYTES = 64 << 20  # a message, either way
MAX_ELEMENTS = 1 << 24  # a tensor the test process builds, an expanded view's included
MAX_DIMS = 16
MAX_DEPTH = 16  # of tuples, lists and dicts nested in a value returned
MAX_TEXT = 2000  # characters of a string returned or of an exception's message
# The exceptions that cross as themselves (another as the first of these it derives from)
EXCEPTIONS = {
    name: getattr(builtins, name)
    for name in """ArithmeticError AssertionError AttributeError IndexError KeyError LookupError
    NotImplementedError OverflowError RuntimeError StopIteration TypeError ValueError
    ZeroDivisionError""".split()
}
# Each process's limits (importing torch takes about 1.5 GB of address space); each worker's
# processor time is its run's timeout.
ADDRESS_SPACE = 6 << 30
PROCESSES = 32
FILE_SIZE = 16 << 20

WORKER_ENDED = "the sandbox's process ended"


class Refused(Exception):
    """A message that the protocol does not allow."""


def name_of(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------- messages ------------------------
# A message is its length, then its bytes.


def send(fd: int, data: bytes) -> None:
    view = memoryview(struct.pack(">Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def receive(fd: int, deadline=None) -> bytes:
    """The next message; EOFError when the other side has gone, TimeoutError past deadline (None,
    or a function that gives the time it is due by, which may move on), Refused if too large."""
    (length,) = struct.unpack(">Q", read_exactly(fd, 8, deadline))
    if length > MAX_BYTES:
        raise Refused(f"a message of {length} bytes (at most {MAX_BYTES})")
    return read_exactly(fd, length, deadline)


def read_exactly(fd: int, n: int, deadline) -> bytes:
    parts = []
    while n:
        while deadline is not None and not select.select([fd], [], [], wait(deadline))[0]:
            if deadline() <= time.monotonic():
                raise TimeoutError
        data = os.read(fd, min(n, 1 << 20))
        if not data:
            raise EOFError
        parts.append(data)
        n -= len(data)
    return b"".join(parts)


def wait(deadline) -> float:
    return max(0.0, min(deadline() - time.monotonic(), 10.0))


def reply_bytes(reply: dict, tensors: Dict[str, torch.Tensor]) -> bytes:
    return safetensors.torch.save({**tensors, "header": bytes_tensor(json.dumps(reply).encode())})


def read_reply(data: bytes):
    """(reply, tensors) of a reply's bytes; Refused when they are no such file."""
    try:
        tensors = safetensors.torch.load(data)
        reply = json.loads(tensors.pop("header").numpy().tobytes())
    except Exception:  # whatever safetensors or JSON refuse
        reply = None
    if type(reply) is not dict:
        raise Refused("a message that is no safetensors file with its reply")
    return reply, tensors


def bytes_tensor(data: bytes) -> torch.Tensor:
    """A uint8 tensor over a copy of data."""
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def extent(shape, stride) -> int:
    """The elements a layout reaches from its first (0 when it holds none)."""
    return 0 if 0 in shape else 1 + sum((size - 1) * step for size, step in zip(shape, stride))


# ---------------------------------------------------------------- the way in ----------------------
# Each message is pickled whole: a tensor as its layout on a storage, whose bytes go with the
# first tensor on it, so that both sides lay every tensor out alike (a view of one is a view at
# the same offsets of the other, and a change in place shows as a storage's changed bytes).


class CallPickler(pickle.Pickler):
    """A message to the sandbox: every tensor by its number and layout; every module whole but
    without its hooks (the test process's, often a test's lambda); a function pickle cannot
    name, found by name in its module."""

    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.reached: List[torch.Tensor] = []  # the tensors of this message (pickle's memo
        # sends each once, by its number in this list)
        self.storages: Dict[tuple, int] = {}  # (address, size) -> a storage's number
        self.bytes_of: Dict[int, torch.Tensor] = {}  # a storage's number -> a uint8 tensor over it
        self.bases: Dict[tuple, torch.Tensor] = {}  # (storage, dtype) -> a tensor on it, to view
        self.no_hooks = OrderedDict()  # pickled once, for every module's hooks

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            return CallUnpickler.tensor, self.tensor(obj)
        if isinstance(obj, nn.Module):
            state = {
                key: self.no_hooks if key.endswith("hooks") and isinstance(value, dict) else value
                for key, value in vars(obj).items()
            }
            return copyreg.__newobj__, (type(obj),), state
        if inspect.ismodule(obj):
            return importlib.import_module, (obj.__name__,)
        if inspect.isfunction(obj) and "<locals>" in obj.__qualname__:
            module = sys.modules.get(obj.__module__)
            names = [name for name, value in vars(module or {}).items() if value is obj]
            if names:
                return getattr, (module, names[0])
        return NotImplemented

    def tensor(self, t: torch.Tensor) -> tuple:
        self.reached.append(t)
        storage, data = None, None  # on the meta device, no data
        if not t.is_meta:
            where = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
            storage = self.storages.setdefault(where, len(self.storages))
            self.bases.setdefault((storage, t.dtype), t)
            if storage not in self.bytes_of:  # its bytes, with the first tensor on it
                whole = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
                self.bytes_of[storage], data = whole, whole.numpy().tobytes()
        layout = list(t.shape), list(t.stride()), t.storage_offset()
        parameter = type(t) is nn.Parameter
        return storage, data, name_of(t.dtype), *layout, t.requires_grad, parameter


def pickled(content: dict):
    """A message's bytes, and its pickler (the tensors it reaches, by number)."""
    buffer = io.BytesIO()
    pickler = CallPickler(buffer)
    pickler.dump(content)
    return buffer.getvalue(), pickler


class CallUnpickler(pickle.Unpickler):
    """In the sandbox: a message, each tensor made on the storage sent for it."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self.storages: Dict[int, torch.Tensor] = {}  # number -> its bytes, a uint8 tensor
        self.reached: List[torch.Tensor] = []
        self.handed: Dict[tuple, int] = {}  # (an address, a dtype on it) -> its storage's number

    def find_class(self, module, name):
        if name == "CallUnpickler.tensor":  # the caller's name of this method: this message's
            return self.tensor
        return super().find_class(module, name)

    def tensor(self, storage, data, dtype, shape, stride, offset, grad, parameter):
        if storage is None:
            t = torch.empty_strided(shape, stride, dtype=DTYPES[dtype], device="meta")
        else:
            if data is not None:
                self.storages[storage] = bytes_tensor(data)
            whole = self.storages[storage]
            t = whole.view(DTYPES[dtype]).as_strided(shape, stride, offset)
            if whole.numel():
                self.handed[whole.data_ptr(), t.dtype] = storage
        if parameter:
            t = nn.Parameter(t, requires_grad=grad)
        elif grad:
            t.requires_grad_()
        self.reached.append(t)
        return t


# ---------------------------------------------------------------- a value, the way out ------------


class Encoder:
    """In the sandbox: a value as JSON. A tensor is either a view into a storage the call was
    handed (its number and the place in it) or new: its layout in the table, and its elements
    from its first to its last (its layout's span, a tensor of its own: strides and expanded
    views come back as they are)."""

    def __init__(self, handed: Dict[tuple, int]):
        self.handed = handed  # (a storage's address, a dtype of the call on it) -> its number
        self.new: List[torch.Tensor] = []
        self.table: List[dict] = []
        self.out: Dict[str, torch.Tensor] = {}

    def encode(self, value, depth=0):
        if depth > MAX_DEPTH:
            raise TypeError(f"the value returned is nested deeper than {MAX_DEPTH}")
        if value is None or isinstance(value, (bool, int, float)):
            return value if not isinstance(value, float) or math.isfinite(value) else str(value)
        if isinstance(value, str):
            return {"str": value[:MAX_TEXT]}
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, torch.dtype):
            return {"dtype": name_of(value)}
        if isinstance(value, dict) and all(isinstance(key, str) for key in value):
            return {"dict": {key: self.encode(item, depth + 1) for key, item in value.items()}}
        if not isinstance(value, (tuple, list)):
            raise TypeError(
                f"a graded function returns tensors, numbers, strings, dtypes, tuples, lists, "
                f"dicts and None across the sandbox, not {type(value).__name__}"
            )
        items = [self.encode(item, depth + 1) for item in value]
        if isinstance(value, tuple) and hasattr(type(value), "_fields"):
            kind = type(value)
            return {"namedtuple": f"{kind.__module__}:{kind.__qualname__}", "items": items}
        if isinstance(value, torch.Size):
            return {"size": items}
        return {"list" if isinstance(value, list) else "tuple": items}

    def tensor(self, t: torch.Tensor) -> dict:
        layout = {"dtype": name_of(t.dtype), "shape": list(t.shape), "stride": list(t.stride())}
        meta = t.device.type == "meta"
        if not meta and t.untyped_storage().nbytes():
            storage = self.handed.get((t.untyped_storage().data_ptr(), t.dtype))
            if storage is not None:
                return {"view": storage, "offset": t.storage_offset(), **layout}
        if not meta:
            span = (extent(t.shape, t.stride()),)
            elements = t.detach().as_strided(span, (1,), t.storage_offset()).clone()
            self.out[f"new.{len(self.new)}"] = elements
        self.table.append({**layout, "requires_grad": t.requires_grad, "meta": meta})
        self.new.append(t)
        return {"tensor": len(self.new) - 1}


def error_header(error: BaseException) -> dict:
    crossing = next((c for c in type(error).__mro__ if EXCEPTIONS.get(c.__name__) is c), None)
    text = str(error) if crossing else f"{type(error).__name__}: {error}"
    return {"error": crossing.__name__ if crossing else "RuntimeError", "message": text[:MAX_TEXT]}


# ---------------------------------------------------------------- the server (in the sandbox) -----


class Server:
    """The student's function, and the graphs of the calls that a gradient may still be asked
    of (until the test process says reset, after each test)."""

    def __init__(self, module_name: str, source: str, function: str):
        self.graphs: Dict[int, tuple] = {}
        self.calls = 0
        self.target, self.failed = None, {}
        try:
            module = load(module_name, source)
            owner, _, name = function.rpartition(".")
            raw = inspect.getattr_static(getattr(module, owner) if owner else module, name)
            self.target = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        except BaseException as error:  # the submission's own code runs at its import
            self.failed = error_header(error)
            self.failed["message"] = f"importing the submission failed: {self.failed['message']}"

    def call(self, message: dict, unpickler: "CallUnpickler"):
        if self.failed:
            return dict(self.failed), {}
        storages, reached = unpickler.storages, unpickler.reached
        torch.set_rng_state(bytes_tensor(message["rng"]))
        torch.set_default_dtype(DTYPES[message["default_dtype"]])
        before = {number: storage.clone() for number, storage in storages.items()}
        encoder = Encoder(unpickler.handed)
        try:
            with torch.set_grad_enabled(message["grad_enabled"]):
                value = self.target(*message["args"], **message["kwargs"])
            reply = {"value": encoder.encode(value)}
        except BaseException as error:
            reply, encoder.table, encoder.out = error_header(error), [], {}
        out, changed = encoder.out, []  # the storages the call changed in place: their bytes now
        for number, old in before.items():
            if not torch.equal(storages[number], old):
                changed.append(number)
                out[f"changed.{number}"] = storages[number]
        out["rng"] = torch.get_rng_state()
        self.calls += 1
        reply.update(tensors=encoder.table, changed=changed, call=self.calls)
        leaves = [t for t in reached if t.requires_grad]
        if "value" in reply and leaves and any(t.requires_grad for t in encoder.new):
            self.graphs[self.calls] = encoder.new, leaves
        return reply, out

    def backward(self, message: dict):
        outputs, leaves = self.graphs[message["call"]]
        pairs = [
            (o, g) for o, g in zip(outputs, message["grads"]) if g is not None and o.requires_grad
        ]
        found = [None] * len(leaves)
        try:
            if pairs:
                found = torch.autograd.grad(
                    [o for o, _ in pairs],
                    leaves,
                    [g for _, g in pairs],
                    retain_graph=True,  # a test may ask twice (backward(retain_graph=True))
                    allow_unused=True,
                )
        except BaseException as error:
            return error_header(error), {}
        encoder = Encoder({})
        grads = [None if g is None else encoder.tensor(g) for g in found]
        return {"grads": grads, "tensors": encoder.table}, encoder.out


def load(name: str, source: str):
    """The module name made from source, in memory: never a file another worker could read."""
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = name.replace(".", "/") + ".py"  # what tracebacks name
    sys.modules[name] = module
    package, _, leaf = name.rpartition(".")
    if package:
        setattr(importlib.import_module(package), leaf, module)
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def serve(fd: int) -> None:
    """A worker: its module's source from the test process, then the student's function, served
    on the socket fd until the test process goes."""
    module = pickle.loads(receive(fd))
    server = Server(module["module"], module["source"], module["function"])
    send(fd, reply_bytes({"op": "imported", **server.failed}, {}))
    while True:
        try:
            unpickler = CallUnpickler(receive(fd))
        except EOFError:
            return
        message = unpickler.load()
        if message["op"] == "call":
            send(fd, reply_bytes(*server.call(message, unpickler)))
        elif message["op"] == "backward":
            send(fd, reply_bytes(*server.backward(message)))
        else:  # reset: the test is over, and no gradient will be asked of its calls
            server.graphs.clear()


# ---------------------------------------------------------------- the sandbox's processes ---------
# Every process of a sandbox runs under the grader's seccomp filter (grading.kernel_filter). A
# worker's output goes to a pipe of its exercise's own, which the grader reads to its end; how it
# ended goes to the grader on a pipe the worker does not hold, as "ended STATUS SECONDS".


class Worker:
    """The running worker's process id and the pipe to say how it ended on (reap writes it)."""

    pid = 0
    status_fd = -1

    @classmethod
    def reap(cls, *_) -> None:
        with contextlib.suppress(ChildProcessError):
            while (ended := os.wait4(-1, os.WNOHANG))[0]:
                pid, status, usage = ended
                if pid == cls.pid:
                    cls.said(f"ended {status} {usage.ru_utime + usage.ru_stime:.3f}")

    @classmethod
    def said(cls, words: str = "") -> None:
        with contextlib.suppress(OSError):
            os.write(cls.status_fd, words.encode())
            os.close(cls.status_fd)
        cls.status_fd = -1


def alone() -> bool:
    """Whether this process runs one thread (forking is safe)."""
    return threading.active_count() == 1 and len(os.listdir("/proc/self/task")) == 1


def started(control_fd: int):
    """A forking process's start: not dumpable (no worker of its uid traces it or reads its
    memory) and the subreaper of all below it (end_others finds the orphans): prctl, through the
    C library. Its objects frozen (never walked or copied by a child's collections); "started"
    said if it may fork, else "unsafe". Returns the control socket, or None."""
    control = socket.socket(fileno=control_fd)
    libc = ctypes.CDLL(None)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE: 0
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    gc.freeze()
    control.sendall(b"started" if alone() else b"unsafe")
    return control if alone() else None


def start_submissions(control_fd: int, tmp_base: str) -> None:
    """The sandbox's first process (no student code): for each submission the grader sends
    ("start": its uid or null, a socket, its cgroups' cgroup.procs) a first process that joins
    the cgroups, makes TMP/UID its own and starts the workers; asked to "end" a uid (as root), a
    process that ends all that uid runs and empties its folder, its socket closing then."""
    control = started(control_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its children reaped as they end
    while control:
        message, fds, _, _ = socket.recv_fds(control, 1 << 16, 3)
        if not message:  # the grader has gone
            return
        request = json.loads(message)
        if os.fork() == 0:
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                uid = request["uid"]
                tmp_folder = f"{tmp_base}/{uid or 'own'}"
                if request["op"] == "end":
                    end_others(tmp_folder, uid)
                else:
                    for cgroup_procs in fds[1:]:
                        os.write(cgroup_procs, b"0")
                        os.close(cgroup_procs)
                    os.makedirs(tmp_folder, mode=0o700, exist_ok=True)
                    if uid is not None:
                        os.chown(tmp_folder, uid, uid)
                    os.environ["TMPDIR"] = os.environ["HOME"] = tmp_folder
                    start_workers(fds[0], tmp_folder, uid)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)


def start_workers(control_fd: int, tmp_folder: str, uid: Optional[int]) -> None:
    """A submission's first process: a worker for each exercise the grader sends (its processor
    time; a socket to its test process, its output pipe, its status pipe), one at a time, each
    taking uid (where there is one) before anything of the submission runs. Before each, every
    other process of the submission killed and its temporary folder emptied: nothing one
    exercise leaves reaches the next."""
    control = started(control_fd)
    signal.signal(signal.SIGCHLD, Worker.reap)
    while control:
        message, fds, _, _ = socket.recv_fds(control, 1 << 16, 3)
        end_others(tmp_folder, uid)
        if not message:  # the grader has gone
            return
        Worker.reap()  # the last worker, if it ended just now
        Worker.said()
        socket_fd, output_fd, status_fd = fds
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                control.close()
                os.close(status_fd)
                if uid is not None:
                    become(uid)
                os.dup2(output_fd, 1)
                os.dup2(output_fd, 2)
                os.close(output_fd)
                sys.stdout.reconfigure(line_buffering=True)
                seconds = json.loads(message)["seconds"]  # then SIGXCPU stops it
                resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
                serve(socket_fd)
            finally:
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
                os._exit(0)
        Worker.pid, Worker.status_fd = pid, status_fd
        os.close(socket_fd)
        os.close(output_fd)


def become(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # and with it, every capability


def end_others(tmp_folder: str, uid: Optional[int] = None) -> None:
    """Every other process of the submission killed, and its temporary folder emptied. uid (this
    process is root): a child that takes uid kills all it runs (kill(-1) reaches those alone).
    Else every process below this one, their subreaper: never kill(-1), which as the grader's
    own user would reach every process of that user."""
    if uid is None:
        for _ in range(1000):  # a process may fork as its parent is killed: until none is left
            below = descendants(os.getpid())
            if not below:
                break
            for pid in below:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            reap_all()
    elif os.fork():
        reap_all()
        return
    try:
        if uid is not None:
            become(uid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
        folders, found = [tmp_folder], []  # (path, whether a folder), parents first
        for folder in folders:  # made ours before it is listed (a worker may have taken it)
            with contextlib.suppress(OSError):
                os.chmod(folder, 0o700)
            with contextlib.suppress(OSError):
                for entry in os.scandir(folder):
                    found.append((entry.path, entry.is_dir(follow_symlinks=False)))
                    if found[-1][1] and not os.path.ismount(entry.path):  # a mount is kept
                        folders.append(entry.path)  # (a Python under /tmp)
        for path, is_folder in reversed(found):
            with contextlib.suppress(OSError):  # a folder that holds a mount stays
                os.rmdir(path) if is_folder else os.unlink(path)
    finally:
        if uid is not None:
            os._exit(0)


def processes() -> Dict[int, tuple]:
    """{pid: (its state, its parent, its uid)} of every process /proc shows."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
            found[int(pid)] = fields[0], int(fields[1]), os.stat(f"/proc/{pid}").st_uid
    return found


def descendants(pid: int, table: Optional[Dict[int, tuple]] = None) -> List[int]:
    table = processes() if table is None else table
    found = [pid]
    for above in found:  # grows as it goes: each process's children, then theirs
        found += [child for child, (_, parent, _) in table.items() if parent == above]
    return found[1:]


def reap_all() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, 0)[0]:
            pass


def main(argv: List[str]) -> int:
    """In the sandbox, before anything of a submission runs: the limits (no process in it holds
    the capability to raise them), torch imported, then each submission's first process."""
    control_fd, tmp_folder, folder, *paths = argv
    with open("/proc/self/oom_score_adj", "w") as adj:  # out of memory, the kernel kills it first
        adj.write("1000")
    for limit, value in (
        (resource.RLIMIT_AS, ADDRESS_SPACE),
        (resource.RLIMIT_FSIZE, FILE_SIZE),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    # counted only where the processes counted are the sandbox's alone (a user namespace, or a
    # uid of the kit's own: root's own are not)
    if os.environ.get("KIT_COUNT_PROCESSES"):
        resource.setrlimit(resource.RLIMIT_NPROC, (PROCESSES, PROCESSES))
    sys.path[:0] = [folder]  # the project's other modules, as they are
    sys.path += paths
    # what a gradient with grad_outputs or the meta device imports first: once here, not per worker
    import torch._dynamo  # noqa: F401

    try:  # the filter holds: a memfd, one of the objects it refuses, cannot be made
        os.close(os.memfd_create("kit-probe"))
        print("the seccomp filter does not hold", file=sys.stderr)
        return 1
    except PermissionError:
        pass
    start_submissions(int(control_fd), tmp_folder)
    return 0


# ---------------------------------------------------------------- the test process's side ---------


class Link(NamedTuple):
    """One call's place in the test process's graph: its new tensors, which of them the sandbox
    computed with a gradient, and the tensors it was handed that want one (its leaves)."""

    sandbox: "Sandbox"
    call: int
    new: list
    differentiable: list
    leaves: list


class Remote(torch.autograd.Function):
    """Ties what a sandbox returned into the test process's graph: the backward of its outputs
    asks the sandbox for the gradients of the call's leaves."""

    @staticmethod
    def forward(ctx, link, *leaves):
        ctx.link = link
        ctx.mark_non_differentiable(*[t for t, d in zip(link.new, link.differentiable) if not d])
        return tuple(link.new)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *ctx.link.sandbox.backward(ctx.link, grads))


class Sandbox:
    """The test process's end of a worker. One that outlives its deadline (a wall-clock one, past
    its own processor time) makes the run not graded (problem says why); one that ends, or sends
    what the protocol does not allow, makes every later call raise (gone says why)."""

    def __init__(self, fd: int, graded: dict, timeout_s: float, classes: Dict[str, type]):
        self.fd, self.deadline = fd, time.monotonic() + timeout_s
        self.watch = graded.get("watch", {})  # the submission's processes: {"uid"} or {"pid"}
        self.last = time.monotonic() + self.watch.get("hard_s", timeout_s)
        self.graded = graded  # module, function, source: the module with the student's function
        self.classes = classes  # the named tuples of the run's own modules, "module:name"
        self.problem = self.gone = ""
        self.imported = False

    def started(self) -> None:
        """The worker's module sent, and its first word: whether the submission imported."""
        if not self.imported:
            self.imported = True
            module = {key: self.graded[key] for key in ("module", "function", "source")}
            header, _ = self.exchange(pickled({"op": "module", **module})[0])
            if header.get("op") != "imported":
                self.end("the sandbox sent no word of the submission's import")
            if "error" in header:
                self.end(text(header.get("message", "")))
        if self.gone:
            raise RuntimeError(self.gone)

    def due(self) -> float:
        """The run's wall-clock limit, moved on while a process of the submission computes (its
        processor time stops it, however busy the machine), up to the last."""
        now = time.monotonic()
        if self.deadline <= now < self.last and computing(self.watch):
            self.deadline = now + 5
        return self.deadline

    def end(self, why: str, raises: bool = True) -> None:
        """No call will be made any more: the worker sees its socket close, and ends."""
        if not self.gone:
            self.gone = why
            with contextlib.suppress(OSError):
                os.close(self.fd)
        if raises:
            raise RuntimeError(self.gone)

    def exchange(self, data: bytes) -> tuple:
        """(reply, tensors): the worker's reply to the message data."""
        if self.gone:
            raise RuntimeError(self.gone)
        try:
            send(self.fd, data)
            return read_reply(receive(self.fd, self.due))
        except TimeoutError:
            self.problem = self.problem or "the time ran out"
            self.end("the sandbox was stopped at the timeout")
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self.end(WORKER_ENDED)
        except Refused as why:
            self.end(f"the sandbox sent {why}")

    def checked(self, what: str, read):
        """read()'s value, raised if it is an exception; a reply it finds forged ends the worker."""
        try:
            value = read()
        except (Refused, KeyError, IndexError, TypeError, ValueError, RuntimeError) as why:
            self.end(f"the sandbox sent what no {what} returns ({str(why)[:200]})")
        if isinstance(value, BaseException):
            raise value
        return value

    def call(self, args, kwargs):
        self.started()
        data, sent = pickled(
            {
                "op": "call",
                "args": args,
                "kwargs": kwargs,
                "rng": torch.get_rng_state().numpy().tobytes(),
                "grad_enabled": torch.is_grad_enabled(),
                "default_dtype": name_of(torch.get_default_dtype()),
            }
        )
        reply, out = self.exchange(data)
        return self.checked("call", lambda: self.read_reply(reply, out, sent))

    def read_reply(self, reply, out, sent: CallPickler):
        """The value a call returned, built from the reply after every check; or the exception
        it raised."""
        state = out.get("rng")
        if state is None or state.dtype != torch.uint8:
            raise Refused("a reply without the random state")
        torch.set_rng_state(state)  # it checks the state's size
        for number in reply["changed"]:  # what it changed in place, changed here too
            data, storage = out.get(f"changed.{number}"), sent.bytes_of.get(number)
            if storage is None or data is None or data.dtype != torch.uint8:
                raise Refused("a change in place of a storage it was not handed")
            if data.shape != storage.shape:
                raise Refused("a change in place of another size than its storage")
            storage.copy_(data)
        if "error" in reply:
            return raised(reply)
        new = [self.tensor(entry, out, i) for i, entry in enumerate(reply["tensors"])]
        leaves = [t for t in sent.reached if t.requires_grad]
        differentiable = [entry["requires_grad"] is True for entry in reply["tensors"]]
        if torch.is_grad_enabled() and leaves and any(differentiable):
            link = Link(self, integer(reply["call"], 1 << 62), new, differentiable, leaves)
            new = list(Remote.apply(link, *leaves))
        return self.value(reply["value"], sent.bases, new, 0)

    def tensor(self, entry: dict, out: Dict[str, torch.Tensor], i: int) -> torch.Tensor:
        """A new tensor: safetensors read its elements (its layout's span); its layout, checked
        to lie inside them, is the reply's."""
        shape, stride = layout(entry["shape"]), layout(entry["stride"])
        if len(shape) != len(stride) or math.prod(shape) > MAX_ELEMENTS:
            raise Refused(f"a tensor of shape {shape[:MAX_DIMS]}")
        if entry["meta"] is True:
            return torch.empty_strided(shape, stride, dtype=DTYPES[entry["dtype"]], device="meta")
        span = out.get(f"new.{i}")
        if span is None or span.shape != (extent(shape, stride),):
            raise Refused(f"a tensor of shape {shape} that the elements sent do not hold")
        return span.as_strided(shape, stride, 0)

    def value(self, node, handed: dict, new: list, depth: int):
        if depth > MAX_DEPTH:
            raise Refused("a value nested too deep")
        if node is None or type(node) in (bool, int, float):
            return node
        if node in ("nan", "inf", "-inf"):  # a float JSON cannot hold
            return float(node)
        if type(node) is not dict or len(node) > 5:
            raise Refused("a value of no known kind")
        (kind, body), *_ = node.items()
        if kind == "tensor":
            return new[integer(body, len(new))]
        if kind == "view":  # a view into a storage it was handed, at the same place
            base = handed.get((body, DTYPES[node["dtype"]]))
            shape, stride = layout(node["shape"]), layout(node["stride"])
            if base is None or math.prod(shape) > MAX_ELEMENTS:
                raise Refused("a view of a storage it was not handed, or too large a view")
            return base.as_strided(shape, stride, integer(node["offset"], 1 << 62))
        if kind == "str":
            return text(body)
        if kind == "dtype":
            return DTYPES[body]
        if kind == "dict" and type(body) is dict:
            return {text(k): self.value(v, handed, new, depth + 1) for k, v in body.items()}
        if type(body if kind != "namedtuple" else node["items"]) is not list:
            raise Refused("a value of no known kind")
        if kind == "namedtuple":
            cls = self.classes.get(body)
            items = [self.value(v, handed, new, depth + 1) for v in node["items"]]
            if cls is None or len(items) != len(cls._fields):
                raise Refused(f"a named tuple {text(body)[:50]} the module does not define")
            return cls(*items)
        items = [self.value(v, handed, new, depth + 1) for v in body]
        if kind in ("tuple", "list", "size"):
            return {"tuple": tuple, "list": list, "size": torch.Size}[kind](items)
        raise Refused("a value of no known kind")

    def backward(self, link: Link, grads) -> list:
        """The gradients of a call's leaves, from the sandbox."""
        grads = [g if wanted else None for g, wanted in zip(grads, link.differentiable)]
        message = {"op": "backward", "call": link.call, "grads": grads}
        reply, out = self.exchange(pickled(message)[0])

        def read():
            if "error" in reply:  # the student's code raised it, in its backward
                return raised(reply)
            new = [self.tensor(entry, out, i) for i, entry in enumerate(reply["tensors"])]
            found = [self.value(grad, {}, new, 0) for grad in reply["grads"]]
            if len(found) != len(link.leaves) or any(
                g is not None and (g.shape != t.shape or g.dtype != t.dtype)
                for g, t in zip(found, link.leaves)
            ):
                raise Refused("gradients that do not fit the tensors")
            return found

        return self.checked("backward", read)

    def reset(self) -> None:
        if self.imported and not self.gone:
            with contextlib.suppress(OSError):
                send(self.fd, pickled({"op": "reset"})[0])

    def close(self) -> None:
        self.end("closed", raises=False)


def raised(reply: dict) -> BaseException:
    return EXCEPTIONS.get(text(reply["error"]), RuntimeError)(text(reply["message"]))


def integer(value, below: int) -> int:
    if type(value) is not int or not 0 <= value < below:
        raise Refused(f"an index {str(value)[:20]} out of range")
    return value


def layout(sizes) -> List[int]:
    if type(sizes) is not list or len(sizes) > MAX_DIMS:
        raise Refused("a shape or strides that are not a list of at most 16")
    return [integer(size, 1 << 40) for size in sizes]


def text(value) -> str:
    if type(value) is not str:
        raise Refused("a string that is not one")
    return value[:MAX_TEXT]


def computing(watch: dict) -> bool:
    """Whether a process of the submission runs or waits for a processor (state R): those of
    its uid (watch["uid"]), or those below its sandbox's process (watch["pid"])."""
    table = processes()
    if "uid" in watch:
        return any(state == "R" and uid == watch["uid"] for state, _, uid in table.values())
    return any(table[pid][0] == "R" for pid in descendants(watch.get("pid", -1), table))


def install(module, function: str, call) -> None:
    """A proxy in place of the module's function (or a class's method, as the class holds it),
    so that every caller, the tests and the module's own code, reaches call(target, args,
    kwargs). Before the tests import anything from the module."""
    owner_name, _, name = function.rpartition(".")
    owner = getattr(module, owner_name) if owner_name else module
    raw = inspect.getattr_static(owner, name)
    wraps = (staticmethod, classmethod)
    target = raw.__func__ if isinstance(raw, wraps) else raw

    @functools.wraps(target)
    def proxy(*args, **kwargs):
        return call(target, args, kwargs)

    setattr(owner, name, type(raw)(proxy) if isinstance(raw, wraps) else proxy)


def named_tuples(folder: str) -> Dict[str, type]:
    """The named tuples a graded function may return (Attended, Memory, an agent's Kept): those
    of the modules loaded from the run's folder, the teacher's, by "module:name"."""
    found = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if not path.startswith(folder.rstrip("/") + "/"):
            continue
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, tuple) and hasattr(value, "_fields"):
                found[f"{value.__module__}:{value.__qualname__}"] = value
    return found


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
