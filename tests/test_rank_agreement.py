"""No rank desynchronisation: under FSDP every forward is collective, so samplers whose number of forwards
depends on the data (threshold decoding until a block is clean, EOS early stop, prompts of different lengths
on the block sampler) must make every rank go on while any rank has work (`dare.rollout.core.any_rank`).
Two real processes (torchrun, gloo, FSDP2) whose rows need different numbers of forwards decode to the end,
each rank's output the one its rows get in a single process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dare.config import DecodingConfig, ScratchModelConfig
from dare.data import load_split
from dare.models import encode_chat, facts, new_model
from dare.models.tokenizer import char_tokenizer, save_tokenizer
from dare.rollout import generate, left_pad

WORKER = Path(__file__).with_name("ranks_worker.py")
REPO = Path(__file__).resolve().parent.parent


def _alone(model, prompts, decoding):
    ids, mask = left_pad(prompts, facts(model).pad_token_id)
    with torch.no_grad():
        return generate(model, ids, mask, decoding, torch.Generator().manual_seed(0))


def _two_ranks(model, tokenizer, prompts: list, decoding: dict, tmp_path) -> list[dict]:
    model.save_pretrained(tmp_path / "ckpt")
    save_tokenizer(tokenizer, tmp_path / "ckpt")
    (tmp_path / "spec.json").write_text(json.dumps({"prompts": prompts, "decoding": decoding}))
    exe = Path(sys.executable).parent / "torchrun"
    r = subprocess.run([str(exe), "--nproc-per-node", "2", str(WORKER), str(tmp_path / "ckpt"),
                        str(tmp_path / "spec.json"), str(tmp_path)], capture_output=True, text=True, timeout=180,
                       cwd=REPO, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                                      "PYTHONPATH": f"{REPO}:{REPO / 'shared'}"})
    assert r.returncode == 0, r.stderr[-3000:]
    return [torch.load(tmp_path / f"rank{k}.pt") for k in (0, 1)]


def test_threshold_decoding_with_different_step_counts_per_rank(trained_tiny, char_tok, tmp_path):
    """Dual cache + threshold on the trained tiny LLaDA: a block is decoded until it is clean, so the forwards
    depend on the model's confidence; rank 0 gets the prompt that needs the fewest, rank 1 the one that needs
    the most."""
    decoding = dict(gen_length=8, block_length=4, steps=8, masked={"cache": "dual", "threshold": 0.3}, temperature=0.0)
    rows = load_split("addition", "test")[:40]
    prompts = encode_chat(char_tok, [r["prompt"] for r in rows])
    nfe = [_alone(trained_tiny, [p], DecodingConfig(**decoding)).nfe for p in prompts]
    low, high = prompts[nfe.index(min(nfe))], prompts[nfe.index(max(nfe))]
    assert min(nfe) < max(nfe)  # the ranks' rows really need different numbers of forwards
    outs = _two_ranks(trained_tiny, char_tok, [[low], [high]], decoding, tmp_path)
    for prompt, out in zip([low, high], outs):
        assert torch.equal(out["sequences"], _alone(trained_tiny, [prompt], DecodingConfig(**decoding)).sequences)
    assert outs[0]["nfe"] == outs[1]["nfe"] == max(nfe)  # the rank with less to do kept up with the other


def test_block_sampler_with_prompts_of_different_lengths_per_rank(tmp_path):
    """The block sampler's canvas, and so its number of block chunks, depends on the rows' prompt lengths: a rank
    with a 1-token prompt and one with 9 tokens (block 4) run the same chunks; EOS early stop ends together."""
    tok = char_tokenizer("0123456789+=", "sdar")
    model = new_model("sdar", tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0).eval()
    prompts = [[[5]], [[5, 9, 7, 10, 6, 11, 8, 9, 7]]]
    decoding = dict(gen_length=6, steps=4, temperature=0.0, block={"eos_early_stop": True})
    alone = [_alone(model, p, DecodingConfig(**decoding)) for p in prompts]
    assert alone[0].nfe != alone[1].nfe
    outs = _two_ranks(model, tok, prompts, decoding, tmp_path)
    for single, out in zip(alone, outs):
        assert torch.equal(out["sequences"], single.sequences)
