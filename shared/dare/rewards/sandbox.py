"""Run untrusted Python (model-written code and its tests) in a sandbox built on bubblewrap.

Each program runs under `bwrap` (Debian's `bubblewrap`, unprivileged user namespaces), in new user,
PID, IPC, UTS, network, mount and cgroup namespaces, with `--die-with-parent` and `--new-session`:
- a minimal read-only root: the interpreter, its standard library and the folders of the shared
  libraries that it and its extension modules load (found with `ldd`, their symlinks recreated),
  nothing else: no shell or other program, no `/etc`, no home folders, no project, no `/run`, `/var`
  or host `/tmp`; `/dev` is bwrap's minimal one, read-only (no writable `/dev/shm`); `/proc` the
  sandbox's own (the host's processes, their environments and the trainer are invisible);
- one writable place: a private tmpfs at `/tmp`, the working directory, capped in bytes (and, as
  root, in inodes), gone when the program ends;
- no network (the namespace's loopback is down); no further user namespaces (`--disable-userns`),
  so `unshare`, `setns` and `mount` fail inside;
- limits per call: CPU seconds, address space per process, file size, open files, no core dumps, and
  a process count that binds the call's own user namespace (the kernel counts RLIMIT_NPROC per user
  namespace, so parallel calls and anything left by an earlier call do not share it); where a cgroup
  can be made (cgroup v2 with the pids and memory controllers, or v1's pids and memory hierarchies,
  writable by the caller: as root on most machines), the program as a whole is also held to
  `memory_mb` + `tmpfs_mb` (kernel memory such as inodes included) and `nproc` processes; otherwise a
  one-line notice says at first use that only the per-process limits apply;
- the program runs as uid/gid 65534 in the namespace, with a cleared environment (PATH, HOME, LANG)
  and `python -I -S` (no site-packages, no user paths, no PYTHON* variables), its source on stdin;
- output is read in a bounded buffer (only the tail is kept), so a flood of prints cannot exhaust the
  parent's memory.
When the call returns nothing it started runs on: the namespace's first process is killed through its
pidfd (bwrap's `--info-fd` names it), which ends every process of the PID namespace, also one that
cleared its parent-death signal, and bwrap, its parent, reaps it before bwrap's own group is killed (no zombie
is left to the host's init); with a cgroup, whatever is left in it is killed too.

Code rewards (`run_judged`): the model's program runs here and the task's tests in a judge process outside
the sandbox (forked per program by `_Zygote`), which calls the program's functions through plain data
(`dare.rewards.plain`); the judge's verdict comes back through a pipe the sandbox does not hold, so nothing
the program does in its own interpreter (reading constants, jumping lines, ending early, objects equal to
everything) can make a pass. A generic program (`run_program`) passes when it ran to its end: a per-call
random token is written after its last line, and it passes only when its output holds the token and it
exits with status 0 before the timeout (`sys.exit(0)`, `os._exit(0)`, `raise SystemExit` or an `atexit`
hook that ends a failing program with status 0 fail; code that searches its own memory for the token could
forge it, which is why code rewards use the judge). Every sandboxed or judging process sets its
`oom_score_adj` to 1000: the kernel's OOM killer takes it before the trainer.

As root, bwrap is started as `nobody` by a small root helper that first, in a private mount namespace,
mounts the `/tmp` tmpfs with its inode cap and, when the interpreter lives under a folder `nobody`
cannot enter (/root/.pyenv/...), re-exposes only the interpreter's prefix. A non-root caller runs bwrap
as itself (its `/tmp` is capped in bytes only; with a cgroup its inodes count against the memory cap).

Where bwrap is missing or the kernel disables unprivileged user namespaces, `run_program` refuses with
an error naming the package or the system setting, unless `DARE_SANDBOX=limits-only` is set: then
programs run with the limits, the scrubbed environment and (as root) the `nobody` user only, with a
one-line notice (no filesystem, network or process isolation).
"""

from __future__ import annotations

import functools
import glob
import itertools
import json
import marshal
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dare.rewards import plain
from dare.utils import UserError

NOBODY = 65534
REAP_S = 2.0
"""How long bwrap is given to reap the namespace's first process, once killed, before bwrap itself is killed."""
MODE_ENV = "DARE_SANDBOX"
CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512  # per process; with a cgroup also the whole program (+ tmpfs_mb)
    file_mb: int = 16
    tmpfs_mb: int = 64
    tmpfs_inodes: int = 4096  # as root (the tmpfs is mounted by the root helper)
    nproc: int = 32  # per call (its user namespace); with a cgroup also its pids.max
    nofile: int = 64


@dataclass
class Outcome:
    passed: bool
    status: str  # "passed" | "failed" | "timeout" | "error"
    returncode: int | None
    output: str  # the tail of stdout+stderr
    wall_s: float
    completed: bool = False  # the program ran to its end (the end token was written)


# As root: a private mount namespace with the /tmp tmpfs (bytes and inodes capped) and, when nobody cannot
# reach the interpreter, the closed folder (/root) an empty tmpfs showing only the interpreter's prefix; then
# the limits, `nobody`, and the command (bwrap, or with DARE_SANDBOX=limits-only the interpreter itself).
_HELPER = r"""
import ctypes, marshal, os, resource, sys
cfg = marshal.loads(bytes.fromhex(sys.argv[1])); argv = sys.argv[2:]  # the caller's own data (json costs 7 ms)
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x20000, 4096, 16384, 1 << 18


def mount(src, dst, fstype, flags, opts):
    if libc.mount(src, dst.encode(), fstype, flags, opts) != 0:
        sys.exit(f"sandbox: mount on {dst} failed (errno {ctypes.get_errno()})")


if libc.unshare(CLONE_NEWNS) != 0:
    sys.exit(f"sandbox: unshare(CLONE_NEWNS) failed (errno {ctypes.get_errno()})")
mount(None, "/", None, MS_REC | MS_PRIVATE, None)
stash = cfg["stash"]
mount(b"tmpfs", stash, b"tmpfs", 0, b"size=1m,mode=755")
if cfg["tmp"]:
    os.mkdir(cfg["tmp"]["path"])
    mount(b"tmpfs", cfg["tmp"]["path"], b"tmpfs", 0, cfg["tmp"]["options"].encode())
if cfg["closed"]:
    prefix, closed, keep = cfg["prefix"], cfg["closed"], os.path.join(stash, "prefix")
    os.mkdir(keep)
    mount(prefix.encode(), keep, None, MS_BIND | MS_REC, None)
    mount(b"tmpfs", closed, b"tmpfs", 0, b"size=1m,mode=755")
    os.makedirs(prefix, mode=0o755, exist_ok=True)
    mount(keep.encode(), prefix, None, MS_BIND | MS_REC, None)
for name, value in cfg["rlimits"]:
    resource.setrlimit(getattr(resource, name), tuple(value))
os.setgroups([]); os.setgid(cfg["uid"]); os.setuid(cfg["uid"])
os.execv(argv[0], argv)
"""

# In the sandbox: the per-call process limit (it binds this user namespace only), then the program from stdin.
# The program's globals are those `python -` gives it (no `sys` or `resource` left behind).
_START = ("import resource as r; r.setrlimit(r.RLIMIT_NPROC, ({n}, {n})); del r; "
          "exec(compile(__import__('sys').stdin.read(), '<stdin>', 'exec'))")


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


def _rlimits(limits: Limits, nproc: int | None) -> list[tuple[str, tuple[int, int]]]:
    mb = 1024 * 1024
    out = [("RLIMIT_CPU", (limits.cpu_s, limits.cpu_s + 1)), ("RLIMIT_AS", (limits.memory_mb * mb,) * 2),
           ("RLIMIT_FSIZE", (limits.file_mb * mb,) * 2), ("RLIMIT_NOFILE", (limits.nofile,) * 2),
           ("RLIMIT_CORE", (0, 0))]
    return out + ([("RLIMIT_NPROC", (nproc,) * 2)] if nproc is not None else [])


def _python() -> str:
    """The running interpreter, resolved (a venv's python is a link to it)."""
    return os.path.realpath(sys.executable)


def _prefix() -> str:
    return os.path.realpath(sys.base_prefix)


def _stdlib() -> str:
    return os.path.realpath(sysconfig.get_paths()["stdlib"])


def _stash() -> str:
    """Where the root helper mounts its private tmpfs (in its own mount namespace)."""
    return "/run" if os.path.isdir("/run") else "/dev/shm"


@functools.cache
def _root_layout() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(paths to bind read-only, (target, link) symlinks to recreate): the interpreter, its standard library,
    and the folders of the shared libraries it and its extension modules load, with the dynamic loader."""
    objects = [_python(), *glob.glob(os.path.join(_stdlib(), "lib-dynload", "*.so"))]
    paths = set()
    for obj in objects:
        out = subprocess.run(["ldd", obj], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if m:
                paths.add(m.group(1))
    binds, links = {_python(), _stdlib()}, set()

    def need(path: str, depth: int = 0) -> None:
        if depth > 16 or path.startswith(_stdlib() + "/"):
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
    # a folder that holds another bound path already exposes it
    binds = {b for b in binds if not any(b != o and b.startswith(o + "/") for o in binds)}
    return tuple(sorted(binds)), tuple(sorted(links))


def _closed_folder(path: str) -> str | None:
    """The first folder on the way to `path` that others cannot enter, if any."""
    parts = path.split("/")
    return next(("/".join(parts[:i]) for i in range(2, len(parts) + 1)
                 if not os.stat("/".join(parts[:i])).st_mode & 0o001), None)


def _bwrap_args(limits: Limits, command: list[str], tmp: str | None, info_fd: int) -> list[str]:
    """bwrap's command line; `tmp`: a tmpfs the root helper mounted (bound at /tmp), else bwrap's own."""
    binds, links = _root_layout()
    # --as-pid-1: the program is the namespace's first process (bwrap's own reaper there would outlive it as a
    # zombie of the host's init); when it ends, the kernel ends everything else in the namespace
    args = [shutil.which("bwrap"), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox",
            "--info-fd", str(info_fd)]
    for target, link in links:
        args += ["--symlink", target, link]
    for path in binds:
        args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--bind", tmp, "/tmp"] if tmp else ["--size", str(limits.tmpfs_mb << 20), "--tmpfs", "/tmp"]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv",
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


# ------------------------------------------------------------------------------------------------
# A cgroup per call: the whole program's memory and process count, and a kill of everything in it


def _own_cgroups() -> dict[str, str]:
    """{controller or "" (v2): this process's cgroup path} from /proc/self/cgroup."""
    out = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    out[c] = path
    except OSError:
        pass
    return out


def _writable(folder: str) -> bool:
    return os.path.isdir(folder) and os.access(folder, os.W_OK)


@functools.cache
def _cgroup_layout() -> tuple[str, tuple[str, ...]] | None:
    """("v2", (parent,)) or ("v1", (pids parent, memory parent)): where this caller can make a child cgroup
    that holds the pids and memory controllers; None when there is none."""
    own = _own_cgroups()
    if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")) and "" in own:  # pure v2
        path = own[""]
        while True:  # the nearest cgroup, ours or an ancestor, that gives its children both controllers
            folder = os.path.join(CGROUP_ROOT, path.lstrip("/"))
            try:
                with open(os.path.join(folder, "cgroup.subtree_control")) as f:
                    enabled = set(f.read().split())
            except OSError:
                enabled = set()
            if {"pids", "memory"} <= enabled and _writable(folder):
                return "v2", (folder,)
            if path in ("", "/"):
                return _delegated_v2(os.path.join(CGROUP_ROOT, own[""].lstrip("/")))
            path = os.path.dirname(path)
    folders = tuple(os.path.join(CGROUP_ROOT, c, own.get(c, "/").lstrip("/")) for c in ("pids", "memory"))
    if all(_writable(f) for f in folders):
        return "v1", folders
    return None


def _delegated_v2(folder: str) -> tuple[str, tuple[str, ...]] | None:
    """Our own cgroup when it was delegated to us (a systemd `--user --scope -p Delegate=yes`: we own it and
    it offers pids and memory) but holds processes, so cgroup v2 lets it give its children no controllers:
    its processes move to a leaf child, `dare-leaf`, and the controllers are enabled for the children (the
    steps systemd's delegation documents). Only for a user who owns the folder, never root: root's own cgroup
    is the machine's or a container's, whose processes are not ours to move. None when any step is refused."""
    try:
        if os.stat(folder).st_uid != os.geteuid() or os.geteuid() == 0:
            return None
        with open(os.path.join(folder, "cgroup.controllers")) as f:
            if not {"pids", "memory"} <= set(f.read().split()) or not _writable(folder):
                return None
        leaf = os.path.join(folder, "dare-leaf")
        os.makedirs(leaf, exist_ok=True)
        with open(os.path.join(folder, "cgroup.procs")) as f:
            pids = f.read().split()
        for pid in pids:
            with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
                f.write(pid)
        with open(os.path.join(folder, "cgroup.subtree_control"), "w") as f:
            f.write("+pids +memory")
    except OSError:
        return None
    return "v2", (folder,)


_serial = itertools.count()


class _Cgroup:
    """A child cgroup (v2: one folder; v1: one in the pids and one in the memory hierarchy) with the call's
    process and memory caps. `join()` runs in the child before exec; `kill()` ends everything in it."""

    def __init__(self, limits: Limits):
        version, parents = _cgroup_layout()
        name = f"dare-sandbox-{os.getpid()}-{next(_serial)}"
        self.folders = [os.path.join(p, name) for p in parents]
        memory = (limits.memory_mb + limits.tmpfs_mb) << 20
        settings = ({"pids.max": limits.nproc, "memory.max": memory, "memory.swap.max": 0} if version == "v2" else
                    {"pids.max": limits.nproc, "memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory})
        for folder in self.folders:
            os.mkdir(folder)
        for key, value in settings.items():
            folder = next((f for f in self.folders if os.path.exists(os.path.join(f, key))), None)
            if folder is None and key != "memory.memsw.limit_in_bytes" and key != "memory.swap.max":
                self.remove()
                raise OSError(f"cgroup file {key} missing under {self.folders}")
            if folder is not None:
                with open(os.path.join(folder, key), "w") as f:
                    f.write(str(value))

    def join(self) -> None:
        for folder in self.folders:
            with open(os.path.join(folder, "cgroup.procs"), "w") as f:
                f.write("0")

    def pids(self) -> set[int]:
        out = set()
        for folder in self.folders:
            try:
                with open(os.path.join(folder, "cgroup.procs")) as f:
                    out |= {int(p) for p in f.read().split()}
            except OSError:
                pass
        return out

    def kill(self) -> None:
        deadline = time.monotonic() + 5
        while (pids := self.pids()) and time.monotonic() < deadline:  # forks in flight: bounded by pids.max
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        for folder in self.folders:
            for _ in range(100):  # the killed tasks leave the cgroup as they are reaped
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


@functools.cache
def cgroups() -> bool:
    """Whether each call gets its own cgroup here (tried once: a probe process joins one)."""
    if _cgroup_layout() is None:
        return False
    try:
        group = _Cgroup(Limits())
    except OSError:
        return False
    try:
        subprocess.run(["true"], preexec_fn=group.join, check=True, timeout=30)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        group.remove()


# ------------------------------------------------------------------------------------------------


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
        if not cgroups():
            print("dare: code sandbox: no cgroup can be made here, so memory is limited per process (RLIMIT_AS), "
                  "not for each program as a whole" + ("" if root else ", and /tmp's inodes are not capped"),
                  file=sys.stderr)
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


def _end_token_line(token: str) -> str:
    """Appended after the program: flush its streams, then write the token straight to the output pipe."""
    return (f"\n\nimport os as _dare_os, sys as _dare_sys\nfor _dare_s in (_dare_sys.stdout, _dare_sys.stderr):\n"
            f"    try:\n        _dare_s.flush()\n    except Exception:\n        pass\n"
            f"_dare_os.write(1, b'\\n{token}\\n')\n")


def _first_process(info_r: int, timeout: float) -> int | None:
    """A pidfd (or the pid) of the namespace's first process, from bwrap's --info-fd JSON."""
    data = b""
    deadline = time.monotonic() + timeout
    while b"}" not in data and (left := deadline - time.monotonic()) > 0:
        if not select.select([info_r], [], [], left)[0]:
            break
        chunk = os.read(info_r, 4096)
        if not chunk:
            break
        data += chunk
    try:
        pid = int(json.loads(data.decode())["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:  # gone already (the namespace with it), or no pidfd here
        return None


class _Running:
    """One sandboxed interpreter, started by `_start`: its process, the namespace's first process (a pidfd),
    its cgroup, and a reader that keeps the tail of its output (and notes whether `needle` went by)."""

    def __init__(self, proc, first_r, group, workdir, needle: bytes | None):
        self.proc, self.first_r, self.group, self.workdir = proc, first_r, group, workdir
        self.first = None
        self.tail, self.seen, self.needle = bytearray(), False, needle
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        carry = b""
        while chunk := self.proc.stdout.read1(65536):
            if self.needle:
                self.seen = self.seen or self.needle in carry + chunk
                carry = chunk[-len(self.needle):]
            self.tail.extend(chunk)
            del self.tail[:-8192]

    def feed(self, source: str, deadline: float) -> None:
        """Write the program to its stdin and learn the namespace's first process."""
        try:
            self.proc.stdin.write(source.encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        if self.first_r is not None:
            self.first = _first_process(self.first_r, max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Nothing may outlive the call: the namespace's first process (and with it the whole PID namespace),
        everything in the cgroup, and bwrap's process group (without bwrap: the program's)."""
        if self.first is not None:
            try:
                signal.pidfd_send_signal(self.first, signal.SIGKILL)
            except OSError:
                pass
            os.close(self.first)
            try:  # bwrap, its parent, reaps it and exits: killed first, it left it a zombie of the host's init
                self.proc.wait(timeout=REAP_S)
            except subprocess.TimeoutExpired:
                pass
        if self.group:
            self.group.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.reader.join(timeout=5)
        if self.first_r is not None:
            os.close(self.first_r)
        if self.group:
            self.group.remove()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def output(self) -> str:
        text = bytes(self.tail)
        if self.needle:
            text = text.replace(b"\n" + self.needle + b"\n", b"")
        return text.decode(errors="replace")


def _disposable() -> None:
    """(In a child before exec) the first process the kernel's OOM killer takes: anything sandboxed or judged
    goes before the trainer that started it (raising one's own score needs no privilege)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _start(limits: Limits, needle: bytes | None = None, fds: tuple[int, ...] = ()) -> _Running:
    """Start the sandboxed interpreter that runs the program it reads on stdin (see the module docstring);
    `fds` stay open in it under the same numbers."""
    mode = isolation()
    root = _drops_to_nobody()
    workdir = tmp = None
    group = _Cgroup(limits) if cgroups() else None
    info_r, info_w = os.pipe() if mode == "bubblewrap" else (None, None)
    if mode == "bubblewrap":
        # bwrap keeps the caller's process limit (its user namespace is charged against it at the caller's level);
        # the program's own limit, set inside, binds its namespace: per call
        rlimits = _rlimits(limits, None)
        python = [_python(), "-I", "-S", "-c", _START.format(n=limits.nproc)]
        tmp = os.path.join(_stash(), "tmp") if root else None
        cmd = _bwrap_args(limits, python, tmp, info_w)
    else:
        _warn_once()
        rlimits = _rlimits(limits, limits.nproc if root else _own_tasks() + limits.nproc)
        workdir = tempfile.mkdtemp(prefix="dare-sandbox-")
        if root:
            os.chown(workdir, NOBODY, NOBODY)
        cmd = [_python(), "-I", "-S", "-"]
    closed = _closed_folder(_prefix()) if root else None
    helper = root and (mode == "bubblewrap" or closed)
    if helper:  # root: the helper mounts /tmp (and re-exposes the interpreter), sets the limits, becomes nobody
        cfg = {"prefix": _prefix(), "closed": closed, "stash": _stash(), "rlimits": rlimits, "uid": NOBODY,
               "tmp": tmp and {"path": tmp, "options": f"size={limits.tmpfs_mb}m,nr_inodes={limits.tmpfs_inodes},"
                                                       f"mode=1777"}}
        cmd = [_python(), "-I", "-S", "-c", _HELPER, marshal.dumps(cfg).hex(), *cmd]

    def before_exec():  # in the child: its cgroup; limits, then (root) nobody, unless the helper does both
        _disposable()
        if group:
            group.join()
        if helper:
            return
        import resource

        for name, value in rlimits:
            resource.setrlimit(getattr(resource, name), value)
        if root:
            _become_nobody()

    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **({"HOME": workdir} if workdir else {})}
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env, cwd=workdir or "/", preexec_fn=before_exec,
                                pass_fds=(*fds, *((info_w,) if info_w is not None else ())))
    except BaseException:
        if group:
            group.remove()
        if info_r is not None:
            os.close(info_r)
        raise
    finally:
        if info_w is not None:
            os.close(info_w)
    return _Running(proc, info_r, group, workdir, needle)


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Run one Python program in the sandbox; it passes when it runs to its end (module docstring)."""
    token = secrets.token_hex(16)
    start = time.monotonic()
    run = _start(limits, needle=token.encode())
    status = None
    try:
        run.feed(source + _end_token_line(token), start + limits.wall_s)
        run.proc.wait(timeout=max(0.0, limits.wall_s - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        status = "timeout"
    finally:
        run.stop()
    rc = None if status == "timeout" else run.proc.returncode
    if status is None:
        status = "passed" if rc == 0 and run.seen else "failed"
    return Outcome(passed=status == "passed", status=status, returncode=rc, output=run.output(),
                   wall_s=time.monotonic() - start, completed=run.seen)


@dataclass(frozen=True)
class Tests:
    """What the judge runs (`dare.rewards.plain.judge`): `setup` (the task's own code: a HumanEval prompt
    and its `check`, an MBPP task's setup code), then `then` (`check(f)`, the asserts), with the judged
    code's functions named in `force` always taken from the judged end (the prompt's stub of the entry point
    would otherwise hide it)."""

    setup: str
    then: str
    force: tuple[str, ...] = ()


class _Zygote:
    """The judges' parent (`plain.zygote`) of this process, started at first use (again after a fork or if
    it died): a small interpreter outside any sandbox, run as the caller, that forks one judge per program."""

    owner, sock, proc = None, None, None
    lock = threading.Lock()

    @classmethod
    def send(cls, header: bytes, fds: list[int]) -> None:
        with cls.lock:
            for attempt in (0, 1):
                if cls.owner != os.getpid() or cls.proc.poll() is not None:
                    cls._start()
                try:
                    socket.send_fds(cls.sock, [header], fds)
                    return
                except OSError:
                    if attempt:
                        raise
                    cls.owner = None

    @classmethod
    def _start(cls) -> None:
        if cls.sock is not None:  # a dead zygote's, or (after a fork) the parent's: this process's copy
            cls.sock.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        source = _plain_source() + f"\nzygote({theirs.fileno()})\n"
        cls.proc = subprocess.Popen([_python(), "-I", "-S", "-c", source], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/",
                                    preexec_fn=_disposable, pass_fds=(theirs.fileno(),))
        theirs.close()
        cls.sock, cls.owner = ours, os.getpid()


_SERVE = "\nserve({code!r}, {requests}, {replies})\n"


@functools.cache
def _plain_source() -> str:
    with open(os.path.join(os.path.dirname(__file__), "plain.py")) as f:
        return f.read()


def run_judged(code: str, tests: Tests, limits: Limits = Limits()) -> Outcome:
    """Run `code` (model-written) in the sandbox and `tests` in a separate judge process, outside it, that
    calls its functions through plain data (`dare.rewards.plain`); it passes when the judge ran the tests to
    their end. `output`: the judged program's output tail, then the judge's reason for a failure."""
    start = time.monotonic()
    deadline = start + limits.wall_s
    pipes = [os.pipe() for _ in range(4)]  # spec (to the judge), requests, replies, verdict (from the judge)
    (spec_r, spec_w), (requests_r, requests_w), (replies_r, replies_w), (verdict_r, verdict_w) = pipes
    open_fds = {fd for pair in pipes for fd in pair}

    def close(*fds):
        for fd in fds:
            os.close(fd)
            open_fds.discard(fd)

    run, status, verdict = None, None, b""
    try:
        _Zygote.send(int(limits.wall_s).to_bytes(4, "big") + int(limits.cpu_s).to_bytes(4, "big"),
                     [spec_r, requests_w, replies_r, verdict_w])
        close(spec_r, requests_w, replies_r, verdict_w)
        spec = plain.encode((tests.setup, tests.then, list(tests.force)))
        try:
            while spec:
                spec = spec[os.write(spec_w, spec):]
        except BrokenPipeError:
            pass
        close(spec_w)
        run = _start(limits, fds=(requests_r, replies_w))
        run.feed(_plain_source() + _SERVE.format(code=code, requests=requests_r, replies=replies_w), deadline)
        close(requests_r, replies_w)
        while len(verdict) < 4096:
            if not select.select([verdict_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                status = "timeout"
                break
            chunk = os.read(verdict_r, 4096 - len(verdict))
            if not chunk:
                break
            verdict += chunk
    finally:
        close(*list(open_fds))
        if run is not None:
            run.stop()
    passed = status is None and verdict == b"P"
    status = status or ("passed" if passed else "failed")
    reason = verdict[1:].decode(errors="replace") if verdict.startswith(b"F") else ""
    output = (run.output() if run is not None else "") + (f"\n[judge] {reason}" if reason else "")
    return Outcome(passed=passed, status=status, returncode=None, output=output, wall_s=time.monotonic() - start,
                   completed=passed)


def run_programs(sources: list[str], limits: Limits = Limits(), workers: int | None = None) -> list[Outcome]:
    """Run many programs, `workers` sandboxes at a time (default: one per CPU core)."""
    return _parallel(lambda s: run_program(s, limits), sources, workers)


def run_judged_many(pairs: list[tuple[str, Tests]], limits: Limits = Limits(),
                    workers: int | None = None) -> list[Outcome]:
    """`run_judged` for many (code, tests) pairs, `workers` at a time (default: one per CPU core)."""
    return _parallel(lambda pair: run_judged(pair[0], pair[1], limits), pairs, workers)


def _parallel(run, items: list, workers: int | None) -> list[Outcome]:
    isolation()  # a missing sandbox is one clear error before any program
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        return [run(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run, items))
