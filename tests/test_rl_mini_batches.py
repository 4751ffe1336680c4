"""`rl.mini_batches`: k optimizer steps per update, each on its slice of the groups and normalized by its own
totals (verl's `ppo_mini_batch_size`), checked against a hand-computed two-mini-batch step; k = 1 is the
whole batch, as before; a run with two mini-batches trains and counts its optimizer steps."""

import contextlib
import json

import pytest
import torch

from conftest import RL
from dare.train.batches import updates
from dare.rollout import RolloutOutput
from dare.train.rl import RLBatch, Totals, mini_batches
from dare.train.dist import Dist


class SGD:
    """A trainer of one scalar weight w with plain SGD at learning rate 1 (w <- w - gradient)."""

    def __init__(self):
        self.w = torch.zeros((), requires_grad=True)
        self.model, self.dist, self.gradients = torch.nn.Module(), Dist(), []

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def step(self) -> float:
        g = self.w.grad.clone()
        self.gradients.append(float(g))
        with torch.no_grad():
            self.w -= g
        self.w.grad = None
        return float(g.abs())


def two_groups() -> RLBatch:
    """Groups (rows 0, 1) and (rows 2, 3); loss tokens 3, 2 | 1, 3; advantages 1, -1 | 0.5, -0.5."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    rollout = RolloutOutput(sequences=torch.zeros(4, 4, dtype=torch.long), attention_mask=torch.ones(4, 4),
                            prompt_length=1, response_mask=mask, step_map=torch.zeros(4, 3, dtype=torch.long), nfe=0)
    return RLBatch(rollout=rollout, rewards=torch.zeros(4), advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
                   group_size=2, totals=Totals(num_tokens=9.0, num_sequences=4, num_active=4))


def step(k: int, micro: int):
    """One update with the token-mean loss sum_k (w - A_i)^2 / num_tokens of each (mini-)batch."""
    trainer, batch = SGD(), two_groups()

    def loss_of(mb, z, it, rows):
        loss = ((trainer.w - mb.advantages[:, None]) ** 2 * mb.response_mask).sum() / mb.num_tokens
        return loss, {}

    minis = mini_batches(batch, k, trainer.dist, lambda mb, rows: 0.0)
    sums = updates(trainer, minis, [None], micro, loss_of, "loss", "norm")
    return trainer, sums, minis


@pytest.mark.parametrize("micro", [0, 1])
def test_two_mini_batches_by_hand(micro):
    """Mini-batch 1 (rows 0, 1; 5 tokens) at w = 0: loss (3 + 2) / 5 = 1, gradient 2 (3 (0 - 1) + 2 (0 + 1)) / 5
    = -0.4, so w = 0.4; mini-batch 2 (rows 2, 3; 4 tokens) at w = 0.4: loss (0.1^2 + 3 x 0.9^2) / 4 = 0.61,
    gradient 2 (1 (0.4 - 0.5) + 3 (0.4 + 0.5)) / 4 = 1.3, so w = -0.9. The logged loss is the mean over the two
    optimizer steps; micro-batches within a mini-batch accumulate into its one step."""
    trainer, sums, minis = step(2, micro)
    assert [m.num_tokens for _, m in minis] == [5.0, 4.0] and [m.num_sequences for _, m in minis] == [2, 2]
    assert trainer.gradients == pytest.approx([-0.4, 1.3])
    assert trainer.w.item() == pytest.approx(-0.9)
    assert sums["loss"] == pytest.approx((1.0 + 0.61) / 2) and sums["norm"] == pytest.approx((0.4 + 1.3) / 2)


def test_one_mini_batch_is_the_whole_batch():
    """k = 1: one step on all 9 tokens, gradient 2 (-3 + 2 - 0.5 + 1.5) / 9 = 0: w stays 0, as before."""
    trainer, sums, minis = step(1, 1)
    assert len(minis) == 1 and minis[0][1] is not None and minis[0][1].num_tokens == 9.0
    assert trainer.gradients == pytest.approx([0.0]) and trainer.w.item() == 0.0
    assert sums["loss"] == pytest.approx((3 + 2 + 0.25 + 0.75) / 9)


def test_a_run_with_two_mini_batches_makes_two_optimizer_steps_per_update(tmp_path, monkeypatch, sft_checkpoint):
    """d1 on a tiny LLaDA: after 2 rollout batches, 2 x mu = 2 x 2 mini-batches = 8 optimizer steps (Adam's count
    in the step-2 checkpoint); a count that does not divide the prompts stops in one line."""
    from dare.app.runs import train
    from dare.data import TASKS
    from dare.utils import UserError

    monkeypatch.setattr(TASKS["addition"], "rewards", lambda texts, rows, style="default": [
        float(i % 2) for i in range(len(texts))])
    base = [f"model.path={sft_checkpoint('llada')}", "model.family=llada", *RL]
    out = train("d1", None, [*base, "rl.mini_batches=2", "train.steps=3", "run.save_every=2",
                             f"run.out_dir={tmp_path / 'two'}"])
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["optim/grad_norm"] > 0 for r in records)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(out / "checkpoints" / "step_0000002" / "dcp", tmp_path / "whole.pt")
    state = torch.load(tmp_path / "whole.pt", weights_only=False)
    assert {float(s["step"]) for s in state["optimizer"]["state"].values()} == {8.0}  # Adam's step count
    with pytest.raises(UserError, match=r"rl.mini_batches=3 must divide the 4 prompts"):
        train("d1", None, [*base, "rl.mini_batches=3", f"run.out_dir={tmp_path / 'three'}"])
