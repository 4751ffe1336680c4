"""BGPO: the linear bound by hand (tangent for A >= 0, Jensen for A < 0; equal to the ratio's value and
gradient on-policy), and the memory-bounded update: backpropagating one draw at a time gives the same
gradient as keeping every draw's graph."""

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from baselines.bgpo import algorithm as bgpo
from conftest import run_config
from dare.config import ScratchModelConfig
from dare.models import new_model
from dare.models.tokenizer import char_tokenizer
from dare.train.estimators import Compute
from dare.train.hooks import bind
from dare.train.rl import replayed_loss


def test_bound_by_hand_and_equal_to_the_ratio_on_policy():
    logps = torch.tensor([[-10.0, -12.0], [-5.0, -7.0]], requires_grad=True)
    old = torch.tensor([[-10.5, -11.0], [-5.0, -6.0]])
    adv = torch.tensor([1.0, -2.0])
    r = bgpo.bound(logps, old, adv)
    assert r[0].item() == pytest.approx(((1 + 0.5) + (1 - 1.0)) * 1.0 / 2)
    assert r[1].item() == pytest.approx((math.exp(0.0) + math.exp(-1.0)) * -2.0 / 2)
    assert (r <= torch.exp((logps - old).mean(dim=1)) * adv + 1e-6).all()  # a lower bound of the ratio objective
    on = logps.detach().clone().requires_grad_()
    bgpo.bound(on, on.detach(), adv).sum().backward()
    ratio = logps.detach().clone().requires_grad_()
    (torch.exp((ratio - ratio.detach()).mean(dim=1)) * adv).sum().backward()
    torch.testing.assert_close(on.grad, ratio.grad)  # on-policy: the same gradient (A / n per draw)


def test_memory_bounded_update_has_the_full_gradient():
    """replayed_loss (one draw's graph at a time) and the plain backward of the whole loss give the same
    parameter gradient, off-policy (old != current, both branches of the bound)."""
    tok = char_tokenizer("0123456789+=", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0)
    seqs = torch.randint(3, 14, (4, 9), generator=torch.Generator().manual_seed(0))
    response = torch.ones(4, 5, dtype=torch.bool)
    response[1, 3:] = False
    batch = SimpleNamespace(sequences=seqs, attention_mask=torch.ones_like(seqs), prompt_length=4,
                            response_mask=response, compute=Compute(pack=False),
                            advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]), num_sequences=4)
    cfg = run_config("bgpo", n_t=4)
    hooks = bind(bgpo)
    draw = bgpo.sample_noise(batch, torch.Generator().manual_seed(1), cfg)
    with torch.no_grad():
        old = bgpo.token_logps(model, batch, draw, cfg) + torch.tensor([0.3, -0.2, 0.1, 0.0])
    loss, _ = bgpo.loss(bgpo.token_logps(model, batch, draw, cfg), old, None, batch, draw, cfg)
    loss.backward()
    full = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    trainer = SimpleNamespace(backward=lambda x: x.backward())
    replayed, _, _ = replayed_loss(trainer, hooks, model, batch, draw, bgpo.draw_parts(draw, cfg), old, None, cfg)
    assert replayed.item() == pytest.approx(loss.item(), rel=1e-6) and not replayed.requires_grad
    for a, p in zip(full, model.parameters()):
        torch.testing.assert_close(p.grad, a, atol=1e-6, rtol=1e-5)
    assert bgpo.draw_parts(draw, dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, memory_bounded=False))) is None
