"""SPG: the block-wise masks follow the reference's forward process (block choice by one permutation
modulo the used blocks, earlier blocks clean, later ones masked, a uniform count inside), the loss matches
a hand computation of its ELBO / EUBO / mixture, and the EUBO stays finite where the reference's fp32
p^beta overflows its gradient (facebookresearch/SPG issues #2, #5)."""

import math
from types import SimpleNamespace

import pytest
import torch

from baselines.spg import algorithm as spg
from conftest import run_config
from dare.train import noise
from dare.train.estimators import renyi_eubo


def _draw(response, segment, prompt, n, seed=0, p=0.0, min_t=0.0, max_t=1.0):
    return noise.block_random(response, segment, prompt, n, torch.Generator().manual_seed(seed), min_t, max_t, p)


def test_block_random_masks_earlier_blocks_clean_later_masked_and_a_count_inside():
    G, bl = 8, 2  # 4 blocks of 2; row 0 answers in all 8 tokens, row 1 in 5 (then EOS padding: blocks 0..2 used)
    response = torch.tensor([[True] * 8, [True] * 5 + [False] * 3])
    segment = (torch.arange(G) // bl).expand(2, G)
    prompt = torch.ones(2, 3, dtype=torch.bool)
    for seed in range(20):
        d = _draw(response, segment, prompt, 4, seed)
        assert not d.masked[:, :, :3].any()  # p_mask_prompt = 0: the prompt stays clean
        comp = d.masked[:, :, 3:]
        for b in range(2):
            blocks = []
            for j in range(4):
                k = int(segment[b][comp[b, j] & response[b]].min())  # the draw's block: its first masked block
                blocks.append(k)
                assert not comp[b, j][segment[b] < k].any()
                assert comp[b, j][(segment[b] > k) | ~response[b]].all()  # later blocks and after the response
                inside = (comp[b, j] & (segment[b] == k) & response[b]).sum()
                assert 1 <= inside <= ((segment[b] == k) & response[b]).sum()
                scored = comp[b, j] & response[b]
                assert d.t[b, j].item() == pytest.approx(scored.sum().item() / response[b].sum().item())
            if b == 0:
                assert sorted(blocks) == [0, 1, 2, 3]  # the response fills every block: distinct blocks


def test_a_block_with_fewer_tokens_than_max_t_allows_still_masks_one():
    """max_t 0.5 and a block with one scored token: int(1 x 0.5) = 0; at least one is masked (the reference's
    randint(1, 1) raises there)."""
    response = torch.tensor([[True] * 5 + [False] * 3])
    d = _draw(response, (torch.arange(8) // 4)[None], torch.ones(1, 1, dtype=torch.bool), 2, max_t=0.5)
    assert ((d.masked[0, :, 1:] & response[0]).sum(dim=1) >= 1).all()


def test_block_choice_is_a_permutation_modulo_the_used_blocks():
    """The reference's `randperm(num_blocks) % completion_num_blocks`: 4 blocks with 3 used give block 0
    probability 1/2 and blocks 1, 2 a quarter each (exact enumeration of the first entry)."""
    response = torch.tensor([[True] * 6 + [False] * 2])
    segment = (torch.arange(8) // 2)[None]
    counts = torch.zeros(3)
    for seed in range(2000):
        d = _draw(response, segment, torch.ones(1, 1, dtype=torch.bool), 1, seed)
        counts[int(segment[0][d.masked[0, 0, 1:] & response[0]].min())] += 1
    assert (counts / 2000).tolist() == pytest.approx([0.5, 0.25, 0.25], abs=0.03)


def test_prompt_and_clean_blocks_are_masked_at_p_but_never_the_chosen_blocks_other_tokens():
    response, segment = torch.ones(1, 8, dtype=torch.bool), (torch.arange(8) // 4)[None]
    seen_prompt = seen_earlier = False
    for seed in range(40):
        d = _draw(response, segment, torch.ones(1, 4, dtype=torch.bool), 1, seed, p=0.5, min_t=0.25, max_t=0.25)
        comp = d.masked[0, 0, 4:]
        seen_prompt |= bool(d.masked[0, 0, :4].any())
        if comp[4:].all():  # block 0 chosen: exactly int(4 * 0.25) = 1 of its tokens, never perturbed; block 1 masked
            assert comp[:4].sum() == 1
        else:  # block 1 chosen: 1 of its tokens; block 0 (clean) perturbed at p
            assert comp[4:].sum() == 1
            seen_earlier |= bool(comp[:4].any())
    assert seen_prompt and seen_earlier


def _batch(adv, lengths, G=3):
    response = torch.tensor([[i < n for i in range(G)] for n in lengths])
    return SimpleNamespace(advantages=torch.tensor(adv), response_mask=response, prompt_length=1,
                           num_tokens=float(sum(lengths)), num_sequences=len(adv))


def test_loss_by_hand_elbo_for_positive_mixture_for_negative():
    cfg = run_config("spg")  # mix, beta 1.5, omega 0.5
    batch = _batch([0.5, -0.5], [3, 2])
    masked = torch.tensor([[[0, 1, 1, 0], [0, 0, 1, 1]], [[1, 1, 0, 1], [0, 1, 1, 1]]], dtype=torch.bool)
    t = torch.tensor([[2 / 3, 2 / 3], [1 / 2, 1.0]])
    logps = torch.tensor([[[-1.0, -2.0, 0.0], [0.0, -3.0, -0.5]], [[-1.5, 0.0, 0.0], [-0.2, -4.0, 0.0]]])
    draw = noise.Draw(masked, t)
    loss, _ = spg.loss(logps, None, None, batch, draw, cfg)
    # row 0 (A > 0): ELBO = mean(mean(-1, -2), mean(-3, -0.5)) = mean(-1.5, -1.75)
    elbo0 = (-1.5 - 1.75) / 2
    # row 1 (A < 0), scored tokens: draw 0 masks token 0 (token 2 is past the response), draw 1 tokens 0, 1
    elbo1 = (-1.5 + (-0.2 - 4.0) / 2) / 2
    a0 = (math.exp(1.5 * -1.5) / 0.5 + math.exp(1.5 * -0.2) / 1.0) / 2  # token 0, both draws
    a1 = (0 + math.exp(1.5 * -4.0) / 1.0) / 2  # token 1, draw 1 only
    eubo1 = (math.log(a0) + math.log(a1)) / 2 / 1.5
    mix1 = 0.5 * eubo1 + 0.5 * elbo1
    want = -(0.5 * elbo0 * 3 + -0.5 * mix1 * 2) / 5
    assert loss.item() == pytest.approx(want, rel=1e-6)
    for negative, value in (("eubo", eubo1), ("elbo", elbo1), ("zero", 0.0)):
        loss, _ = spg.loss(logps, None, None, batch, draw, run_config("spg", negative=negative))
        assert loss.item() == pytest.approx(-(0.5 * elbo0 * 3 - 0.5 * value * 2) / 5, rel=1e-6, abs=1e-9)


def test_eubo_and_its_gradient_stay_finite_where_the_references_fp32_form_overflows():
    """The reference computes a = mean_j p^beta 1[masked] / t in fp32 and backpropagates log a: at log p = -60
    and beta = 1.5, p^beta ~ 1e-39 is subnormal and d log a / d a = 1/a overflows to inf (then NaN through the
    softmax: the collapse of its issues #2 and #5). The log-space EUBO stays finite, its gradient summing to 1
    over the draws, at any log-probability."""
    scored = torch.tensor([[[True], [True]]])
    weight = torch.tensor([[1.0, 1.0]])
    logp_ref = torch.full((1, 2, 1), -60.0, requires_grad=True)
    a = (torch.exp(logp_ref).pow(1.5) * scored / weight[..., None]).mean(dim=1)  # the reference's form
    (torch.log(a).sum() / 1.5).backward()
    assert not torch.isfinite(logp_ref.grad).all()
    for value in (-60.0, -1000.0, -1e6):
        logps = torch.full((1, 2, 1), value, requires_grad=True)
        eubo = renyi_eubo(logps, scored, weight, 1.5)
        eubo.sum().backward()
        assert torch.isfinite(eubo).all() and torch.isfinite(logps.grad).all()
        if value > -1e4:  # (at -1e6 float32 resolves beta logp only to 0.125: finite, not exact)
            assert logps.grad.sum().item() == pytest.approx(1.0, rel=1e-4)  # d EUBO / d logp: 1 over the draws
