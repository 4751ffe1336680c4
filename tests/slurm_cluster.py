"""A real one-node SLURM cluster on this host for the sweep tests: Debian's slurm-wlm and munge
(installed by `make slurm`), munged + slurmctld + slurmd with their key, state, spool, logs and
ports in a temporary folder. Stopped by pid when the fixture ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.pids: list[Path] = []

    def start(self) -> None:
        r = subprocess.run(["make", "-s", "slurm"], cwd=REPO, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"make slurm failed: {r.stderr[-1000:]}")
        if os.geteuid() != 0:
            raise RuntimeError("the one-node cluster runs its daemons as root (SlurmUser=root)")
        d = self.root
        for sub in ("state", "spool"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        subprocess.run(["munged", f"--key-file={key}", f"--socket={d / 'munge.socket'}",
                        f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munge.seed'}",
                        f"--log-file={d / 'munged.log'}", "--force"], check=True)
        self.pids.append(d / "munged.pid")
        host = socket.gethostname()
        cpus = os.cpu_count() or 2
        self.conf.write_text("\n".join([
            "ClusterName=dare-test", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={d / 'munge.socket'}", "CredType=cred/munge",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "MpiDefault=none", "ReturnToService=2", "JobRequeue=1",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin", "MinJobAge=300", "KillWait=30",
            f"NodeName={host} CPUs={cpus} RealMemory=16000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=self.env)
        self.pids.append(d / "slurmctld.pid")
        subprocess.run(["slurmd", "-f", str(self.conf)], check=True, env=self.env)
        self.pids.append(d / "slurmd.pid")
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.env)
            if out.returncode == 0 and out.stdout.strip() in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the node did not come up: {out.stdout} {out.stderr}")

    def queue(self) -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, env=self.env)
        return [line for line in out.stdout.splitlines() if line.strip()]

    def wait_empty(self, timeout: float = 600) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.queue():
                return
            time.sleep(1)
        raise TimeoutError(f"jobs still queued: {self.queue()}")

    def stop(self) -> None:
        for pid_file in reversed(self.pids):
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        time.sleep(1)
