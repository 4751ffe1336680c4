"""The benchmarks' memory probes: each a module run by `run` as `python -m dare.app.probes.<name> args...` in a
fresh process, so that the peak it measures is its own span's (`peak_start` ... `peak_now`), and printing one JSON
line (the last line of its output), which `run` returns.

- `loss_memory`  the loss and backward with full logits, chunked, or fused (recomputed in backward) (`dare bench train`)
- `vrpo_memory`  VRPO's update with every draw's graph alive vs one at a time (`dare bench train`)
- `bgpo_memory`  BGPO's update, the same comparison (`dare bench estimators`)
- `train_memory` two float32 training steps of a LLaDA of a given size: `dare plan`'s calibration (`tests/test_plan.py`)

Importing this package is cheap (no torch): the probes import what they measure themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys

from dare.utils import REPO_ROOT


def run(probe: str, *args, baselines: bool = False) -> dict:
    """Run the probe module `probe` with `args` in a fresh process and return its JSON line. `baselines`: the probe
    imports baselines, so it runs on this checkout (`baselines/` and `shared/` on its path, whatever the caller's
    folder), in a bare environment with one thread."""
    env = None
    if baselines:
        env = {"PYTHONPATH": f"{REPO_ROOT}:{REPO_ROOT / 'shared'}", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", f"{__name__}.{probe}", *map(str, args)], capture_output=True, text=True,
                       check=True, env=env)
    return json.loads(r.stdout.strip().splitlines()[-1])


def peak_start() -> int:
    """The process's resident memory (KiB) now, with the kernel's peak-RSS mark reset to it (clear_refs 5):
    getrusage's ru_maxrss would carry the parent's peak over the exec into this process, hiding any peak below it.
    A span's peak: `before = peak_start()` ... `peak_now() - before`."""
    open("/proc/self/clear_refs", "w").write("5")
    return _status("VmRSS")


def peak_now() -> int:
    """The process's peak resident memory (KiB) since `peak_start`."""
    return _status("VmHWM")


def _status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
