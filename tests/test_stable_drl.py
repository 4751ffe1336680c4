"""StableDRL: the loss and its gradient match Block-R1's code on injected inputs (pinned below), the weights are
unconditionally clipped and self-normalised per group, the ratio is 1 at the old policy, the loss adds up over
micro-batches of whole groups, and a micro-batch that splits a group is refused."""

from types import SimpleNamespace

import pytest
import torch

from baselines.stable_drl import algorithm as sdrl
from conftest import run_config
from dare.train import noise
from dare.train.objectives import clipped_self_normalized_weights

# Block-R1 (YanJiangJerry/Block-R1@fd7a1b88b0b4b1dcb74e98e94234f9b51a39dd4d), rl/trainers/stable_drl_svpo.py:
# compute_loss_spg on the inputs of `_inputs` below, float64, its forward process replaced by the fixed mask
# (so its ref_elbo, scored with W_old, and the current ELBO share it, as here), a toy model whose logits are a
# table W (L, V). SNIS runs one call per group (the reference's softmax is over its micro-batch) and the two
# losses and gradients are averaged; the SPG fallback (use_snis False) is one call over all 6 rows.
# Row 0's ratio is 10.6 (clipped at 5).
REF_SNIS_MIX = 0.2152254831972999
REF_SNIS_MIX_GRAD_ABS = 0.3677719706753847
REF_SNIS_MIX_GRAD_ROW0 = [0.0005218091, -0.015512445, 8.01769e-05, 0.0001897258]
REF_SNIS_ELBO = 0.23483598612281864
REF_SPG = -0.23643112639510427
REF_SPG_GRAD_ABS = 0.30993481011365215
REF_SPG_GRAD_ROW0 = [-9.46651e-05, -0.0038372708, -1.45455e-05, -3.44195e-05]

B, P, Gl, V, NUM_T = 6, 3, 8, 11, 2
L = P + Gl


def _inputs():
    """The pinning script's tensors, drawn in its order from the same seed."""
    g = torch.Generator().manual_seed(0)
    f64 = torch.float64
    W_old = torch.randn(L, V, generator=g, dtype=f64)
    W_new = W_old + 1.0 * torch.randn(L, V, generator=g, dtype=f64)
    ids = torch.randint(0, 10, (B, L), generator=g)
    for k in range(P, L):
        W_new[k, ids[0, k]] += 4.0
    response = torch.ones(B, Gl, dtype=torch.bool)
    response[1, 6:] = False
    response[4, 3:] = False
    response[5, 7:] = False
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0], dtype=f64)
    adv = rewards - rewards.view(2, 3).mean(1).repeat_interleave(3)
    masked = torch.rand(B, NUM_T, L, generator=g, dtype=f64) < 0.5
    masked[:, :, P:] |= ~response[:, None, :]
    masked[0, 0, P + 2] = True
    masked[:, :, :P] = False
    masked[0, 1, 1] = True
    return W_old, W_new, ids, response, adv, masked


def _logps(W, ids, masked):
    """(B, n, G) log p(o_k | z_j) of the position-only toy model at each draw's masked completion tokens."""
    lp = torch.log_softmax(W, dim=-1)[torch.arange(L)[None, :], ids]  # (B, L)
    return torch.where(masked[:, :, P:], lp[:, None, P:], 0.0)


def _case(**algo):
    W_old, W_new, ids, response, adv, masked = _inputs()
    scored = masked[:, :, P:] & response[:, None, :]
    draw = noise.Draw(masked, scored.sum(2).double() / response.sum(1, keepdim=True).double())
    batch = SimpleNamespace(prompt_length=P, response_mask=response, advantages=adv, num_sequences=B,
                            num_tokens=float(response.sum()))
    cfg = run_config("stable_drl", num_t=NUM_T, **algo)
    cfg.rl.group_size = 3
    W = W_new.clone().requires_grad_(True)
    old = _logps(W_old, ids, masked)
    return W, _logps(W, ids, masked), old, batch, draw, cfg


@pytest.mark.parametrize("algo, value, grad_abs, row0", [
    ({}, REF_SNIS_MIX, REF_SNIS_MIX_GRAD_ABS, REF_SNIS_MIX_GRAD_ROW0),
    ({"negative": "elbo"}, REF_SNIS_ELBO, None, None),
    ({"snis": False}, REF_SPG, REF_SPG_GRAD_ABS, REF_SPG_GRAD_ROW0),
])
def test_loss_and_gradient_match_the_reference_code(algo, value, grad_abs, row0):
    W, logps, old, batch, draw, cfg = _case(**algo)
    loss, metrics = sdrl.loss(logps, old, None, batch, draw, cfg)
    assert loss.item() == pytest.approx(value, rel=1e-6)
    loss.backward()
    if grad_abs is not None:
        grad = W.grad[P:]
        assert grad.abs().sum().item() == pytest.approx(grad_abs, rel=1e-5)
        assert grad[0, :4].tolist() == pytest.approx(row0, rel=1e-5)  # the reference casts to float32
    if algo.get("snis", True):
        assert metrics["stats/clipped_share"] == pytest.approx(1 / 6)  # row 0's ratio 10.6 > 5


def test_weights_clip_every_ratio_above_and_sum_to_one_per_group():
    log_r = torch.tensor([[0.0, 3.0, -1.0], [2.5, 2.0, 5.0]])  # r = 1, 20, 0.37 | 12.2, 7.4, 148
    w = clipped_self_normalized_weights(log_r, 5.0)
    r = log_r.exp().clamp(max=5.0)
    assert torch.allclose(w, r / r.sum(dim=1, keepdim=True))
    assert torch.allclose(w.sum(dim=1), torch.ones(2))
    assert torch.allclose(w[1], torch.full((3,), 1 / 3))  # every ratio above the clip: uniform, whatever the sign
    big = clipped_self_normalized_weights(torch.tensor([1e4, 0.0]), 5.0)  # no overflow
    assert torch.isfinite(big).all() and big[0].item() == pytest.approx(5 / 6)


def test_at_the_old_policy_the_weights_are_uniform_and_the_loss_is_the_groups_mean():
    W, logps, _, batch, draw, cfg = _case()
    loss, metrics = sdrl.loss(logps, logps.detach(), None, batch, draw, cfg)
    score, _, _ = sdrl.sandwich(logps, batch, draw, cfg)
    assert loss.item() == pytest.approx(-(batch.advantages * score).sum().item() / B, rel=1e-12)
    assert metrics["stats/log_ratio"] == 0.0 and metrics["stats/max_weight"] == pytest.approx(1 / 3)


def test_the_loss_adds_up_over_micro_batches_of_whole_groups():
    W, logps, old, batch, draw, cfg = _case()
    whole, _ = sdrl.loss(logps, old, None, batch, draw, cfg)
    parts = 0.0
    for rows in (slice(0, 3), slice(3, 6)):
        mb = SimpleNamespace(**{**vars(batch), "response_mask": batch.response_mask[rows],
                                "advantages": batch.advantages[rows]})
        part, _ = sdrl.loss(logps[rows], old[rows], None, mb, noise.Draw(draw.masked[rows], draw.t[rows]), cfg)
        parts = parts + part
    assert parts.item() == pytest.approx(whole.item(), rel=1e-12)


def test_a_micro_batch_that_splits_a_group_is_refused():
    cfg = run_config("stable_drl")
    cfg.train.micro_batch_size = 4  # group size 6
    with pytest.raises(ValueError, match="multiple of rl.group_size"):
        sdrl.check_config(cfg)
    cfg.train.micro_batch_size = 12
    sdrl.check_config(cfg)
    sdrl.check_config(run_config("stable_drl", snis=False))


def test_advantages_are_centred_by_default_and_std_scaled_on_request():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert torch.equal(sdrl.advantages(r, run_config("stable_drl")), r - r.mean(dim=1, keepdim=True))
    scaled = sdrl.advantages(r, run_config("stable_drl", advantage="grpo_std"))
    assert scaled[0].tolist() == pytest.approx([0.5 / (r[0].std().item() + 1e-4)] * 1 + [-0.5 / (r[0].std().item()
                                                + 1e-4)] * 2 + [0.5 / (r[0].std().item() + 1e-4)])
    assert scaled[1].abs().sum() == 0
