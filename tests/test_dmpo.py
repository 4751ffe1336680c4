"""DMPO (baselines/dmpo) against the ORIGINAL code, yuchen-zhu-zyc/DMPO @96af1a4 `DMPO/dmpo_trainer.py`, run in a
scratch folder (never committed): `compute_log_prob_elbo` (the current and the adapter-disabled reference ELBOs,
4 antithetic replicates), the advantage block of `_generate_and_score_completions` (alpha 1.0 so the weights are
not one-hot, coeff 1, two groups of 2) and `compute_loss` (wdce with the negative-weight centering, and ddo with
independent halves) with its gradients, exec'd from its source text on `injected()`'s tiny LLaDA
(tests/test_tracerl_masked.py); the reference model is a copy with every weight moved by 0.05 N(0, 1) (seed 3).
The masks are injected: the original's `torch.rand` calls return LAMBDA and U below (the same for the ELBOs and the
loss, which the reference draws apart: README deviation 1), in its replicate-major row order."""

import copy
from dataclasses import replace

import pytest
import torch

from baselines.dmpo import algorithm as dmpo
from conftest import run_config
from dare.train.noise import Draw
from test_tracerl_masked import injected

REWARDS = [1.0, 0.0, 0.5, 0.1]
LOG_RND = [0.8013496398925781, 2.0582542419433594, -0.6811256408691406, 2.3661651611328125]
WEIGHTS = [0.4361247718334198, 0.5638751983642578, 0.06615619361400604, 0.9338438510894775]
NEGATIVE = [0.09475556015968323, 0.9052444696426392, 0.030849754810333252, 0.9691502451896667]
WDCE = -0.016648326069116592  # on one micro-batch holding both groups: ours x 2 groups (README deviation 2)
WDCE_GRADS = {
    "model.transformer.wte.weight": (0.8496903777122498, -0.5609427690505981),
    "model.transformer.blocks.0.attn_norm.weight": (0.0051979669369757175, -0.0017694099806249142),
    "model.transformer.blocks.0.ff_norm.weight": (0.0009555709548294544, -3.0063732992857695e-05),
    "model.transformer.blocks.0.q_proj.weight": (0.0031884268391877413, 7.871027628425509e-05),
    "model.transformer.blocks.0.k_proj.weight": (0.0020282508339732885, -0.0005183419561944902),
}
DDO = 0.8766184449195862
DDO_GRADS = {
    "model.transformer.wte.weight": (7.17918586730957, 4.513365745544434),
    "model.transformer.blocks.0.attn_norm.weight": (0.04921478405594826, -0.02099005877971649),
    "model.transformer.blocks.0.ff_norm.weight": (0.009727048687636852, 0.008973272517323494),
    "model.transformer.blocks.0.q_proj.weight": (0.02088225446641445, -0.01745065487921238),
    "model.transformer.blocks.0.k_proj.weight": (0.020257286727428436, 0.01163305900990963),
}


def setup():
    model, batch, _ = injected("llada")
    reference = copy.deepcopy(model)
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    B, P, G, R = 4, batch.prompt_length, batch.sequences.shape[1] - batch.prompt_length, 4
    gen = torch.Generator().manual_seed(5)
    lam = 0.1 + 0.9 * torch.rand(B * R // 2, generator=gen)
    half = torch.rand(B * R // 2, G, generator=gen) < lam[:, None]  # row r * B + b: replicate r of row b
    masked = torch.zeros(B, R, P + G, dtype=torch.bool)
    for r in range(R // 2):
        masked[:, r, P:] = half[r * B:(r + 1) * B]
        masked[:, r + R // 2, P:] = ~half[r * B:(r + 1) * B]
    m = masked.sum(-1)
    draw = Draw(masked, t=m / G, weight=G / m.clamp(min=1))
    batch = replace(batch, rewards=torch.tensor(REWARDS), totals=replace(batch.totals, num_sequences=4))
    return model, reference, batch, draw


@pytest.mark.parametrize("kind", ["wdce", "ddo"])
def test_weights_loss_and_gradients_are_the_originals(kind):
    model, reference, batch, draw = setup()
    cfg = run_config("dmpo", loss=kind, alpha=1.0, coeff=1.0, centering=1.0, replicates=4)
    with torch.no_grad():
        old = dmpo.token_logps(model, batch, draw, cfg)
        ref = dmpo.token_logps(reference, batch, draw, cfg)
    log_rnd = dmpo.elbo(ref, draw) - dmpo.elbo(old, draw)
    assert log_rnd.tolist() == pytest.approx(LOG_RND, abs=1e-4)
    w, neg = dmpo.group_weights(batch.rewards, log_rnd, 2, cfg)
    assert w.tolist() == pytest.approx(WEIGHTS, abs=1e-5) and neg.tolist() == pytest.approx(NEGATIVE, abs=1e-5)
    model.zero_grad()
    loss, metrics = dmpo.loss(dmpo.token_logps(model, batch, draw, cfg), old, ref, batch, draw, cfg)
    loss.backward()
    scale = 2.0 if kind == "wdce" else 1.0  # wdce: the reference's loss is ours x the groups of its micro-batch
    assert loss.item() * scale == pytest.approx(WDCE if kind == "wdce" else DDO, rel=1e-4)
    grads = dict(model.named_parameters())
    for name, (norm, proj) in (WDCE_GRADS if kind == "wdce" else DDO_GRADS).items():
        g = grads[name].grad * scale
        assert g.norm().item() == pytest.approx(norm, rel=1e-4)
        assert (g * torch.linspace(-1, 1, g.numel()).view_as(g)).sum().item() == pytest.approx(proj, rel=1e-3, abs=1e-6)
    assert 0 < metrics["stats/ess"] <= 1


def test_noise_is_antithetic_pairs_over_the_completion():
    _, _, batch, _ = setup()
    cfg = run_config("dmpo", replicates=4)
    draw = dmpo.sample_noise(batch, torch.Generator().manual_seed(0), cfg)
    draw.check()
    P = batch.prompt_length
    assert draw.masked.shape == (4, 4, batch.sequences.shape[1])
    assert not draw.masked[..., :P].any()  # the prompt is never masked
    assert (draw.masked[:, 0, P:] ^ draw.masked[:, 2, P:]).all() and (draw.masked[:, 1, P:] ^ draw.masked[:, 3, P:]).all()
    shares = torch.cat([dmpo.sample_noise(batch, torch.Generator().manual_seed(s), cfg).t[:, :2]
                        for s in range(200)]).flatten()
    assert abs(shares.mean().item() - 0.55) < 0.02  # the masked share: lambda = 0.1 + 0.9 U, mean 0.55


def test_weights_of_a_group_sum_to_zero_after_centering():
    cfg = run_config("dmpo", alpha=0.04)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    A = dmpo.advantages(rewards, cfg)
    assert A.sum(dim=1).abs().max() < 1e-6 and (A[0, [0, 3]] > 0).all() and A[1].abs().max() < 1e-6


def test_check_config_wants_whole_groups_in_a_micro_batch():
    cfg = run_config("dmpo")
    dmpo.check_config(replace(cfg, train=replace(cfg.train, micro_batch_size=32)))
    with pytest.raises(ValueError, match="whole groups"):
        dmpo.check_config(replace(cfg, train=replace(cfg.train, micro_batch_size=24)))
