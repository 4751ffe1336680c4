"""JustGRPO: AR-order rollouts (block 1 on masked models, left-to-right commits on block models) are
scored by the AR-prefix likelihood of exactly the policy that sampled them, the advantage is the
reference's `compute_group_advantages`, and the loss matches a hand computation."""

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from baselines.justgrpo import algorithm as jg
from conftest import run_config
from dare.config import DecodingConfig, Invalid
from dare.models import facts
from dare.rollout import generate, left_pad
from dare.train import noise
from dare.train.estimators import Compute
from test_block_rl import PROMPTS, tiny
from test_trajectory_rl import tiny_llada


def with_rounds(batch):
    """A hand-made batch with `prepare`'s extras (the left-to-right rounds)."""
    batch.extras = {"rounds": noise.left_to_right_rounds(batch)}
    return batch


def test_advantages_are_the_references_group_normalization():
    """(r - mean) / (unbiased std + 1e-4), per group (`grpo.py` `compute_group_advantages`)."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    adv = jg.advantages(rewards, run_config("justgrpo"))
    std = math.sqrt((4 * 0.25) / 3)  # unbiased: sum of squared deviations / (G - 1)
    want = 0.5 / (std + 1e-4)
    assert adv[0].tolist() == pytest.approx([want, -want, -want, want], rel=1e-6)
    assert (adv[1] == 0).all()  # an all-equal group carries no gradient (and is not counted as valid)


def _batch(adv, G=3, active=None):
    B = len(adv)
    return SimpleNamespace(advantages=torch.tensor(adv), num_sequences=B,
                           num_active=active if active is not None else sum(a != 0 for a in adv))


def test_loss_by_hand_at_ratio_one_and_with_clipping():
    """mu = 1: ratio 1, L = -sum_i A_i * G / (G * #valid); the gradient of each token's log-prob is
    -A_i / (G * #valid), after the first EOS too. With old log-probs (mu > 1) PPO's clip at 0.2 applies."""
    cfg = run_config("justgrpo")
    batch = _batch([1.0, -1.0, 0.0, 0.5])
    logps = torch.full((4, 3), -0.7, requires_grad=True)
    loss, metrics = jg.loss(logps, logps.detach(), None, batch, None, cfg)
    assert loss.item() == pytest.approx(-(1 - 1 + 0 + 0.5) * 3 / (3 * 3))
    loss.backward()
    assert logps.grad[:, 0].tolist() == pytest.approx([-1 / 9, 1 / 9, 0.0, -0.5 / 9])
    assert (logps.grad == logps.grad[:, :1]).all()  # every position counts the same
    # ratios e^0.5 (clipped to 1.2 for A > 0) and e^-0.5 (clipped to 0.8 for A < 0: min takes -0.8)
    new = torch.tensor([[0.5, -0.5, 0.0], [0.5, -0.5, 0.0]])
    loss, _ = jg.loss(new, torch.zeros(2, 3), None, _batch([1.0, -1.0]), None, cfg)
    r1, r2 = math.exp(0.5), math.exp(-0.5)
    want = -((min(r1, 1.2) + min(r2, 0.8) + 1) * 1 + (-max(r1, 1.2) - max(r2, 0.8) - 1) * 1) / (3 * 2)
    assert loss.item() == pytest.approx(want, rel=1e-6)


def test_config_refuses_parallel_rollouts_and_token_logps_refuse_a_confidence_order():
    cfg = run_config("justgrpo")
    bad = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, decoding=DecodingConfig(masked={"threshold": 0.9})))
    with pytest.raises(ValueError, match="AR order"):
        jg.check_config(bad)
    with pytest.raises(Invalid, match="left-to-right"):
        DecodingConfig(masked={"remasking": "left_to_right", "threshold": 0.9}).validate()
    with pytest.raises(Invalid, match="EOSER"):
        DecodingConfig(masked={"remasking": "left_to_right", "eos_gamma_min": 0.5}).validate()
    model = tiny_llada()
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    confident = generate(model, ids, mask, DecodingConfig(gen_length=8, block_length=8, steps=8))
    batch = SimpleNamespace(sequences=confident.sequences, attention_mask=confident.attention_mask,
                            prompt_length=confident.prompt_length, step_map=confident.step_map, block_size=None,
                            compute=Compute())
    assert not (confident.step_map[:, 1:] > confident.step_map[:, :-1]).all()  # this rollout is not AR-ordered
    with pytest.raises(ValueError, match="left to right"):
        jg.token_logps(model, with_rounds(batch), None, cfg)
    batch.step_map = torch.arange(8).expand(3, 8).clone()
    batch.step_map[:, -2:] = -1  # positions an EOS early stop filled without sampling them
    with pytest.raises(ValueError, match="eos_early_stop"):
        jg.token_logps(model, with_rounds(batch), None, cfg)


def test_left_to_right_order_is_autoregressive_decoding():
    """Masked sampler: remasking=left_to_right with one token per step decodes greedily what block_length=1
    decodes (the reference's AR rollout), and sampled it commits position t at step t (its Gumbel noise is
    drawn over the whole block, so the draws differ from block_length=1's)."""
    model = tiny_llada()
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    for temperature in (0.0, 1.0):
        a = generate(model, ids, mask, DecodingConfig(gen_length=8, block_length=1, steps=8, temperature=temperature),
                     torch.Generator().manual_seed(0))
        b = generate(model, ids, mask, DecodingConfig(gen_length=8, block_length=8, steps=8, temperature=temperature,
                                                      masked={"remasking": "left_to_right"}),
                     torch.Generator().manual_seed(0))
        assert (a.step_map == torch.arange(8)).all() and (b.step_map == torch.arange(8)).all()
        assert torch.equal(a.sequences, b.sequences) == (temperature == 0)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_block_rollout_in_ar_order_is_scored_with_the_samplers_own_log_probs(family):
    """Block models: the block sampler committing one token per step from the left (temperature 1, no
    truncation) draws each token from exactly the distribution the AR-prefix likelihood scores it with:
    the sampler's recorded log-probs equal JustGRPO's token log-probs (left padding and prompts ending
    inside a block included)."""
    model = tiny(family)
    f = facts(model)

    def never_mask(head, inputs, logits):  # as trained checkpoints: the sampler excludes MASK, the trainer need not
        logits[..., f.mask_token_id] = -1e4
        return logits

    model.get_output_embeddings().register_forward_hook(never_mask)
    ids, mask = left_pad(PROMPTS, f.pad_token_id)
    decoding = DecodingConfig(gen_length=9, steps=f.block_size, temperature=1.0,
                              block={"remasking": "left_to_right"}, whole_last_block=False)
    out = generate(model, ids, mask, decoding, torch.Generator().manual_seed(0))
    batch = SimpleNamespace(sequences=out.sequences, attention_mask=out.attention_mask,
                            prompt_length=out.prompt_length, step_map=out.step_map, block_size=f.block_size,
                            compute=Compute())
    with torch.no_grad():
        cfg = run_config("justgrpo")
        logps = jg.token_logps(model, with_rounds(batch), None, cfg)
    torch.testing.assert_close(logps, out.logps, atol=1e-5, rtol=1e-5)
