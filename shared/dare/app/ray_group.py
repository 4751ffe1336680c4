"""A Ray worker group for the trainer.

`train_with_workers(name, config, overrides, n)` starts n Ray actors (one GPU each when the
cluster has GPUs, else CPU workers), gives them the environment a torch launcher would
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT of rank 0's node), and runs the same
`dare.train.train` in each; `dare.train.dist.setup_dist` then forms the process group (NCCL
or gloo) and shards the model with FSDP2. This is verl's worker-group layout without its
framework: Ray places the workers (on one machine, or across a cluster started with
`ray start`), torch does the communication.

Ray connects to a running cluster when RAY_ADDRESS is set (or `address=` is given), otherwise it
starts a local one sized for the group.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from dare.utils import REPO_ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class _Worker:
    """One training process (wrapped with `ray.remote` on use)."""

    def node(self) -> tuple[str, int]:
        import ray

        return ray.util.get_node_ip_address(), _free_port()

    def run(self, env: dict, name: str, config_path, overrides: list[str], force: bool) -> str:
        os.environ.update(env)
        from dare.app.runs import train

        try:
            return str(train(name, config_path, overrides, force=force))
        except SystemExit as e:  # preemption exits 128 + signal; report it as a failure with the code
            raise RuntimeError(f"rank {env['RANK']} exited with {e.code}") from None


def train_with_workers(name: str, config_path, overrides, workers: int, *, force: bool = False,
                       address: str | None = None, cpus_per_worker: int = 1) -> Path:
    """Run `dare train` as a group of `workers` Ray actors; returns the run directory."""
    import ray
    import torch

    if workers < 1:
        raise ValueError("workers must be >= 1")
    started = not ray.is_initialized()
    if started:
        # the workers import `dare` and `baselines` from this checkout
        runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
            [str(REPO_ROOT / "shared"), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}}
        kwargs = {"address": address or os.environ.get("RAY_ADDRESS")} if (address or os.environ.get(
            "RAY_ADDRESS")) else {"num_cpus": workers * cpus_per_worker, "include_dashboard": False}
        ray.init(runtime_env=runtime_env, log_to_driver=True, **kwargs)
    try:
        gpus = 1 if torch.cuda.is_available() or ray.cluster_resources().get("GPU", 0) >= workers else 0
        actor = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus)(_Worker)
        group = [actor.remote() for _ in range(workers)]
        master, port = ray.get(group[0].node.remote())
        nodes = ray.get([w.node.remote() for w in group])
        local_rank, seen = [], {}
        for ip, _ in nodes:
            local_rank.append(seen.get(ip, 0))
            seen[ip] = seen.get(ip, 0) + 1
        threads = str(cpus_per_worker)
        # with GPUs Ray pins one per actor (CUDA_VISIBLE_DEVICES), so each actor's local rank is 0
        runs = [w.run.remote({"RANK": str(r), "LOCAL_RANK": "0" if gpus else str(local_rank[r]),
                              "WORLD_SIZE": str(workers),
                              "LOCAL_WORLD_SIZE": str(seen[nodes[r][0]]), "MASTER_ADDR": master,
                              "MASTER_PORT": str(port), "OMP_NUM_THREADS": threads},
                             name, str(config_path) if config_path else None, list(overrides), force)
                for r, w in enumerate(group)]
        return Path(ray.get(runs)[0])
    finally:
        if started:
            ray.shutdown()
