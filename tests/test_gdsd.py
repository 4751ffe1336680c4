"""GDSD: the pair scores, the loss and its gradient match the reference code on injected inputs (pinned below), and
the objective behaves as a distillation towards the advantage-guided teacher: a step moves each completion's score
with the sign of its advantage, zero advantages at the old policy give no gradient, the clip stops a completion
that has moved past it, the loss adds up over micro-batches, and the tlc variant is ESPO's coupled ELBO."""

from types import SimpleNamespace

import pytest
import torch

from baselines.gdsd import algorithm as gdsd
from conftest import run_config
from dare.train import noise

# GaryBall/GDSD@3fb6780b3f6bcc31cafac6ff8ca501c4b53a9357: GDSDTrainer.compute_loss (gdsd/trainers/
# gdsd_trainer_batchll.py, `--rl_loss_type gdsd`) and GDSDTLCTrainer.compute_loss (gdsd_trainer_tlc.py, `gdsd_tlc`),
# run unchanged on the inputs of `_inputs` below (one group of B = 4, mu = 2, num_mc = 2, the first inner iteration;
# old and reference scores from the trainers' own `_get_denoise_probs_by_chunk`; leave-one-out advantages as in
# `_generate_and_score_completions`). Stubbed: the model (the toy logits of `_toy_logits`, float32 as the
# reference's loss buffers), `forward_process` (the fixed masks below, by mask seed: seeds 0, 1 are the first
# iteration's pairs) and the imports this machine lacks (trl, datasets, wandb). The TLC trainer centres its logits;
# with the centring removed its numbers agree to float32 rounding (the centring is a no-op: README deviation 1).
REF = {  # (variant, psi, beta, epsilon): (loss, |grad| sum, grad row 0 [:4], the reference's logged kl)
    ("gdsd", 10.0, 1e-3, 0.05): (88.90091705322266, 9.80890968197465,
                                 [-0.0871488952, 0.5216901996, -0.0495234913, -0.8904490833], 0.00029786702361889184),
    ("gdsd", 1.0, 0.0, 4e-4): (0.8888888359069824, 0.0, [0.0, 0.0, 0.0, 0.0], None),
    ("gdsd", 0.05, 0.5, 0.05): (0.00249150930903852, 0.05779587389133667,
                                [-0.0006143683, 0.0034325424, -0.0003489239, -0.0052518764], 0.00029786702361889184),
    ("tlc", 10.0, 1e-3, 0.05): (88.91357421875, 12.848253164719038,
                                [0.0014880465, 1.0470580872, 0.0170019274, -1.0791643824], 0.001837016548961401),
    ("tlc", 1.0, 0.0, 4e-4): (0.8889333009719849, 0.0, [0.0, 0.0, 0.0, 0.0], None),
    ("tlc", 0.05, 0.5, 0.05): (0.003352015744894743, 0.12918371383875638,
                               [-0.0013017523, 0.0069706032, -0.00060118, -0.0132870948], 0.001837016548961401),
}
REF_SCORES = {  # the current policy's per-pair scores (B, num_mc), row-major, from `_get_denoise_probs`
    "gdsd": [-7.436125755310059, -7.363243103027344, -10.46749210357666, -10.461282730102539,
             -6.138160705566406, -6.204072952270508, -7.274868965148926, -7.547484397888184],
    "tlc": [-8.675479888916016, -15.895797729492188, -24.727088928222656, -24.083581924438477,
            -14.322375297546387, -12.131562232971191, -8.487347602844238, -16.438644409179688],
}

B, P, L, V, NUM_MC, MU = 4, 3, 6, 7, 2, 2
MASK = V
f64 = torch.float64


def _inputs():
    """The pinning script's tensors, drawn in its order from the same seed."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(L + P, V, generator=g, dtype=f64)
    U = torch.randn(V + 1, V, generator=g, dtype=f64)
    C = torch.randn(V + 1, V, generator=g, dtype=f64)
    W_new = W + 0.05 * torch.randn(L + P, V, generator=g, dtype=f64)
    W_ref = W + 0.05 * torch.randn(L + P, V, generator=g, dtype=f64)
    ids = torch.randint(0, V, (B, P + L), generator=g)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    counts = torch.tensor([[0, 2, 3, 6], [1, 4, 5, 2], [3, 3, 6, 0], [2, 5, 1, 4]])
    masks = [torch.rand(B, L, generator=g).argsort(dim=1).argsort(dim=1) < counts[k][:, None]
             for k in range(MU * NUM_MC)]
    return W_new, W, W_ref, U, C, ids, rewards, masks


def _toy_logits(W, U, C, x):
    return W[None] + U[x] + 0.5 * C[x].mean(dim=1, keepdim=True)


def _draw(masks):
    """The first iteration's two pairs as `noise.complementary_pairs` lays them out: (mask, complement) per pair."""
    halves, weights = [], []
    for m in masks[:NUM_MC]:
        for h in (m, ~m):
            c = h.sum(1)
            halves.append(torch.cat([torch.zeros(B, P, dtype=torch.bool), h], dim=1))
            weights.append(torch.where(c > 0, (L + 1) / c.clamp(min=1).double(), 0.0))
    masked = torch.stack(halves, dim=1)
    return noise.Draw(masked, masked[:, :, P:].sum(2).double() / L, torch.stack(weights, dim=1))


def _sums(W, U, C, ids, draw):
    """(B, 2 n) each draw's sum of the toy model's log-probs at its masked positions (what `elbo_terms` returns)."""
    out = []
    for k in range(draw.masked.shape[1]):
        m = draw.masked[:, k]
        lp = torch.log_softmax(_toy_logits(W, U, C, torch.where(m, MASK, ids)), dim=-1)
        out.append(torch.where(m, lp.gather(2, ids[..., None])[..., 0], 0.0).sum(1))
    return torch.stack(out, dim=1)


def _case(variant="gdsd", **algo):
    W_new, W_old, W_ref, U, C, ids, rewards, masks = _inputs()
    cfg = run_config("gdsd", variant=variant, num_mc=NUM_MC, **algo)
    draw = _draw(masks)
    adv = gdsd.advantages(rewards.view(1, B), cfg).view(-1)
    batch = SimpleNamespace(sequences=ids, prompt_length=P, advantages=adv, num_sequences=B)
    W = W_new.clone().requires_grad_(True)
    score = lambda T: gdsd.pair_scores(_sums(T, U, C, ids, draw), draw, cfg)
    return W, score(W), score(W_old), score(W_ref), batch, draw, cfg, score


@pytest.mark.parametrize("key", list(REF))
def test_loss_and_gradient_match_the_reference_code(key):
    variant, psi, beta, eps = key
    value, grad_abs, row0, kl = REF[key]
    W, logps, old, ref, batch, draw, cfg, _ = _case(variant, psi=psi, beta=beta, epsilon=eps)
    assert logps.detach().flatten().tolist() == pytest.approx(REF_SCORES[variant], rel=1e-6)
    loss, metrics = gdsd.loss(logps, old, ref if beta > 0 else None, batch, draw, cfg)
    assert loss.item() == pytest.approx(value, rel=1e-5)  # float32 in the reference
    if kl is not None:
        assert metrics["loss/kl"] == pytest.approx(kl, rel=1e-5)
    loss.backward()
    grad = W.grad[P:]
    assert grad.abs().sum().item() == pytest.approx(grad_abs, rel=1e-5, abs=1e-12)
    assert grad[0, :4].tolist() == pytest.approx(row0, rel=1e-5, abs=1e-6)  # the reference runs in float32


def test_the_tlc_score_is_espos_coupled_elbo_and_gdsd_halves_the_plain_sum():
    """tlc: the mean over a pair's two draws of weight x masked sum (`estimators.elbo`'s form, ESPO); gdsd: half the
    completion's log-probs, each token scored once in the pair (no weights)."""
    W_new, _, _, U, C, ids, _, masks = _inputs()
    draw = _draw(masks)
    sums = _sums(W_new, U, C, ids, draw)
    tlc = gdsd.pair_scores(sums, draw, run_config("gdsd", variant="tlc"))
    assert torch.allclose(tlc, (sums * draw.weight).view(B, NUM_MC, 2).mean(2))
    plain = gdsd.pair_scores(sums, draw, run_config("gdsd"))
    assert torch.allclose(plain * 2, sums.view(B, NUM_MC, 2).sum(2))
    covered = draw.masked[:, 0::2, P:].long() + draw.masked[:, 1::2, P:].long()
    assert (covered == 1).all()  # every completion token is scored exactly once per pair


def test_a_step_moves_each_score_with_its_advantage():
    """At the old policy the gradient is -(2 psi / L) A grad s: gradient descent raises the scores of the
    completions with A > 0 and lowers those with A < 0 (towards the teacher pi_old exp(psi A))."""
    W, logps, _, _, batch, draw, cfg, score = _case(psi=1.0, beta=0.0, epsilon=0.2)
    loss, metrics = gdsd.loss(logps, logps.detach(), None, batch, draw, cfg)
    assert metrics["stats/log_ratio"] == 0.0 and metrics["stats/clip_ratio"] == 0.0
    loss.backward()
    with torch.no_grad():
        moved = score(W - 1e-3 * W.grad) - logps.detach()
    sign = torch.sign(batch.advantages)[:, None].expand_as(moved)
    assert (torch.sign(moved) == sign).all()


def test_zero_advantages_at_the_old_policy_give_no_gradient():
    W, logps, _, _, batch, draw, cfg, _ = _case(psi=10.0, beta=0.0)
    batch.advantages = torch.zeros(B)
    loss, _ = gdsd.loss(logps, logps.detach(), None, batch, draw, cfg)
    loss.backward()
    assert loss.item() == 0.0 and W.grad.abs().max().item() == 0.0


def test_the_clip_stops_a_completion_past_it_whatever_its_advantage():
    W, logps, old, _, batch, draw, cfg, _ = _case(psi=1.0, beta=0.0, epsilon=0.05)
    log_ratio = (logps - old).detach()
    outside = (log_ratio < torch.log1p(torch.tensor(-0.05))) | (log_ratio > torch.log1p(torch.tensor(0.05)))
    assert outside.any() and (~outside).any()  # the case has both
    logps.retain_grad()
    loss, metrics = gdsd.loss(logps, old, None, batch, draw, cfg)
    loss.backward()
    assert (logps.grad[outside] == 0).all() and (logps.grad[~outside] != 0).all()
    assert metrics["stats/clip_ratio"] == pytest.approx(outside.float().mean().item())


def test_the_loss_adds_up_over_micro_batches():
    W, logps, old, ref, batch, draw, cfg, _ = _case(psi=0.05, beta=0.5, epsilon=0.05)
    whole, _ = gdsd.loss(logps, old, ref, batch, draw, cfg)
    parts = 0.0
    for rows in (slice(0, 1), slice(1, 4)):
        mb = SimpleNamespace(**{**vars(batch), "sequences": batch.sequences[rows], "advantages": batch.advantages[rows]})
        part, _ = gdsd.loss(logps[rows], old[rows], ref[rows], mb,
                            noise.Draw(draw.masked[rows], draw.t[rows], draw.weight[rows]), cfg)
        parts = parts + part
    assert parts.item() == pytest.approx(whole.item(), rel=1e-12)


def test_advantages_are_leave_one_out():
    """(A group of one is refused for every RL baseline by RLConfig: test_trainer.)"""
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    assert gdsd.advantages(r, run_config("gdsd"))[0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_the_noise_is_coupled_pairs_over_the_whole_completion():
    """sample_noise: num_mc (mask, complement) pairs over every completion position (the reference's L =
    logits_to_keep, EOS padding included), none in the prompt."""
    cfg = run_config("gdsd", num_mc=3)
    am = torch.ones(5, P + L, dtype=torch.long)
    am[0, 0] = 0  # a left-padded prompt
    batch = SimpleNamespace(attention_mask=am, prompt_length=P)
    draw = gdsd.sample_noise(batch, torch.Generator().manual_seed(1), cfg)
    assert draw.masked.shape == (5, 6, P + L) and not draw.masked[:, :, :P].any()
    assert (draw.masked[:, 0::2, P:] ^ draw.masked[:, 1::2, P:]).all()
