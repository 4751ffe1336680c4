"""Small helpers shared by the core: atomic writes, the workspace's locations, provenance.

The library reads and writes only the workspace locations named here (`runs_dir`, and
`dare.data.data_dir` for the datasets), each overridable by an environment variable; the
repository's source folders (baselines/, reproductions/, leaderboard/, tests/) are known only to
the application wing, `dare.app`."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path


class UserError(Exception):
    """Bad input (config, data, paths, names): reported as one clear line, before compute starts."""


PACKAGE_ROOT = Path(__file__).resolve().parent
# The monorepo checkout: shared/dare/utils.py -> shared/dare -> shared -> <repo>.
REPO_ROOT = PACKAGE_ROOT.parent.parent


def workspace(*parts: str) -> Path:
    """A workspace location of the checkout (`runs`, `data`, `.venv`): where the library writes and
    reads by default when no environment variable names another place."""
    return REPO_ROOT.joinpath(*parts)


def runs_dir() -> Path:
    """Where runs, evaluations and benchmarks are written: `$DARE_RUNS`, else `runs/` in the checkout."""
    return Path(os.environ.get("DARE_RUNS", workspace("runs")))


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
        with os.fdopen(fd, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


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


def package_versions(names=("dare-dllm", "torch", "transformers", "tokenizers", "numpy")) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def hardware() -> dict:
    info = {"cpu": platform.processor() or platform.machine(), "n_cpus": os.cpu_count() or 0,
            "gpu": None, "n_gpus": 0, "nodes": int(os.environ.get("SLURM_NNODES", "1"))}
    torch = sys.modules.get("torch")  # never import torch just to describe the machine
    if torch is not None and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["n_gpus"] = torch.cuda.device_count()
    return info


def derive_seed(seed: int, stream: str) -> int:
    """An independent 63-bit seed per purpose ("data", "noise", "rollout", ...) of a run seed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{stream}".encode()).digest()[:8], "little") >> 1


def make_generator(seed: int, stream: str, device="cpu"):
    """A private `torch.Generator` for one purpose; nothing in the project reseeds the global RNG."""
    import torch

    return torch.Generator(device=device).manual_seed(derive_seed(seed, stream))
