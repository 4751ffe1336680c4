"""b1's dynamic-size blocks (`decoding.block.dynamic`, `dare.rollout.dynamic`): pinned against the reference's
`dynamic_generate` run unchanged, the row-by-row equivalences with the fixed block sampler, the estimators' draws
following each row's own blocks, the default config and fixed sampler unchanged, and two-step RL runs with the
option on the tiny SDAR and LLaDA2."""

import dataclasses
import json
import math

import pytest
import torch

import b1_fake as fk
from dare.config import DecodingConfig, ScratchModelConfig
from dare.decoding.block import BlockOptions
from dare.models import facts, new_model
from dare.models.tokenizer import char_tokenizer
from dare.rollout import generate, left_pad
from dare.rollout.dynamic import block_reward, marker_id
from dare.train import noise
from dare.train.estimators import Compute
from dare.train.rl import RLBatch, Totals

# The reference, run unchanged: `YanJiangJerry/Block-R1` at fd7a1b8 (`git archive` into /srv/scratch/b1, outside the
# repository), `rl/trainers/dynamic_generate.py: dynamic_generate(model, prompt, tokenizer, steps=fk.STEPS,
# gen_length=fk.GEN, temperature=0.0, mask_id=fk.MASK)` (its defaults: remasking=low_confidence, cfg_scale=0,
# dynamic=1) on `b1_fake.FakeModel(seed)` and `torch.tensor(fk.PROMPTS)`, with `b1_fake.FakeTokenizer` (the word
# "block" is the marker, EOS its `eos_token_id`), by a 15-line script that imported both and printed the returned
# (x[:, prompt_len:], entropy_rewards). Completions as hex digits (V = 16; 2 is the mask: the reference leaves the
# positions after a row's EOS block masked), rewards rounded to 7 digits.
REFERENCE = {
    0: (["9eb44ea7baa77a7edaac7e6a4aaaa3eeaaeaeaaaeaa4aea7ab4aae7aeaacaaca",
         "9bae74a74ada7a744a7eaeaaaaabaaaad4eae97aaaa1aaa1aaaaae4b7aaeaaca",
         "9eaa4eaebaad4a76baa99eeaacaea44ea7eaecaaaa14aae7ab4aae4a7aa7aeca"],
        [0.5390648, 0.2290785, 0.2290785]),
    1: (["99fe677bd3d3a7d9d9b9a973bdb4d3ceed94e9a44377eeee1191111577322222",
         "99fe63bb954357d9ddb9a973e499e34e534bc7bbb3bbec151791132222222222",
         "99f7b3b8b54597dda3bdc973edbd934e93cbc7bbe3bbec8ee111117171ef1b19"],
        [0.7057538, 0.6002639, 0.6002639]),
}


def dynamic(**kw) -> BlockOptions:
    return BlockOptions(dynamic=True, **kw)


def layout(tokens: list[int], M: int, d: int = 1) -> list[int]:
    """The reference's block rule read off a finished row: from each block's start, the first marker at offset
    >= d within the window of M ends the block after it, else the window does; a block holding EOS ends the row.
    -> the block of every position (one more block after the row's end)."""
    seg, start, k = [], 0, 0
    while start < len(tokens):
        window = tokens[start:start + M]
        ends = [i for i, t in enumerate(window) if t == fk.MARKER and i >= d]
        size = ends[0] + 1 if ends else len(window)
        seg += [k] * size
        k += 1
        if fk.EOS in window[:size]:
            break
        start += size
    return seg + [k] * (len(tokens) - len(seg))


@pytest.mark.parametrize("seed", [0, 1])
def test_dynamic_blocks_match_the_reference(seed):
    """Block-R1@fd7a1b8's `dynamic_generate` at temperature 0: the same tokens, the same rewards (to 1e-6), and the
    recorded layout is the reference's block rule applied to the tokens (seed 1: rows of 7 and 8 blocks of sizes
    2 to 18, two rows ended by an EOS block)."""
    model = fk.FakeModel(seed)
    ids = torch.tensor(fk.PROMPTS)
    d = DecodingConfig(gen_length=fk.GEN, steps=fk.STEPS // 2, block=dynamic())  # the reference: steps per window
    out = generate(model, ids, torch.ones_like(ids), d, None, marker_id=fk.MARKER)
    completions, rewards = REFERENCE[seed]
    ref = torch.tensor([[int(c, 16) for c in row] for row in completions])
    decoded = ref != fk.MASK
    assert torch.equal(out.responses[decoded], ref[decoded])
    assert (out.responses[~decoded] == fk.EOS).all()  # after the EOS block: EOS (the reference leaves masks)
    assert torch.allclose(out.block_reward, torch.tensor(rewards), atol=1e-6)
    for r in range(len(fk.PROMPTS)):
        assert out.segments[r].tolist() == layout(out.responses[r].tolist(), fk.GEN // 2), r
    if seed == 1:
        sizes = torch.bincount(out.segments[0])
        assert len(set(sizes.tolist())) > 3 and out.response_mask[0].sum() < fk.GEN


def test_a_row_decodes_the_same_in_a_batch_as_alone():
    """Per-row windows: each row's tokens, layout and reward do not depend on the other rows (T = 0)."""
    model = fk.FakeModel(1)
    d = DecodingConfig(gen_length=fk.GEN, steps=fk.STEPS // 2, block=dynamic())
    ids = torch.tensor(fk.PROMPTS)
    out = generate(model, ids, torch.ones_like(ids), d, None, marker_id=fk.MARKER)
    for r in range(len(fk.PROMPTS)):
        one = generate(model, ids[r:r + 1], torch.ones_like(ids[r:r + 1]), d, None, marker_id=fk.MARKER)
        assert torch.equal(one.responses[0], out.responses[r])
        assert torch.equal(one.segments[0], out.segments[r])
        assert torch.allclose(one.block_reward, out.block_reward[r:r + 1])


def tiny(family: str):
    tok = char_tokenizer("0123456789+=", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0).eval()
    return model, tok


@pytest.mark.parametrize("family", ["sdar", "llada2"])
@pytest.mark.parametrize("cache", ["none", "auto"])
def test_without_a_marker_the_rows_decode_as_the_fixed_sampler(family, cache):
    """A window of the model's block and no marker committed: every row, in a batch of prompts of different
    lengths (whole blocks), decodes what the fixed block sampler decodes (T = 0), up to its response's end; its
    layout is the model's blocks."""
    model, _ = tiny(family)
    f = facts(model)
    bs = f.block_size
    prompts = [[5, 9, 7, 8], [5, 11, 6, 8, 9, 10, 4, 6], [6, 7, 8, 9]]
    ids, mask = left_pad(prompts, f.pad_token_id)
    G = 3 * bs
    fixed = generate(model, ids, mask, DecodingConfig(gen_length=G, steps=3, block=BlockOptions(cache=cache)))
    never = model.get_input_embeddings().weight.shape[0]  # no such token: no block ends early
    out = generate(model, ids, mask, DecodingConfig(gen_length=G, steps=3, block=dynamic(dynamic_max_block=bs)),
                   None, marker_id=never)
    assert torch.equal(out.response_mask, fixed.response_mask)
    keep = fixed.response_mask.bool()
    assert torch.equal(out.responses[keep], fixed.responses[keep])
    blocks = torch.arange(G)[None, :] // bs
    assert torch.equal(out.segments[keep], blocks.expand_as(keep)[keep])


def test_the_marker_ends_a_row_block_where_it_is_committed():
    """On a tiny SDAR with the model's own most frequent token as the marker: every block of every row but the
    last ends with the marker (at offset >= 1) or fills the window; rows get different layouts."""
    model, _ = tiny("sdar")
    f = facts(model)
    ids, mask = left_pad([[5, 9, 7], [5, 11, 6, 8, 9, 10], [6]], f.pad_token_id)
    d = DecodingConfig(gen_length=24, steps=4, temperature=1.0, block=dynamic(dynamic_max_block=8))
    common = generate(model, ids, mask, DecodingConfig(gen_length=24, steps=4, temperature=1.0),
                      torch.Generator().manual_seed(0))
    marker = int(torch.mode(common.responses.flatten()).values)
    out = generate(model, ids, mask, d, torch.Generator().manual_seed(0), marker_id=marker)
    for r in range(3):
        seg, tok = out.segments[r], out.responses[r]
        n = int(seg.max()) + 1
        for k in range(n):
            where = (seg == k).nonzero().flatten()
            size, last = len(where), int(where[-1])
            ended_by_marker = bool(tok[last] == marker) and size >= 2
            stopped = bool(torch.isin(tok[where], torch.tensor(f.stop_ids)).any())
            assert ended_by_marker or size == 8 or k == n - 1 or stopped, (r, k)
            if size >= 2:  # no marker before the end at offset >= 1 (it would have ended the block)
                assert not (tok[where[1:-1]] == marker).any(), (r, k)
    assert len({tuple(s.tolist()) for s in out.segments}) > 1


@pytest.mark.parametrize("M, T", [(6, 1.0), (8, 0.0)])
def test_the_replay_of_dynamic_windows_is_exact(M, T):
    """`agree/logp_gap` (issue 59.4: 0.67 and 4.3 nats with dynamic windows, 0 with fixed blocks): on the tiny SDAR
    (block 4) with windows that cross the model's blocks and no block cut at a marker, the trainer's replay of the
    sampler's states (`diagnostics.replay_agreement`) gives the sampler's own log-probs, row by row. It did not: the sampler's
    forward ended at the furthest window's end, hiding the masked tail of that model block, and the replay ranked
    steps per dynamic block and read them through the block layout `[x_t ; x_0]` (a block seeing the earlier model
    blocks clean, where the sampler saw them half decoded). A block cut at its marker after tokens beyond the marker
    were committed (and seen) still disagrees: the step map keeps no re-masked token (docs/training.md, b1)."""
    import contextlib
    from types import SimpleNamespace

    from dare.train.dist import Dist
    from dare.train.diagnostics import replay_agreement

    model, _ = tiny("sdar")
    f = facts(model)
    ids, mask = left_pad([[5, 9, 7], [5, 11, 6, 8, 9, 10], [6]], f.pad_token_id)
    never = model.get_input_embeddings().weight.shape[0]  # no such token: no block is cut
    out = generate(model, ids, mask, DecodingConfig(gen_length=24, steps=4, temperature=T,
                                                    block=dynamic(dynamic_max_block=M)),
                   torch.Generator().manual_seed(0), marker_id=never)
    assert out.segments.max() >= 2 and (mask.sum(dim=1) % f.block_size).all()  # windows across block boundaries
    batch = batch_of(model, out)  # with the rollout's commit_logps
    trainer = SimpleNamespace(autocast=contextlib.nullcontext, dist=Dist())
    sums = replay_agreement(model, trainer, batch, rows=3)
    assert sums["replay/n"] == float((out.response_mask.bool() & (out.step_map >= 0)).sum()) > 30
    assert sums["replay/max_abs"] < 1e-5, sums


def test_block_reward_by_hand():
    """0.5 (share of consecutive blocks whose mean entropy decreases) + 0.5 log(n + 1) / log(T + 1), 1 from T
    blocks on, 0 below two blocks."""
    e = torch.tensor([[3.0, 2.0, 2.5, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    n = torch.tensor([4, 1, 5])
    got = block_reward(e, n, 10)
    assert got[0].item() == pytest.approx(0.5 * 2 / 3 + 0.5 * math.log(5) / math.log(11))
    assert got[1].item() == 0.0
    assert got[2].item() == pytest.approx(0.5 + 0.5 * math.log(6) / math.log(11))
    assert block_reward(e, n, 4)[2].item() == pytest.approx(1.0)  # 5 >= 4 blocks: the count term saturates


def batch_of(model, out) -> RLBatch:
    B = out.sequences.shape[0]
    return RLBatch(rollout=out, facts=facts(model), rewards=torch.zeros(B), advantages=torch.zeros(B),
                   totals=Totals(num_tokens=float(out.response_mask.sum()), num_sequences=B), compute=Compute(pack=False))


def test_block_draws_follow_each_rows_blocks():
    """SPG's / StableDRL's block-wise draws (`noise.block_random` over `noise.rollout_segments`) on a dynamic
    rollout: in every draw of every row, the row's own blocks before the drawn one are clean, those after it
    fully masked; EBPO's per-block draws mask inside each of the row's blocks. Without a layout the segments are
    the model's blocks, as before."""
    model = fk.FakeModel(1)
    ids = torch.tensor(fk.PROMPTS)
    out = generate(model, ids, torch.ones_like(ids), DecodingConfig(gen_length=fk.GEN, steps=fk.STEPS // 2,
                                                                    block=dynamic()), None, marker_id=fk.MARKER)
    batch = batch_of(model, out)
    seg = noise.rollout_segments(batch)
    assert torch.equal(seg, out.segments)
    P = batch.prompt_length
    draw = noise.block_random(batch.response_mask, seg, batch.attention_mask[:, :P].bool(), 6,
                              torch.Generator().manual_seed(0), p_mask_prompt=0.0)
    masked = draw.masked[:, :, P:]
    scored = batch.response_mask.bool()
    for r in range(seg.shape[0]):
        for j in range(masked.shape[1]):
            m = masked[r, j] & scored[r]
            k = int(seg[r][m].min())  # the drawn block: the first with a masked token
            assert not m[seg[r] < k].any(), (r, j)
            assert m[(seg[r] > k) & scored[r]].all(), (r, j)
    fixed = dataclasses.replace(batch, rollout=dataclasses.replace(batch.rollout, segments=None))
    assert torch.equal(noise.rollout_segments(fixed), noise.blocks(batch.attention_mask, fk.BLOCK)[:, P:])
    n = int(seg.max()) + 1
    strat = noise.block_stratified(batch.response_mask, seg, P, 2, torch.Generator().manual_seed(0))
    for r in range(seg.shape[0]):
        for k in range(n):
            here = (seg[r] == k) & scored[r]
            if here.any():  # each of the row's blocks gets its own masks: at least one token per draw
                assert (strat.masked[r, :, P:][:, here].sum(dim=1) >= 1).all(), (r, k)


def test_default_config_hash_and_fixed_sampler_unchanged():
    """Off by default: the baselines' config hashes and the fixed block sampler's outputs are those of the commit
    before the option (5452cc2, computed there)."""
    import importlib

    from dare.config import config_hash

    before = {"wd1": "09d5f934391e23b68238769135f0b632ff799616e2e7ecbcf7c29725c930dae8",
              "stable_drl": "4c5da4eaad55d0b7adefba45e2098302de5b9d8ce7321c4fbd5cc03ef0aab4ee",
              "ebpo": "ed1957966bfaed269d6c782e96db25a5349a761d5a94db36689cf0214b56f65f",
              "spg": "53ab55560ccf4fee03fc7473ce281aa88653ea3e0c75e23726b399140bd709a0"}
    for name, digest in before.items():
        assert config_hash(importlib.import_module(f"baselines.{name}.config").Config()) == digest, name
    pinned = {"sdar/0.0": [[9, 9, 9, 9, 9, 9, 9], [14, 9, 14, 9, 9, 16, 16], [9, 9, 9, 9, 9, 9, 9]],
              "sdar/1.0": [[4, 16, 5, 15, 12, 0, 16], [5, 2, 17, 10, 5, 5, 17], [5, 13, 14, 9, 14, 9, 6]],
              "llada2/0.0": [[18, 6, 6, 6, 6, 6, 6], [6, 6, 6, 6, 6, 6, 6], [6, 6, 6, 6, 6, 6, 6]],
              "llada2/1.0": [[1, 0, 6, 6, 17, 11, 13], [14, 15, 15, 0, 6, 6, 15], [0, 18, 6, 4, 9, 6, 13]]}
    for key, want in pinned.items():
        family, T = key.split("/")
        model, _ = tiny(family)
        ids, mask = left_pad([[5, 9, 7], [5, 11, 6, 8, 9, 10], [6]], facts(model).pad_token_id)
        out = generate(model, ids, mask, DecodingConfig(gen_length=7, steps=4, temperature=float(T)),
                       torch.Generator().manual_seed(0))
        assert out.responses.tolist() == want, key
        assert out.segments is None and out.block_reward is None


def test_the_options_are_checked():
    from dare.config import Invalid

    model, tok = tiny("sdar")
    assert marker_id(tok, DecodingConfig()) is None
    assert marker_id(tok, DecodingConfig(block=dynamic(dynamic_marker="+"))) == tok.encode("+", add_special_tokens=False)[0]
    with pytest.raises(Exception, match="single marker token"):
        marker_id(tok, DecodingConfig(block=dynamic(dynamic_marker="+=")))
    for bad in (dict(threshold=0.9), dict(cache="prefix"), dict(dynamic_min_offset=0)):
        with pytest.raises(Invalid):
            DecodingConfig(sampler="block", block=dynamic(**bad)).validate()
    with pytest.raises(Invalid):
        DecodingConfig(sampler="block", block=BlockOptions(dynamic_reward=1.0)).validate()


@pytest.mark.parametrize("name", ["wd1", "stable_drl"])
@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_two_rl_steps_with_dynamic_blocks(name, family, tmp_path, monkeypatch, sft_checkpoint):
    """Two steps of wd1 and StableDRL with the option on (the marker "+", b1's reward with weight 1): finite
    losses, the parameters change, the block metrics are logged."""
    from conftest import tiny_overrides
    from dare.app.runs import train
    from dare.data import TASKS
    from test_baselines import _changed, _check_run

    ckpt = sft_checkpoint(family)
    monkeypatch.setattr(TASKS["addition"], "rewards", lambda texts, rows, style="default": [
        float(i % 2) for i in range(len(texts))])
    out = train(name, None, [f"model.path={ckpt}", f"model.family={family}", *tiny_overrides(name, family),
                             "rl.decoding.gen_length=8", "rl.decoding.block.dynamic=true",
                             "rl.decoding.block.dynamic_max_block=4", "rl.decoding.block.dynamic_marker=+",
                             "rl.decoding.block.dynamic_reward=1.0", f"run.out_dir={tmp_path / name}"])
    _check_run(out)
    assert _changed(ckpt, out)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "rollout/blocks" in r]
    assert len(steps) == 2 and all(r["rollout/blocks"] >= 1 for r in steps)


@pytest.mark.parametrize("name", ["cj_grpo", "tracerl"])
def test_trajectory_replays_refuse_dynamic_windows(name):
    """Issue 59.4's remaining disagreement: a block cut at its marker re-masks tokens the sampler had committed and
    shown to the model, which the step map does not keep; the estimators that replay the rollout's states from it
    (TraceRL, CJ-GRPO) refuse dynamic windows with one line at config validation, before any model is built."""
    from dare.app.runs import resolve
    from dare.config import ConfigError

    with pytest.raises(ConfigError, match=r"^baselines/\w+: invalid config: rl\.decoding\.block\.dynamic: a dynamic "
                                          r"block cut at its marker re-masks tokens"):
        resolve(name, None, ["model.family=sdar", "rl.decoding.block.dynamic=true", "rl.decoding.block.threshold=0"])
    resolve(name, None, ["model.family=sdar", "rl.decoding.block.threshold=0"])  # fixed blocks: as before
