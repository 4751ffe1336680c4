"""One gather per rollout under FSDP2 (`dare.train.dist.gathered`, `rl.gather_rollout`): two real processes
(torchrun, gloo) shard a tiny model as training does and decode; inside the context a rollout makes one
all-gather per FSDP unit in all (not one per unit and forward), decodes each rank's rows as a single unsharded
process does, and leaves every unit resharded with FSDP's reshard-after-forward settings as they were, so a
training forward and backward after it run as before and the next rollout gathers once again."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from dare.config import DecodingConfig, ScratchModelConfig
from dare.models import facts, new_model
from dare.models.tokenizer import char_tokenizer, save_tokenizer
from dare.rollout import generate, left_pad

WORKER = Path(__file__).with_name("gather_worker.py")
REPO = Path(__file__).resolve().parent.parent


def _alone(model, prompts, decoding):
    ids, mask = left_pad(prompts, facts(model).pad_token_id)
    with torch.no_grad():
        return generate(model, ids, mask, decoding, torch.Generator().manual_seed(0)).sequences


def test_a_rollout_gathers_each_unit_once(tmp_path):
    """The masked sampler on a tiny LLaDA (4 steps) and the block sampler on a tiny SDAR (two blocks of 2 steps),
    3 decoder layers each: 5 FSDP units (layers, output head, root)."""
    scratch = ScratchModelConfig(d_model=32, n_heads=4, n_layers=3, mlp_hidden_size=64)
    cases, models = [], []
    for family, decoding in [("llada", dict(gen_length=8, block_length=8, steps=4, temperature=0.0)),
                             ("sdar", dict(gen_length=8, steps=4, temperature=0.0))]:
        tok = char_tokenizer("0123456789+=", family)
        model = new_model(family, tok, scratch, 0).eval()
        folder = tmp_path / family
        model.save_pretrained(folder)
        save_tokenizer(tok, folder)
        prompts = [[[5, 9, 7]], [[6, 11, 8, 9, 7, 10]]]  # rank 0's rows, rank 1's
        cases.append({"checkpoint": str(folder), "prompts": prompts, "decoding": decoding})
        models.append(model)
    (tmp_path / "spec.json").write_text(json.dumps({"cases": cases}))
    exe = Path(sys.executable).parent / "torchrun"
    r = subprocess.run([str(exe), "--nproc-per-node", "2", str(WORKER), str(tmp_path / "spec.json"), str(tmp_path)],
                       capture_output=True, text=True, timeout=180, cwd=REPO,
                       env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                            "PYTHONPATH": f"{REPO}:{REPO / 'shared'}"})
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{k}.pt") for k in (0, 1)]
    for i, (case, model) in enumerate(zip(cases, models)):
        for rank, results in enumerate(ranks):
            got = results[i]
            alone = _alone(model, case["prompts"][rank], DecodingConfig(**case["decoding"]))
            for key in ("plain", "first", "second"):
                assert torch.equal(got[key], alone), (case["checkpoint"], rank, key)
            units = got["after"]["units"]
            assert units == 3 + 2  # decoder layers, output head, root
            n_plain, n_first, n_second = got["gathers"]
            # once per unit for the whole rollout (the first time less the root, which FSDP keeps whole after a
            # forward, so the plain rollout left it gathered); without: layers and head again in every forward
            assert (n_first, n_second) == (units - 1, units), got["gathers"]
            assert n_plain == 1 + got["nfe"] * (units - 1), got["gathers"]
            assert all(got["after"]["sharded"])  # memory after the rollout: shards only
            assert got["after"]["reshards"] == got["before"]["reshards"]  # FSDP's settings restored
        print(case["checkpoint"], "nfe", ranks[0][i]["nfe"], "all-gathers per rollout (plain, gathered, again):",
              ranks[0][i]["gathers"])
