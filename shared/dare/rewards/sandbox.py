"""Run untrusted Python (model-written code and its tests) in a sandbox.

Each program runs in its own process tree, started through `unshare` in fresh network, mount and
PID namespaces, then, inside them:
- a fresh size-limited tmpfs over /tmp, /var/tmp and /dev/shm; the program's working directory is
  a new folder in it, and the rest of the file system is read-only to the program, which runs as
  `nobody` (uid 65534) with no supplementary groups; a folder that hides the interpreter from
  other users (/root/.pyenv/...) is replaced by an empty one that shows only the interpreter;
- no network: the namespace has only a loopback interface, which is down;
- its own /proc: the host's processes (the trainer included) are invisible and cannot be
  signalled, and `kill(-1)` reaches only the sandbox;
- resource limits: CPU seconds, address space, file size, process count, open files, no core
  dumps; and a wall-clock timeout after which the whole process tree is killed;
- a scrubbed environment (PATH, HOME, LANG only) and `python -I -S` (no site-packages, no
  user paths, no PYTHON* variables);
- output is read in a bounded buffer (only the tail is kept), so a flood of prints cannot
  exhaust the parent's memory.
The program passes when it exits with status 0 before the timeout.

This needs root (the project's machines and CI run as root) and unprivileged namespaces. Where
they are missing, `isolation()` says so and the program runs with the limits, the scrubbed
environment and the dropped user only when root, with a one-line notice (weaker: no network or
PID isolation).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

NOBODY = 65534


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


# Runs as root inside the new namespaces, then becomes `nobody` and execs the program.
_ENTRY = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1]); source = sys.stdin.buffer.read()
libc = ctypes.CDLL(None, use_errno=True)
if cfg["isolate"]:
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            opts = f"size={cfg['tmpfs_mb']}m,mode=1777".encode()
            if libc.mount(b"tmpfs", d.encode(), b"tmpfs", 0, opts) != 0:
                sys.exit(f"sandbox: mount tmpfs on {d} failed (errno {ctypes.get_errno()})")
MS_BIND, MS_REC, MNT_DETACH = 4096, 16384, 2


def mount(src, dst, fstype, flags, opts):
    if libc.mount(src, dst.encode(), fstype, flags, opts) != 0:
        sys.exit(f"sandbox: mount on {dst} failed (errno {ctypes.get_errno()})")


if cfg["isolate"]:
    # The interpreter may live under a folder others cannot enter (/root/.pyenv/...): hide that
    # folder behind an empty tmpfs and re-expose only the interpreter's prefix at the same path.
    prefix = cfg["prefix"]
    parts = prefix.split("/")
    closed = next(("/".join(parts[:i]) for i in range(2, len(parts) + 1)
                   if not os.stat("/".join(parts[:i])).st_mode & 0o001), None)
    if closed is not None:
        stash = "/tmp/.sandbox-prefix"
        os.mkdir(stash)
        mount(prefix.encode(), stash, None, MS_BIND | MS_REC, None)
        mount(b"tmpfs", closed, b"tmpfs", 0, b"size=1m,mode=755")
        os.makedirs(prefix, mode=0o755, exist_ok=True)
        mount(stash.encode(), prefix, None, MS_BIND | MS_REC, None)
        libc.umount2(stash.encode(), MNT_DETACH)
        os.rmdir(stash)
work = "/tmp/sandbox-work" if cfg["isolate"] else cfg["workdir"]
os.makedirs(work, mode=0o700, exist_ok=True)
with open(os.path.join(work, "program.py"), "wb") as f:
    f.write(source)
if os.geteuid() == 0:
    os.chown(work, cfg["uid"], cfg["uid"]); os.chown(os.path.join(work, "program.py"), cfg["uid"], cfg["uid"])
os.chdir(work)
devnull = os.open(os.devnull, os.O_RDONLY); os.dup2(devnull, 0)
if os.geteuid() == 0:
    os.setgroups([]); os.setgid(cfg["uid"]); os.setuid(cfg["uid"])
mb = 1024 * 1024
for name, soft in (("RLIMIT_CPU", cfg["cpu_s"]), ("RLIMIT_AS", cfg["memory_mb"] * mb),
                   ("RLIMIT_FSIZE", cfg["file_mb"] * mb), ("RLIMIT_NPROC", cfg["nproc"]),
                   ("RLIMIT_NOFILE", cfg["nofile"]), ("RLIMIT_CORE", 0)):
    hard = soft + 1 if name == "RLIMIT_CPU" else soft
    resource.setrlimit(getattr(resource, name), (soft, hard))
env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
os.execve(cfg["python"], [cfg["python"], "-I", "-S", "program.py"], env)
"""


@functools.cache
def isolation() -> str:
    """"namespaces" when the full sandbox is available here, else "limits-only"."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "limits-only"
    probe = subprocess.run(["unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, timeout=30)
    return "namespaces" if probe.returncode == 0 else "limits-only"


@functools.cache
def _warn_once() -> None:
    print("dare: the code sandbox has no namespaces here (needs root and unshare); running with resource "
          "limits only", file=sys.stderr)


def _python() -> str:
    """An interpreter path the sandbox user can execute (the running one, resolved)."""
    return os.path.realpath(sys.executable)


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Run one Python program in the sandbox; see the module docstring."""
    import tempfile

    isolate = isolation() == "namespaces"
    if not isolate:
        _warn_once()
    workdir = None if isolate else tempfile.mkdtemp(prefix="dare-sandbox-")
    if workdir and os.geteuid() == 0:
        os.chown(workdir, NOBODY, NOBODY)
    cfg = {**asdict(limits), "isolate": isolate, "uid": NOBODY, "python": _python(), "workdir": workdir,
           "prefix": os.path.realpath(sys.base_prefix)}
    cmd = [_python(), "-I", "-S", "-c", _ENTRY, json.dumps(cfg)]
    if isolate:
        cmd = ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", *cmd]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
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
        # Kill the namespace's pid 1 (the program): the kernel then kills everything in the
        # namespace, and `unshare` reaps it and exits, so no process is left or orphaned.
        for pid in _children(proc.pid) if isolate else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # without namespaces: the whole process group
        except ProcessLookupError:
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


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def run_programs(sources: list[str], limits: Limits = Limits(), workers: int | None = None) -> list[Outcome]:
    """Run many programs, `workers` sandboxes at a time (default: one per CPU core)."""
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        return [run_program(s, limits) for s in sources]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_program(s, limits), sources))
