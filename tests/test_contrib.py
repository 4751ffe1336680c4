"""A baseline written from the hook contract alone (tests/contrib/unigrpo.py, UniGRPO): its loss
averages over the masked positions it receives in the draw, and it trains through the library's
`fit` without any file under shared/ knowing it (issue 28, item 1)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from conftest import RL
from contrib import unigrpo
from dare.config import load
from dare.train.fit import fit
from dare.train.hooks import RLHooks, bind
from dare.train.noise import Draw


def test_the_loss_sees_the_draw_and_averages_over_the_masked_positions():
    P = 2
    masked = torch.tensor([[False, False, True, False, True], [False, False, False, True, False]])
    batch = SimpleNamespace(prompt_length=P, advantages=torch.tensor([1.0, -1.0]), num_sequences=2)
    logps = torch.tensor([[-1.0, -9.0, -3.0], [-9.0, -4.0, -9.0]], requires_grad=True)  # -9: not masked
    old = logps.detach() + torch.tensor([[math.log(2)], [0.0]])  # ratio 1/2 for row 0, 1 for row 1
    cfg = load(unigrpo.Config, overrides=["algo.beta=0"])
    value, metrics = unigrpo.loss(logps, old, None, batch, Draw(masked), cfg)
    # A=+1, ratio 0.5 -> min(0.5, 0.8) = 0.5; A=-1, ratio 1 -> -1
    assert value.item() == pytest.approx(-(0.5 - 1.0) / 2)
    value.backward()
    assert logps.grad[0, 1] == 0 and logps.grad[1, 0] == 0 and logps.grad[1, 2] == 0  # unmasked: no gradient
    # masked positions share their completion's gradient: d/dlogp of -A * ratio * mean / 2
    torch.testing.assert_close(logps.grad[0, [0, 2]], torch.tensor([-0.125, -0.125]))
    torch.testing.assert_close(logps.grad[1, 1], torch.tensor(0.5))
    assert metrics["stats/masked_fraction"] == pytest.approx(3 / 6)


def test_a_contributed_algorithm_trains_through_fit(tmp_path, monkeypatch, sft_checkpoint):
    from dare.data import TASKS

    assert isinstance(bind(unigrpo), RLHooks)
    monkeypatch.setattr(TASKS["addition"], "rewards", lambda texts, rows, style="default": [
        float(i % 2) for i in range(len(texts))])
    cfg = load(unigrpo.Config, overrides=[f"model.path={sft_checkpoint('llada')}", "model.family=llada", *RL])
    run = fit(unigrpo, cfg, tmp_path / "unigrpo", name="unigrpo")
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(0 < r["stats/masked_fraction"] < 1 for r in records)
    assert all(math.isfinite(r["loss/total"]) for r in records) and any(r["optim/grad_norm"] > 0 for r in records)
    assert json.loads((run / "final" / "dare.json").read_text())["baseline"] == "unigrpo"
