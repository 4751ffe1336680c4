"""Small helpers shared by the core: atomic writes, the workspace's locations, provenance.

The library writes only to the locations named here, relative to the working directory as HF
Trainer and torchtune do: `runs_dir` (`$DARE_RUNS`, else `./runs`) and `dare.data.data_dir`
(`$DARE_DATA`, else `./data`). Files are written with the permissions the umask allows, so
collaborators can read results and checkpoints. The repository's source folders (baselines/,
reproductions/, leaderboard/, tests/) are known only to the application wing, `dare.app`."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path


class UserError(Exception):
    """Bad input (config, data, paths, names): reported as one clear line, before compute starts."""


SHOWN_VALUE_CHARS = 200
"""The most characters of a value an error message echoes (a value can be megabytes long)."""


def shown_value(value, limit: int = SHOWN_VALUE_CHARS) -> str:
    """`repr(value)` for an error message, cut to `limit` characters (with how long it was)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class YAMLAliasError(UserError, ValueError):
    """A user YAML with an anchor or alias (`&name`, `*name`): refused, so a small file cannot expand
    into gigabytes (the "billion laughs" of nested aliases)."""


YAML_ALIASES_REFUSED = "YAML anchors and aliases (&name, *name) are not allowed; write the values out"


class _Alias(Exception):
    def __init__(self, mark):
        self.mark = mark


def _strict_yaml_loader():
    """yaml.SafeLoader that refuses any node with an anchor and any alias, before composing it."""
    global _STRICT_LOADER
    if _STRICT_LOADER is None:
        import yaml

        class StrictLoader(yaml.SafeLoader):
            def compose_node(self, parent, index):
                event = self.peek_event()
                if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                    raise _Alias(event.start_mark)
                return super().compose_node(parent, index)

        _STRICT_LOADER = StrictLoader
    return _STRICT_LOADER


_STRICT_LOADER = None


def load_yaml(text: str, source: str = "YAML"):
    """`yaml.safe_load(text)` for user input (config files, overrides, sweep and targets files): an anchor
    or alias raises `YAMLAliasError` naming `source` and the line; other YAML errors raise as yaml's own."""
    import yaml

    try:
        return yaml.load(text, Loader=_strict_yaml_loader())
    except _Alias as e:
        where = f", line {e.mark.line + 1}, column {e.mark.column + 1}" if e.mark is not None else ""
        raise YAMLAliasError(f"{source}{where}: {YAML_ALIASES_REFUSED}") from None


PACKAGE_ROOT = Path(__file__).resolve().parent
# The monorepo checkout: shared/dare/utils.py -> shared/dare -> shared -> <repo>.
REPO_ROOT = PACKAGE_ROOT.parent.parent


def workspace(*parts: str) -> Path:
    """A location in the checkout (the environments under `.venv`)."""
    return REPO_ROOT.joinpath(*parts)


def runs_dir() -> Path:
    """Where runs, evaluations and benchmarks are written: `$DARE_RUNS`, else `runs/` in the working
    directory."""
    return Path(os.environ.get("DARE_RUNS") or Path.cwd() / "runs")


def shown_path(path: str | os.PathLike) -> str:
    """A path as records show it: relative to the working directory or the checkout when inside one
    of them (no machine-specific prefix in committed results), else as given."""
    p = Path(path).absolute()
    for root in (Path.cwd(), REPO_ROOT):
        if p.is_relative_to(root):
            return str(p.relative_to(root))
    return str(path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def now() -> str:
    """UTC time stamp of records (run status, results)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` to `path` so that readers see either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        with os.fdopen(fd, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            raise UserError(f"{path}: could not write it: {e.strerror} on {path.parent}; the previous "
                            f"{path.name} (if any) is unchanged") from None
        raise
    return path


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
"""The errors of a full disk (or quota): reported as one line naming the path, nothing half-written left."""


def umask_permissions(folder: str | os.PathLike) -> None:
    """Give every file under `folder` the permissions the umask allows (writers such as safetensors
    create their files 0600, which would hide checkpoints from collaborators)."""
    mode = 0o666 & ~_umask()
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def replace_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Move a fully written directory into place; an older `final_dir` is removed only after."""
    final_dir = Path(final_dir)
    old = final_dir.with_name(final_dir.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final_dir.exists():
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    if old.exists():
        shutil.rmtree(old)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_state(cwd: Path = REPO_ROOT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout, or (None, None) outside a git work tree.

    Dirty means tracked files differ from HEAD; untracked files (runs, data) do not count."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                                text=True, check=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, bool(status.strip())


OPTIONAL_PACKAGES = ("flash-attn", "lmdeploy", "vllm", "opencompass", "peft")


def package_versions(names=("dare-dllm", "torch", "transformers", "tokenizers", "numpy")) -> dict[str, str]:
    """Versions of `names` and of the optional accelerators when installed (flash-attn, lmdeploy, ...)."""
    out = {"python": platform.python_version()}
    for name in (*names, *OPTIONAL_PACKAGES):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict:
    """The machine a number was measured on: CPU model, the instruction set torch dispatches its
    kernels to, threads and BLAS; GPU name, compute capability, driver, CUDA/cuDNN/NCCL versions.
    Two machines with the same code and seeds can differ in float rounding through any of these.
    Torch-dependent fields are filled only when torch is already imported (never imported here)."""
    info = {"cpu": platform.machine(), "cpu_model": cpu_model(), "n_cpus": os.cpu_count() or 0,
            "gpu": None, "n_gpus": 0, "nodes": int(os.environ.get("SLURM_NNODES", "1"))}
    torch = sys.modules.get("torch")
    if torch is None:
        return info
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    info.update(cpu_capability=torch.backends.cpu.get_cpu_capability(), threads=torch.get_num_threads(),
                blas=blas and blas.group(1), deterministic=torch.are_deterministic_algorithms_enabled())
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        info.update(gpu=torch.cuda.get_device_name(0), n_gpus=torch.cuda.device_count(),
                    gpu_capability=f"{major}.{minor}", driver=_nvidia_driver(), cuda=torch.version.cuda,
                    cudnn=str(torch.backends.cudnn.version()), cudnn_deterministic=torch.backends.cudnn.deterministic,
                    cudnn_benchmark=torch.backends.cudnn.benchmark,
                    nccl=".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available()
                    else None)
    return info


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


LOCK_RECORD = "dare-lock.json"  # written into a venv by `make setup` / `make eval-env`: {"lock", "sha256"}


def environment_lock() -> dict | None:
    """The lock file this interpreter's environment was installed from ({"lock": name, "sha256": ...}),
    as recorded in the venv by the Makefile; None for environments installed otherwise."""
    try:
        record = json.loads((Path(sys.prefix) / LOCK_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and {"lock", "sha256"} <= set(record) else None


def package_name(name: str) -> str:
    """A distribution name as package indexes compare them (PEP 503: `Foo_bar.baz` -> `foo-bar-baz`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(text: str) -> dict[str, str]:
    """name -> version of every package a lock file pins (`name==version` lines; names normalised)."""
    return {package_name(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


def record_lock(lock: str | os.PathLike) -> Path:
    """Record in this environment (`<sys.prefix>/dare-lock.json`) the lock file it was installed
    from, after checking that every package the lock pins is installed at that version: the record
    then says what the environment holds. Results and `dare env` report it."""
    path = Path(lock)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"lock file {path}: {e.strerror}") from None
    text = data.decode(errors="replace")
    pins = lock_pins(text)
    if not pins or "--hash=" not in text:
        raise UserError(f"{path}: not a hashed lock file (no `name==version` lines with --hash)")
    wrong = []
    for name, version in sorted(pins.items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "not installed"
        if installed != version:
            wrong.append(f"{name} {installed} (lock {version})")
    if wrong:
        raise UserError(f"this environment ({sys.prefix}) does not hold {path}: {len(wrong)} packages differ: "
                        + ", ".join(wrong[:5]) + (" ..." if len(wrong) > 5 else "")
                        + f"; install it with `pip install --no-deps --require-hashes -r {path}`")
    return atomic_write_json(Path(sys.prefix) / LOCK_RECORD,
                             {"lock": shown_path(path.resolve()), "sha256": hashlib.sha256(data).hexdigest()})


def command_line() -> str:
    """This process's command as typed (`dare ...`, `python -m dare.app.sweep ...`), for provenance;
    path arguments inside the working directory or the checkout are shown relative (`shown_path`)."""
    import shlex

    main = sys.modules.get("__main__")
    module = getattr(getattr(main, "__spec__", None), "name", None)
    argv = list(sys.argv)
    if module:  # python -m <module>: argv[0] is the module's file
        argv = ["python", "-m", module.removesuffix(".__main__"), *argv[1:]]
    elif argv and Path(argv[0]).name in ("dare", "cli.py"):
        argv[0] = "dare"
    return shlex.join(shown_argument(a) for a in argv)


def shown_argument(arg: str) -> str:
    """A command-line argument as records show it: an absolute path (or `key=<absolute path>`) inside
    the working directory or the checkout becomes relative."""
    key, sep, value = arg.rpartition("=") if "=" in arg else ("", "", arg)
    return f"{key}{sep}{shown_path(value)}" if value.startswith("/") else arg


def environment_fingerprint() -> dict:
    """The machine and the installed environment: hardware, package versions, the lock."""
    return {"hardware": hardware(), "packages": package_versions(), "lock": environment_lock()}


def fingerprint() -> dict:
    """Everything a bug report or a result needs to say which machine and environment made it:
    `environment_fingerprint` plus the checkout's git state and this process's command."""
    return {**environment_fingerprint(), "git": dict(zip(("commit", "dirty"), git_state())),
            "command": command_line()}


def derive_seed(seed: int, stream: str) -> int:
    """An independent 63-bit seed per purpose ("data", "noise", "rollout", ...) of a run seed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{stream}".encode()).digest()[:8], "little") >> 1


def make_generator(seed: int, stream: str, device="cpu"):
    """A private `torch.Generator` for one purpose; nothing in the project reseeds the global RNG."""
    import torch

    return torch.Generator(device=device).manual_seed(derive_seed(seed, stream))
