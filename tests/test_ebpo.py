"""EBPO: per-block stratified draws (every cell's level on one stratified grid, 1..L_b tokens masked, weight
L_b / l_b), the composite ELBO of a draw in one forward over all blocks, and the log-space clipped loss by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from baselines.ebpo import algorithm as ebpo
from conftest import run_config
from dare.models import facts
from dare.rollout import left_pad
from dare.train import noise
from dare.train.estimators import Compute, block_diffusion_logps
from test_block_rl import PROMPTS, tiny


def test_block_stratified_draws():
    response = torch.tensor([[True] * 6 + [False] * 2, [True] * 8])
    segment = (torch.arange(8) // 4).expand(2, 8)
    d = noise.block_stratified(response, segment, 3, 4, torch.Generator().manual_seed(0))
    assert not d.masked[:, :, :3].any() and not d.masked[0, :, 3 + 6:].any()  # prompt, after the response
    assert d.t is None and d.t_at.shape == d.masked.shape  # one level per (draw, block) cell, at its positions
    assert not d.t_at[:, :, :3].any() and not d.t_at[0, :, 3 + 6:].any()
    for b in range(2):
        cells = [(j, 3 + torch.nonzero((segment[b] == k) & response[b])[:, 0]) for j in range(4) for k in range(2)]
        assert all((d.t_at[b, j, cols] == d.t_at[b, j, cols[0]]).all() for j, cols in cells)  # one level a cell
        levels = torch.stack([d.t_at[b, j, cols[0]] for j, cols in cells]).sort().values
        assert torch.allclose(levels[1:] - levels[:-1], torch.full((7,), 1 / 8), atol=1e-6)  # one stratified grid
        for j, cols in cells:
            count = int(d.masked[b, j, cols].sum())
            assert count == min(int(d.t_at[b, j, cols[0]] * len(cols)) + 1, len(cols))
            assert (d.weight[b, j, cols][d.masked[b, j, cols]] == len(cols) / count).all()
    assert (d.weight[~d.masked] == 0).all()


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_composite_elbo_is_the_weighted_block_layout_log_probs(family):
    """token_logps: for each draw, sum over blocks of L_b / l_b x the masked tokens' log-probs, each block given
    the clean blocks before it: one [x_t ; x_0] forward per draw over all blocks, row by row as alone."""
    model = tiny(family)
    f = facts(model)
    ids, mask = left_pad(PROMPTS, f.pad_token_id)
    G = 7
    seqs = torch.cat([ids, torch.randint(3, 14, (3, G), generator=torch.Generator().manual_seed(0))], dim=1)
    attn = torch.cat([mask, torch.ones(3, G, dtype=mask.dtype)], dim=1)
    batch = SimpleNamespace(sequences=seqs, attention_mask=attn, prompt_length=ids.shape[1], block_size=f.block_size,
                            response_mask=torch.ones(3, G, dtype=torch.bool), compute=Compute(),
                            step_map=torch.zeros(3, G, dtype=torch.long))
    cfg = run_config("ebpo", n_t=3)
    draw = ebpo.sample_noise(batch, torch.Generator().manual_seed(1), cfg)
    with torch.no_grad():
        got = ebpo.token_logps(model, batch, draw, cfg)
        for b in range(3):
            row, m = seqs[b][attn[b].bool()], attn[b].bool()
            for j in range(3):
                where = draw.masked[b, j][m]
                x = torch.where(where, f.mask_token_id, row)
                lp = block_diffusion_logps(model, x[None], row[None], where[None])[0]
                want = (lp * draw.weight[b, j][m]).sum()
                assert got[b, j].item() == pytest.approx(want.item(), rel=1e-5, abs=1e-5)


def test_loss_by_hand_with_the_log_space_clip():
    cfg = run_config("ebpo")  # eps 0.2 / 0.2
    batch = SimpleNamespace(advantages=torch.tensor([1.0, 1.0, -1.0, -1.0]), num_sequences=4)
    old = torch.zeros(4, 2)
    logps = torch.tensor([[0.1, 0.1], [1.0, 1.0], [-0.1, -0.1], [-1.0, -1.0]], requires_grad=True)
    loss, m = ebpo.loss(logps, old, None, batch, None, cfg)
    want = -(math.exp(0.1) + 1.2 - math.exp(-0.1) - 0.8) / 4
    assert loss.item() == pytest.approx(want, rel=1e-6) and m["stats/clip_ratio"] == 0.5
    loss.backward()
    assert logps.grad[1].abs().sum() == 0 and logps.grad[3].abs().sum() == 0  # clipped rows: no gradient
    assert logps.grad[0, 0].item() == pytest.approx(-math.exp(0.1) / 2 / 4)
