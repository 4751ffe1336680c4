"""The baselines' objectives against hand-computed values and their invariants."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from baselines.d1 import algorithm as d1
from baselines.sft import algorithm as sft
from conftest import run_config
from dare.models import facts, token_logits
from dare.train.estimators import Compute
from dare.train.noise import Draw
from dare.train.sft import sft_batch


def rl_batch(adv, mask):
    mask = torch.tensor(mask)
    return SimpleNamespace(advantages=torch.tensor(adv), response_mask=mask, num_tokens=float(mask.sum()))


def test_d1_advantages_are_group_centred_without_std():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    assert d1.advantages(r, run_config("d1")).tolist() == [[0.5, -0.5, -0.5, 0.5], [0.0] * 4]


def test_d1_ratio_is_one_at_the_old_policy():
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -4.0]], requires_grad=True)
    batch = rl_batch([0.5, -1.0], [[True, True, False], [True, True, True]])
    loss, m = d1.loss(logps, logps.detach(), logps.detach(), batch, None, run_config("d1"))
    # ratio = 1 and KL = 0: L = -(sum_tokens A) / n_tokens = -(2 * 0.5 + 3 * -1) / 5
    assert loss.item() == pytest.approx(-(2 * 0.5 - 3 * 1.0) / 5)
    assert m["loss/kl"] == 0 and m["stats/clip_ratio"] == 0
    loss.backward()
    # d/dlogp of -A * exp(logp - old) / n at logp = old is -A / n on unmasked tokens, 0 on masked
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.1, -0.1, 0.0], [0.2, 0.2, 0.2]]))


def test_d1_loss_hand_computed_with_clipping_and_kl():
    cfg = run_config("d1", beta=0.1, epsilon=0.2)
    logps = torch.tensor([[math.log(0.6), math.log(0.3)]])
    old = torch.tensor([[math.log(0.4), math.log(0.3)]])  # ratios 1.5 (clipped to 1.2) and 1.0
    ref = torch.tensor([[math.log(0.5), math.log(0.2)]])
    batch = rl_batch([2.0], [[True, True]])
    loss, m = d1.loss(logps, old, ref, batch, None, cfg)
    pg = [min(1.5 * 2, 1.2 * 2), 1.0 * 2]
    kl = [0.5 / 0.6 - math.log(0.5 / 0.6) - 1, 0.2 / 0.3 - math.log(0.2 / 0.3) - 1]
    expect = -sum(p - 0.1 * k for p, k in zip(pg, kl)) / 2
    assert loss.item() == pytest.approx(expect, rel=1e-5)
    assert m["stats/clip_ratio"] == pytest.approx(0.5) and m["loss/kl"] == pytest.approx(sum(kl) / 2, rel=1e-5)
    # negative advantage: min() picks the unclipped (more pessimistic) term for ratio > 1 + eps
    loss_neg, _ = d1.loss(logps, old, None, rl_batch([-2.0], [[True, True]]), None, cfg)
    assert loss_neg.item() == pytest.approx(-(1.5 * -2 + 1.0 * -2) / 2, rel=1e-5)


def test_d1_noise_masks_the_completion_and_only_real_prompt_tokens():
    attention = torch.zeros(64, 16, dtype=torch.long)
    attention[:, 4:] = 1  # 4 pads, 6 prompt tokens, 6 completion tokens
    batch = SimpleNamespace(attention_mask=attention, prompt_length=10)
    cfg = run_config("d1", p_mask_prompt=0.3)
    noise = d1.sample_noise(batch, torch.Generator().manual_seed(0), cfg).masked
    assert not noise[:, :4].any() and noise[:, 10:].all()
    assert noise[:, 4:10].float().mean().item() == pytest.approx(0.3, abs=0.05)
    again = d1.sample_noise(batch, torch.Generator().manual_seed(0), cfg).masked
    assert torch.equal(noise, again)


def test_d1_token_logps_is_one_forward_on_masked_completion(tiny_model):
    mask_id = facts(tiny_model).mask_token_id
    seqs = torch.tensor([[1, 5, 9, 7, 10, 6, 11, 12, 1], [5, 14, 7, 15, 18, 6, 13, 1, 1]])
    am = torch.tensor([[0] + [1] * 8, [1] * 9])
    P = 6
    noise = torch.zeros(2, 9, dtype=torch.bool)
    noise[1, 2] = True
    noise[:, P:] = True
    x = seqs.clone()
    x[1, 2] = mask_id
    x[:, P:] = mask_id
    expect = torch.log_softmax(token_logits(tiny_model, x, am)[:, P:], -1).gather(-1, seqs[:, P:, None])[..., 0]
    # the same numbers whether packed or padded, chunked or from full logits
    for compute in (Compute(pack=False, chunk=0), Compute(pack=True, chunk=3, min_padding=0.0),
                    Compute(pack=False, chunk=1024)):
        batch = SimpleNamespace(sequences=seqs, attention_mask=am, prompt_length=P, responses=seqs[:, P:],
                                prompt_mask=am[:, :P].bool(), compute=compute)
        torch.testing.assert_close(d1.token_logps(tiny_model, batch, Draw(noise), run_config("d1")), expect, atol=1e-5, rtol=1e-5)


def test_sft_loss_hand_computed(tiny_model):
    f = facts(tiny_model)
    batch = sft_batch([[5, 9, 7, 10, 6], [5, 11, 6]], [[12, 13], [14]], f.eos_token_id, f.pad_token_id, 4)
    assert batch.input_ids[1].tolist() == [1, 1, 5, 11, 6, 14, 1, 1, 1]  # left pad, EOS-padded response
    assert batch.response_mask[:, 5:].all() and not batch.response_mask[:, :5].any()
    cfg = run_config("sft", eps=1e-3)
    noise = sft.sample_noise(batch, torch.Generator().manual_seed(2), cfg)
    loss, _ = sft.loss(tiny_model, batch, noise, cfg)
    # Replay the same draws: t per row, then one uniform per position.
    g = torch.Generator().manual_seed(2)
    t = torch.rand(2, generator=g)
    p = (1 - cfg.algo.eps) * t + cfg.algo.eps
    masked = (torch.rand(2, 9, generator=g) < p[:, None]) & batch.response_mask
    noisy = torch.where(masked, f.mask_token_id, batch.input_ids)
    logits = token_logits(tiny_model, noisy, batch.attention_mask)
    expect = 0.0
    for b in range(2):
        ce = F.cross_entropy(logits[b][masked[b]], batch.input_ids[b][masked[b]], reduction="sum")
        expect += ce / p[b] / 4  # normalised by the response length, EOS padding included
    assert loss.item() == pytest.approx((expect / 2).item(), rel=1e-5)
    assert masked.any(), "the draw should mask something for the check to mean anything"
