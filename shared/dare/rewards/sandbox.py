"""Run untrusted Python (model-written code and its tests) in a sandbox built on bubblewrap.

Each program runs under `bwrap` (Debian's `bubblewrap`, unprivileged user namespaces), in new user,
PID, IPC, UTS, network, mount and cgroup namespaces, with `--die-with-parent` and `--new-session`:
- a minimal read-only root: the interpreter's prefix and the folders of the shared libraries that it
  and its extension modules load (found with `ldd`, their symlinks recreated), nothing else: no
  `/etc`, no home folders, no project, no other repositories, no `/run`, `/var` or host `/tmp`;
- one writable place: a private, size-limited tmpfs at `/tmp`, the working directory, gone when the
  program ends; `/dev` is bwrap's minimal one, `/proc` the sandbox's own (the host's processes,
  their environments and the trainer are invisible and cannot be signalled);
- no network (the namespace's loopback is down); no further user namespaces (`--disable-userns`),
  so `unshare`, `setns` and `mount` fail inside;
- resource limits: CPU seconds, address space, file size, process count, open files, no core dumps;
  and a wall-clock timeout after which bwrap is killed, which takes the whole PID namespace with it
  (a daemon that double-forked included);
- the program runs as uid/gid 65534 in the namespace, with a cleared environment (PATH, HOME, LANG)
  and `python -I -S` (no site-packages, no user paths, no PYTHON* variables), its source on stdin;
- output is read in a bounded buffer (only the tail is kept), so a flood of prints cannot exhaust the
  parent's memory.
The program passes when it exits with status 0 before the timeout.

The process-count limit only binds a non-root user, so a root caller starts bwrap as `nobody`: when the
interpreter lives under a folder `nobody` cannot enter (/root/.pyenv/...), a small root helper first
re-exposes only the interpreter's prefix in a private mount namespace, then drops to `nobody` and
starts bwrap. A non-root caller runs bwrap as itself, its process budget raised by its current tasks.

Where bwrap is missing or the kernel disables unprivileged user namespaces, `run_program` refuses with
an error naming the package or the system setting, unless `DARE_SANDBOX=limits-only` is set: then
programs run with the limits, the scrubbed environment and (as root) the `nobody` user only, with a
one-line notice (no filesystem, network or process isolation).
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from dare.utils import UserError

NOBODY = 65534
MODE_ENV = "DARE_SANDBOX"


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    file_mb: int = 16
    tmpfs_mb: int = 64
    nproc: int = 32
    nofile: int = 64


@dataclass
class Outcome:
    passed: bool
    status: str  # "passed" | "failed" | "timeout" | "error"
    returncode: int | None
    output: str  # the tail of stdout+stderr
    wall_s: float


# As root, when nobody cannot reach the interpreter: a private mount namespace where the closed folder
# (/root) is an empty tmpfs showing only the interpreter's prefix; then the limits, `nobody`, and the
# command (bwrap, or with DARE_SANDBOX=limits-only the interpreter itself).
_HELPER = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1]); argv = sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x20000, 4096, 16384, 1 << 18


def mount(src, dst, fstype, flags, opts):
    if libc.mount(src, dst.encode(), fstype, flags, opts) != 0:
        sys.exit(f"sandbox: mount on {dst} failed (errno {ctypes.get_errno()})")


if libc.unshare(CLONE_NEWNS) != 0:
    sys.exit(f"sandbox: unshare(CLONE_NEWNS) failed (errno {ctypes.get_errno()})")
mount(None, "/", None, MS_REC | MS_PRIVATE, None)
prefix, closed = cfg["prefix"], cfg["closed"]
stash = "/run/dare-sandbox-prefix" if os.path.isdir("/run") else "/dev/shm/dare-sandbox-prefix"
mount(b"tmpfs", os.path.dirname(stash), b"tmpfs", 0, b"size=1m,mode=755")
os.mkdir(stash)
mount(prefix.encode(), stash, None, MS_BIND | MS_REC, None)
mount(b"tmpfs", closed, b"tmpfs", 0, b"size=1m,mode=755")
os.makedirs(prefix, mode=0o755, exist_ok=True)
mount(stash.encode(), prefix, None, MS_BIND | MS_REC, None)
for name, value in cfg["rlimits"]:
    resource.setrlimit(getattr(resource, name), tuple(value))
os.setgroups([]); os.setgid(cfg["uid"]); os.setuid(cfg["uid"])
os.execv(argv[0], argv)
"""


def _drops_to_nobody() -> bool:
    """Root that can become `nobody` (in a user namespace that maps only root, it cannot: act as a user)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map") as f:
            ranges = [tuple(map(int, line.split())) for line in f if line.strip()]
    except OSError:
        return True
    return any(inside <= NOBODY < inside + count for inside, _, count in ranges)


def _become_nobody() -> None:
    """(In a child before exec, as root) drop every group and become `nobody`."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _rlimits(limits: Limits, nproc: int) -> list[tuple[str, tuple[int, int]]]:
    mb = 1024 * 1024
    return [("RLIMIT_CPU", (limits.cpu_s, limits.cpu_s + 1)), ("RLIMIT_AS", (limits.memory_mb * mb,) * 2),
            ("RLIMIT_FSIZE", (limits.file_mb * mb,) * 2), ("RLIMIT_NPROC", (nproc,) * 2),
            ("RLIMIT_NOFILE", (limits.nofile,) * 2), ("RLIMIT_CORE", (0, 0))]


def _python() -> str:
    """The running interpreter, resolved (a venv's python is a link to it)."""
    return os.path.realpath(sys.executable)


def _prefix() -> str:
    return os.path.realpath(sys.base_prefix)


@functools.cache
def _root_layout() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(folders to bind read-only, (target, link) symlinks to recreate) so that the interpreter, the shared
    libraries it and its extension modules load, and the dynamic loader resolve inside the sandbox."""
    prefix = _prefix()
    objects = [_python(), *glob.glob(os.path.join(prefix, "lib", "python3*", "lib-dynload", "*.so"))]
    paths = set()
    for obj in objects:
        out = subprocess.run(["ldd", obj], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if m:
                paths.add(m.group(1))
    binds, links = set(), set()

    def need(path: str, depth: int = 0) -> None:
        if depth > 16 or path.startswith(prefix + "/"):
            return
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            head = "/" + "/".join(parts[:i])
            if os.path.islink(head):  # a folder link on the way (/lib -> usr/lib): recreate it, follow it
                links.add((os.readlink(head), head))
                need(os.path.join(os.path.dirname(head), os.readlink(head), *parts[i:]), depth + 1)
                return
        binds.add(os.path.dirname(os.path.normpath(path)))
        if os.path.islink(path):  # a file link (the loader in /usr/lib64): its target too
            need(os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path))), depth + 1)

    for p in sorted(paths):
        need(p)
    return tuple(sorted(binds)), tuple(sorted(links))


def _closed_folder(path: str) -> str | None:
    """The first folder on the way to `path` that others cannot enter, if any."""
    parts = path.split("/")
    return next(("/".join(parts[:i]) for i in range(2, len(parts) + 1)
                 if not os.stat("/".join(parts[:i])).st_mode & 0o001), None)


def _bwrap_args(limits: Limits, command: list[str]) -> list[str]:
    binds, links = _root_layout()
    # --as-pid-1: the program is the namespace's first process (bwrap's own reaper there would outlive it as a
    # zombie of the host's init); when it ends, the kernel ends everything else in the namespace
    args = [shutil.which("bwrap"), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox"]
    for target, link in links:
        args += ["--symlink", target, link]
    for folder in binds:
        args += ["--ro-bind", folder, folder]
    args += ["--ro-bind", _prefix(), _prefix(), "--proc", "/proc", "--dev", "/dev",
             "--size", str(limits.tmpfs_mb << 20), "--tmpfs", "/tmp", "--chdir", "/tmp", "--clearenv",
             "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
             "--setenv", "PYTHONDONTWRITEBYTECODE", "1", *command]
    return args


def _own_tasks() -> int:
    """Tasks (processes and threads, what RLIMIT_NPROC counts) of this user on the machine."""
    uid, n = os.getuid(), 0
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            with open(status) as f:
                text = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            n += int(fields.get("Threads", "1").strip() or 1)
    return n


def _sysctl(name: str) -> str | None:
    try:
        with open("/proc/sys/" + name.replace(".", "/")) as f:
            return f.read().strip()
    except OSError:
        return None


@functools.cache
def isolation() -> str:
    """"bubblewrap" when the sandbox can run here; "limits-only" when bwrap cannot and the user chose to
    run without isolation (`DARE_SANDBOX=limits-only`); otherwise a UserError naming what is missing."""
    if os.environ.get(MODE_ENV) == "limits-only":
        return "limits-only"
    if os.environ.get(MODE_ENV) not in (None, "", "bubblewrap"):
        raise UserError(f"{MODE_ENV}={os.environ[MODE_ENV]!r}: expected 'bubblewrap' (the default) or 'limits-only'")
    hint = f"or set {MODE_ENV}=limits-only to run model-written code with resource limits only (no isolation)"
    if shutil.which("bwrap") is None:
        raise UserError(f"the code sandbox needs bubblewrap (bwrap), which is not installed: apt-get install "
                        f"bubblewrap (`make setup` does), {hint}")
    root = _drops_to_nobody()

    probe = subprocess.run(["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1",
                            "--ro-bind", "/", "/", "true"], capture_output=True, text=True, timeout=30,
                           preexec_fn=_become_nobody if root else None)
    if probe.returncode == 0:
        return "bubblewrap"
    blocking = [(name, value, on) for name, off, on in (  # (setting, the value that disables, one that allows)
        ("kernel.unprivileged_userns_clone", "0", "1"), ("user.max_user_namespaces", "0", "10000"),
        ("kernel.apparmor_restrict_unprivileged_userns", "1", "0")) if (value := _sysctl(name)) == off]
    why = (f"this machine disables unprivileged user namespaces ({', '.join(f'{n}={v}' for n, v, _ in blocking)}): "
           f"allow them (sysctl -w {' '.join(f'{n}={on}' for n, _, on in blocking)})"
           if blocking else f"bwrap cannot create its namespaces here ({probe.stderr.strip()})")
    raise UserError(f"the code sandbox (bubblewrap) cannot run: {why}, {hint}")


@functools.cache
def _warn_once() -> None:
    print(f"dare: {MODE_ENV}=limits-only: model-written code runs with resource limits only (no filesystem, "
          "network or process isolation)", file=sys.stderr)


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Run one Python program in the sandbox; see the module docstring."""
    mode = isolation()
    root = _drops_to_nobody()
    nproc = limits.nproc if root else _own_tasks() + limits.nproc
    rlimits = _rlimits(limits, nproc)
    python = [_python(), "-I", "-S", "-"]
    workdir, closed = None, None
    if mode == "bubblewrap":
        cmd = _bwrap_args(limits, python)
        closed = _closed_folder(_prefix()) if root else None
    else:
        _warn_once()
        workdir = tempfile.mkdtemp(prefix="dare-sandbox-")
        if root:
            os.chown(workdir, NOBODY, NOBODY)
        cmd = python
        closed = _closed_folder(_prefix()) if root else None
    if closed:  # nobody cannot reach the interpreter: the root helper re-exposes it, then becomes nobody
        cfg = {"prefix": _prefix(), "closed": closed, "rlimits": rlimits, "uid": NOBODY}
        cmd = [_python(), "-I", "-S", "-c", _HELPER, json.dumps(cfg), *cmd]

    def before_exec():  # in the child: limits, then (root) nobody; the helper does both itself
        if closed:
            return
        import resource

        for name, value in rlimits:
            resource.setrlimit(getattr(resource, name), value)
        if root:
            _become_nobody()

    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **({"HOME": workdir} if workdir else {})}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env, cwd=workdir or "/", preexec_fn=before_exec)
    tail = bytearray()

    def read():
        while chunk := proc.stdout.read(65536):
            tail.extend(chunk)
            del tail[:-8192]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.stdin.write(source.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    status = None
    try:
        proc.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        status = "timeout"
    finally:
        # Killing bwrap kills the namespace's first process (--die-with-parent), and with it every process
        # in the PID namespace; without bwrap, the whole process group.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        reader.join(timeout=5)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    rc = None if status == "timeout" else proc.returncode
    if status is None:
        status = "passed" if rc == 0 else "failed"
    return Outcome(passed=status == "passed", status=status, returncode=rc,
                   output=tail.decode(errors="replace"), wall_s=time.monotonic() - start)


def run_programs(sources: list[str], limits: Limits = Limits(), workers: int | None = None) -> list[Outcome]:
    """Run many programs, `workers` sandboxes at a time (default: one per CPU core)."""
    isolation()  # a missing sandbox is one clear error before any program
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        return [run_program(s, limits) for s in sources]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_program(s, limits), sources))
