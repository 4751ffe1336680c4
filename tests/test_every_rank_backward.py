"""Every process runs every forward and backward under FSDP2, even one with nothing to train.

Two real processes (torchrun, gloo, FSDP2) make one TraceRL update of a tiny LLaDA on the masked path; the second
process's rows answer with EOS only, so none of its micro-batches holds a trained token (TraceRL drops EOS targets,
as `rl_llada.py` does): its trajectory replay has no round to score and its loss would have no graph. The step must
complete (the replays run as many rounds and head calls on every process, the extra ones scoring nothing, and the
second process backpropagates a zero through the model), and the weights after it must equal those of one plain
process that trains on the whole batch. A chunk of 2 positions per head call makes the first process call the head
several times a forward: the second process keeps pace with calls over no position.

Without the collective replays (the estimators as they were) the first process waits forever in a collective the
second never joins (checked by hand with `every_rank_backward` and the rounds/chunks agreement disabled: the run
hit the 120 s timeout)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dare.config import ScratchModelConfig
from dare.models import facts, new_model
from dare.models.tokenizer import char_tokenizer, save_tokenizer

WORKER = Path(__file__).with_name("backward_worker.py")
REPO = Path(__file__).resolve().parent.parent


def _spec(tok, eos: int) -> dict:
    ids = lambda text: [tok.convert_tokens_to_ids(c) for c in text]
    offsets = torch.stack([torch.linspace(-0.35, 0.35, 12) * (1 if b % 2 == 0 else -1) for b in range(4)])
    return {"prompts": [ids("12+34"), ids("5+678"), ids("9+9=1"), ids("40+41")],
            "responses": [ids("46=46=46") + [eos] * 4, ids("683") + [eos] + ids("12") + [eos, eos] + ids("7") + [eos] * 3,
                          [eos] * 12, [eos] * 12],
            "steps": [[3, 0, 1, 1, 2, 5, 4, 4, 6, 7, 7, 6], [0, 2, 1, 5, 3, 3, 4, 6, 7, 8, 9, 9],
                      [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5], list(range(11, -1, -1))],
            "rewards": [1.0, 0.0, 1.0, 0.0], "advantages": [0.9, -0.9, 1.0, -1.0], "group_size": 2,
            "old_logps": (-3.0 + offsets).tolist(), "micro_batch_size": 1, "chunk": 2,
            "cfg": {"shrink": 2, "beta": 0.5, "epsilon": 0.2}}


def _run(processes: int, ckpt: Path, spec: Path, out: Path):
    out.mkdir()
    launch = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(processes)] if processes > 1 \
        else [sys.executable]
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{REPO}:{REPO / 'shared'}:{REPO / 'tests'}", "HOME": os.environ.get("HOME", "/tmp")}
    r = subprocess.run([*launch, str(WORKER), str(ckpt), str(spec), str(out)], capture_output=True, text=True,
                       timeout=240, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out / "result.pt", weights_only=False)


def test_a_process_with_nothing_to_train_still_backpropagates_under_fsdp(tmp_path):
    tok = char_tokenizer("0123456789+=", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0)
    model.save_pretrained(tmp_path / "ckpt")
    save_tokenizer(tok, tmp_path / "ckpt")
    (tmp_path / "spec.json").write_text(json.dumps(_spec(tok, facts(model).eos_token_id)))
    one = _run(1, tmp_path / "ckpt", tmp_path / "spec.json", tmp_path / "one")
    two = _run(2, tmp_path / "ckpt", tmp_path / "spec.json", tmp_path / "two")
    ranks = [torch.load(tmp_path / "two" / f"rank{k}.pt")["targets"] for k in (0, 1)]
    assert ranks[0] > 0 and ranks[1] == 0  # the second process has no trained token
    assert one["sums"]["optim/grad_norm"] > 0
    assert two["sums"]["optim/grad_norm"] == pytest.approx(one["sums"]["optim/grad_norm"], rel=1e-5)
    assert two["sums"]["loss/total"] == pytest.approx(one["sums"]["loss/total"], rel=1e-5)
    before = model.state_dict()
    moved = 0
    for name, w in one["weights"].items():
        assert torch.allclose(two["weights"][name], w, atol=1e-6), name
        moved += int(not torch.equal(w, before[name]))
    assert moved > 0
