"""ESPO and GDPO: sequence-level ratios of ELBOs normalized by the generation length; their losses match
hand computations, their advantages are the references' (leave-one-out / group mean), and the ELBO is the
library's estimate on their draws (coupled pairs / Gauss-Legendre nodes)."""

import math
from types import SimpleNamespace

import pytest
import torch

from baselines.espo import algorithm as espo
from baselines.gdpo import algorithm as gdpo
from conftest import run_config
from dare.train import noise


def _batch(adv, G=4, P=2):
    B = len(adv)
    return SimpleNamespace(advantages=torch.tensor(adv), sequences=torch.zeros(B, P + G, dtype=torch.long),
                           prompt_length=P, num_sequences=B)


def test_espo_loss_by_hand():
    cfg = run_config("espo")  # eps 0.2, beta 1e-3
    batch = _batch([1.0, -1.0])
    logps, old, ref = torch.tensor([-10.0, -20.0]), torch.tensor([-12.0, -19.0]), torch.tensor([-11.0, -18.0])
    loss, m = espo.loss(logps, old, ref, batch, None, cfg)
    r0, r1 = math.exp(2 / 4), math.exp(-1 / 4)  # (ELBO - old) / L, L = 4
    p0 = min(r0 * 1, min(r0, 1.2) * 1)  # A > 0: clipped at 1.2
    p1 = min(r1 * -1, max(r1, 0.8) * -1)  # A < 0: r1 = 0.78 < 0.8, the clip bites
    kl = (0.5 * 1 ** 2 / 4 + 0.5 * 2 ** 2 / 4)
    assert loss.item() == pytest.approx((-(p0 + p1) + 1e-3 * kl) / 2, rel=1e-6)
    assert m["loss/kl"] == pytest.approx(kl / 2)
    assert espo.advantages(torch.tensor([[1.0, 0.0, 0.0]]), cfg).tolist() == [[1.0, -0.5, -0.5]]  # leave-one-out


def test_gdpo_loss_by_hand_and_its_ratio_is_one_on_the_old_policy():
    cfg = run_config("gdpo", beta=0.04)  # eps 0.5
    batch = _batch([0.5, -0.5])
    logps, ref = torch.tensor([-8.0, -6.0], requires_grad=True), torch.tensor([-9.0, -6.5])
    loss, _ = gdpo.loss(logps, logps.detach(), ref, batch, None, cfg)
    k3 = [math.exp(d) - d - 1 for d in (-1.0, -0.5)]
    assert loss.item() == pytest.approx((-(0.5 - 0.5) + 0.04 * sum(k3)) / 2, rel=1e-6)
    loss.backward()  # at rho = 1: d/dELBO of -rho A = -A / L, plus the KL's (1 - e^delta) beta, over 2 rows
    want = [(-a / 4 + 0.04 * (1 - math.exp(d))) / 2 for a, d in ((0.5, -1.0), (-0.5, -0.5))]
    assert logps.grad.tolist() == pytest.approx(want, rel=1e-5)
    assert gdpo.advantages(torch.tensor([[1.0, 0.0]]), cfg).tolist() == [[0.5, -0.5]]


@pytest.mark.parametrize("name", ["espo", "gdpo"])
def test_draws_cover_the_completion_only_and_the_elbo_is_the_librarys(name, tmp_path):
    """The draws mask completion positions only (every one, after the first EOS too, as the references), and
    token_logps is estimators.elbo on exactly those draws."""
    from dare.config import ScratchModelConfig
    from dare.models import new_model
    from dare.models.tokenizer import char_tokenizer
    from dare.train.estimators import Compute, elbo

    tok = char_tokenizer("0123456789+=", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0).eval()
    seqs = torch.randint(3, 14, (3, 9), generator=torch.Generator().manual_seed(0))
    batch = SimpleNamespace(sequences=seqs, attention_mask=torch.ones_like(seqs), prompt_length=4, compute=Compute())
    cfg = run_config(name)
    module = {"espo": espo, "gdpo": gdpo}[name]
    draw = module.sample_noise(batch, torch.Generator().manual_seed(1), cfg)
    assert not draw.masked[:, :, :4].any() and draw.masked[:, :, 4:].any()
    with torch.no_grad():
        got = module.token_logps(model, batch, draw, cfg)
        want = elbo(model, seqs, batch.attention_mask, noise.completion(batch.attention_mask, 4), draw)
    torch.testing.assert_close(got, want)
    assert got.shape == (3,) and (got < 0).all()


def test_the_log_space_clip_is_ppos_min_in_value_and_gradient():
    from dare.train.objectives import clipped_sequence_objective

    g = torch.Generator().manual_seed(0)
    log_ratio = (torch.randn(64, generator=g) * 0.5).requires_grad_()
    adv = torch.randn(64, generator=g)
    for lo, hi in ((0.2, 0.2), (0.2, 0.28), (0.0, 0.0), (0.5, 0.5)):
        ours, _ = clipped_sequence_objective(log_ratio, adv, lo, hi)
        (a,) = torch.autograd.grad(ours.sum(), log_ratio)
        r = log_ratio.exp()
        ppo = torch.min(r * adv, r.clamp(1 - lo, 1 + hi) * adv)
        (b,) = torch.autograd.grad(ppo.sum(), log_ratio)
        torch.testing.assert_close(ours, ppo)
        torch.testing.assert_close(a, b)
    big = torch.tensor([800.0, -800.0])  # exp(800) overflows: the log-space form stays finite
    assert torch.isfinite(clipped_sequence_objective(big, torch.tensor([1.0, -1.0]), 0.2, 0.2)[0]).all()
