"""Fault drills with real processes: `kill -9` mid-run then rerun the same command, and SIGTERM
(SLURM preemption) which checkpoints before exiting; both end with the same final weights as an
uninterrupted run (bitwise, CPU, one process)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.scratch.d_model=32", "model.scratch.n_heads=2", "model.scratch.n_layers=1",
        "model.scratch.mlp_hidden_size=64", "train.batch_size=16", "train.lr=1e-3", "train.warmup_steps=2",
        "algo.response_length=4", "run.log_every=1", "run.threads=1"]
STEPS = 150


def command(out: Path) -> list[str]:
    dare = str(Path(sys.executable).with_name("dare"))
    return [dare, "train", "sft", *TINY, f"train.steps={STEPS}", "run.save_every=10", f"run.out_dir={out}"]


def weights(out: Path) -> dict:
    return load_file(str(out / "final" / "model.safetensors"))


def wait_for_checkpoint(out: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(p.name[5:].isdigit() for p in (out / "checkpoints").glob("step_*")):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


def test_kill_9_then_rerun_reaches_the_uninterrupted_weights(tmp_path):
    ref = tmp_path / "ref"
    subprocess.run(command(ref), check=True, capture_output=True, cwd=REPO, timeout=600)
    out = tmp_path / "killed"
    proc = subprocess.Popen(command(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    wait_for_checkpoint(out, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert json.loads((out / "run.json").read_text())["status"] == "running"  # died mid-run
    assert not (out / "final").exists()
    subprocess.run(command(out), check=True, capture_output=True, cwd=REPO, timeout=600)  # the same command
    a, b = weights(ref), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # the log is continuous: nothing lost, nothing twice


def test_a_second_train_in_the_same_run_folder_refuses_and_a_killed_run_leaves_no_lock(tmp_path):
    """Two `dare train` on one run folder: the second exits at once with a message naming the running one, which
    goes on untouched; after a `kill -9` of the first the same command starts (and resumes) at once."""
    out = tmp_path / "run"
    long = [*command(out)[:-3], "train.steps=100000", "run.save_every=10", f"run.out_dir={out}"]
    first = subprocess.Popen(long, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    wait_for_checkpoint(out, first)
    second = subprocess.run(long, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert second.returncode == 2, second.stderr
    assert f"another `dare train` is running in this run folder (pid {first.pid})" in second.stderr
    assert first.poll() is None  # the running one is untouched
    first.send_signal(signal.SIGKILL)
    first.wait()
    done = max(int(p.name[5:]) for p in (out / "checkpoints").glob("step_*") if p.name[5:].isdigit())
    third = subprocess.Popen(long, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    end = time.monotonic() + 300
    while time.monotonic() < end and not any(int(p.name[5:]) > done for p in (out / "checkpoints").glob("step_*")
                                              if p.name[5:].isdigit()):
        assert third.poll() is None, third.communicate()
        time.sleep(0.05)
    third.send_signal(signal.SIGKILL)
    assert f"resuming from {out / 'checkpoints'}" in third.communicate()[0]


def _interrupted_copy(ref: Path, out: Path) -> None:
    """`out` as `ref` was before its last steps: its kept checkpoints, its run.json saying running."""
    shutil.copytree(ref / "checkpoints", out / "checkpoints")
    (out / "run.json").write_text(json.dumps({**json.loads((ref / "run.json").read_text()), "status": "running"}))


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(tmp_path):
    """Checkpoints record their files' sha256: a truncated shard in the latest one is found at resume, which says so
    and resumes from the one before (the last two are kept), reaching the uninterrupted run's weights; with every
    kept checkpoint damaged it stops with one clear line."""
    ref = tmp_path / "ref"
    subprocess.run(command(ref), check=True, capture_output=True, cwd=REPO, timeout=600)
    assert sorted(p.name for p in (ref / "checkpoints").glob("step_*")) == ["step_0000130", "step_0000140"]
    out = tmp_path / "damaged"
    _interrupted_copy(ref, out)
    shard = next((out / "checkpoints" / "step_0000140" / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a write cut short
    r = subprocess.run(command(out), capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "step_0000140 is damaged (dcp/" in r.stderr and "resuming from" in r.stdout and "step_0000130" in r.stdout
    a, b = weights(ref), weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    every = tmp_path / "all_damaged"
    _interrupted_copy(ref, every)
    for state in (every / "checkpoints").glob("step_*/trainer_state.pt"):
        state.write_bytes(b"not a checkpoint")
    r = subprocess.run(command(every), capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 2 and "no checkpoint can be resumed" in r.stderr and "trainer_state.pt is not the file" in r.stderr


def test_sigterm_checkpoints_exits_for_requeue_and_resumes(tmp_path):
    ref = tmp_path / "ref"
    subprocess.run(command(ref), check=True, capture_output=True, cwd=REPO, timeout=600)
    out = tmp_path / "preempted"
    proc = subprocess.Popen(command(out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    wait_for_checkpoint(out, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "preempted" and "resume" in err
    # the checkpoint is of the very step at which the signal was handled, not the last periodic one
    latest = max(int(p.name[5:]) for p in (out / "checkpoints").glob("step_*") if p.name[5:].isdigit())
    assert latest == status["step"]
    subprocess.run(command(out), check=True, capture_output=True, cwd=REPO, timeout=600)
    a, b = weights(ref), weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((out / "run.json").read_text())["status"] == "done"
    assert os.path.exists(out / "final" / "dare.json")


def test_dare_eval_names_a_broken_checkpoint_in_one_line_before_decoding(tmp_path, trained_tiny, char_tok):
    """Truncated weights, a missing tokenizer, a config of an unknown family: `dare eval` stops at once
    with one line naming the file and the problem (no traceback), before any decoding or result."""
    from dare.models.tokenizer import save_tokenizer

    good = tmp_path / "good"
    trained_tiny.save_pretrained(good)
    save_tokenizer(char_tok, good)
    cases = {}
    for name in ("truncated", "no_tokenizer", "unknown_family"):
        shutil.copytree(good, tmp_path / name)
    weights_file = tmp_path / "truncated" / "model.safetensors"
    size = weights_file.stat().st_size
    os.truncate(weights_file, size // 2)
    cases["truncated"] = f"{weights_file}: truncated: {size // 2:,} bytes, its header describes {size:,}"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "no_tokenizer" / f).unlink()
    cases["no_tokenizer"] = f"{tmp_path / 'no_tokenizer'}: no tokenizer (tokenizer.json, tokenizer_config.json"
    config = tmp_path / "unknown_family" / "config.json"
    config.write_text(config.read_text().replace('"model_type": "llada"', '"model_type": "mystery"'))
    cases["unknown_family"] = f"{config}: model_type 'mystery' is not a family dare knows"
    dare = str(Path(sys.executable).with_name("dare"))
    for name, message in cases.items():
        out = tmp_path / f"{name}-eval"
        r = subprocess.run([dare, "eval", str(tmp_path / name), "--out", str(out), "eval.n_samples=8"],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), (name, r.stderr)
        assert not out.exists()  # nothing decoded, nothing written


@pytest.fixture
def small_disk(tmp_path):
    """A real 600 KiB filesystem (tmpfs), room for the run's small files and one checkpoint of the TINY
    model (about 340 KiB) but not two. Needs root (mount); skipped otherwise, saying why."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or 'not root'})")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint_and_names_the_path(tmp_path, small_disk):
    """A checkpoint that does not fit: the run stops with one line naming the partial folder (removed) and the
    last complete checkpoint, which stays intact; with space freed, the same command resumes from it to the
    uninterrupted run's weights. A result file that does not fit: one line naming it, the old file unchanged."""
    steps = ["train.steps=15", "run.save_every=5"]
    dare = str(Path(sys.executable).with_name("dare"))
    ref = tmp_path / "ref"
    subprocess.run([dare, "train", "sft", *TINY, *steps, f"run.out_dir={ref}"], check=True, capture_output=True,
                   cwd=REPO, timeout=600)
    out = small_disk / "run"
    cmd = [dare, "train", "sft", *TINY, *steps, f"run.out_dir={out}"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode != 0 and len(lines) == 1, r.stderr[-2000:]
    assert f"checkpoint {out / 'checkpoints' / 'step_0000010.tmp'}: No space left on device" in lines[0]
    assert f"the last complete checkpoint is {out / 'checkpoints' / 'step_0000005'}" in lines[0]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_0000005"]  # no partial folder left
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)  # space freed
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0 and "step_0000005" in r.stdout, r.stderr[-2000:]  # resumed from the kept checkpoint
    a, b = weights(ref), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a result (any atomic write) that does not fit: the old file stays, the error names the path
    from dare.utils import UserError, atomic_write

    result = small_disk / "result.json"
    atomic_write(result, "{}\n")
    free = os.statvfs(small_disk)
    (small_disk / "filler").write_bytes(b"\0" * (free.f_bavail * free.f_frsize - 8192))  # all but 8 KiB
    with pytest.raises(UserError, match=f"{result}: could not write it: No space left on device"):
        atomic_write(result, "x" * (64 << 10))
    assert result.read_text() == "{}\n" and [p.name for p in small_disk.iterdir() if p.name.startswith(".")] == []
