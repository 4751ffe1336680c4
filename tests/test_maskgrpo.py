"""MaskGRPO (baselines/maskgrpo) against the ORIGINAL code, martian422/MaskGRPO @b74ba3c `grpo/mask_grpo_trainer.py`
(text tasks, `version: uni`), run in a scratch folder (never committed) on `injected()`'s tiny LLaDA
(tests/test_tracerl_masked.py), its methods exec'd from the source text: `_get_per_token_logps_uni` with
`remask_ar` (AR-like reversing) and `remask_t2t` (random) for mu = 3 updates at min_mask_rate 0.6, the advantage
lines of `_generate_and_score_completions` (two groups of 2, rewards REWARDS), and `compute_loss` (mean_method grpo,
beta 0.01, eps 0.2) at each update with its gradients; old log-probs = its own + 0.2 (i + 1) x injected()'s offsets,
reference = its own + 0.05. The original's `torch.rand` draws are injected: U (seed 9) for its per-update seeds."""

from dataclasses import replace

import pytest
import torch

from baselines.maskgrpo import algorithm as maskgrpo
from conftest import run_config
from dare.train.noise import Draw
from test_tracerl_masked import injected

REWARDS = [1.0, 0.0, 0.3, 0.1]
ADVANTAGES = [0.7070967555046082, -0.7070967555046082, 0.7070568203926086, -0.7070567607879639]
ARLIKE_MASKS = [[[1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1], [1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1], [1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1]], [[1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1], [1, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1]], [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]]
ARLIKE_OLD = [[-35.77409, -36.08059, -34.00107, -36.58501], [-35.65073, -36.15827, -34.11767, -36.58471], [-35.72432, -36.16644, -34.11767, -36.62572]]
ARLIKE_LOSS = [-0.4507053792476654, -0.28046777844429016, 0.0134586738422513]
ARLIKE_GRADS = [{'model.transformer.wte.weight': (0.5119706392288208, -0.012018874287605286), 'model.transformer.blocks.0.attn_norm.weight': (0.006210780702531338, -0.0012591538252308965), 'model.transformer.blocks.0.ff_norm.weight': (0.0006035121623426676, 0.00028440350433811545)}, {'model.transformer.wte.weight': (0.9626979231834412, 0.06143632531166077), 'model.transformer.blocks.0.attn_norm.weight': (0.010145698674023151, -0.0009673452004790306), 'model.transformer.blocks.0.ff_norm.weight': (0.0010049614356830716, 0.0008739533368498087)}, {'model.transformer.wte.weight': (1.640677809715271, -0.206945538520813), 'model.transformer.blocks.0.attn_norm.weight': (0.019078288227319717, -0.0035531921312212944), 'model.transformer.blocks.0.ff_norm.weight': (0.0019356152042746544, 0.001642225543037057)}]
RANDOM_MASKS = [[[0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0], [1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 1, 0], [1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1]], [[0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0], [1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1], [1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]], [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]]
RANDOM_OLD = [[-35.53699, -35.9994, -33.93581, -36.61318], [-35.59805, -36.14942, -33.98817, -36.59945], [-35.72432, -36.16644, -34.11767, -36.62572]]
RANDOM_LOSS = [-0.4507053792476654, -0.2804676592350006, 0.0134586738422513]
RANDOM_GRADS = [{'model.transformer.wte.weight': (0.5857757329940796, -0.18716448545455933), 'model.transformer.blocks.0.attn_norm.weight': (0.004464875441044569, -0.002133760368451476), 'model.transformer.blocks.0.ff_norm.weight': (0.0008574941311962903, 0.0004410858382470906)}, {'model.transformer.wte.weight': (1.0456815958023071, -0.3988878130912781), 'model.transformer.blocks.0.attn_norm.weight': (0.01030764915049076, -0.004254566039890051), 'model.transformer.blocks.0.ff_norm.weight': (0.0014045699499547482, 0.000690205954015255)}, {'model.transformer.wte.weight': (1.640677809715271, -0.206945538520813), 'model.transformer.blocks.0.attn_norm.weight': (0.019078288227319717, -0.0035531921312212944), 'model.transformer.blocks.0.ff_norm.weight': (0.0019356152042746544, 0.001642225543037057)}]


def setup():
    model, batch, offsets = injected("llada")
    B, L = batch.sequences.shape
    gen = torch.Generator().manual_seed(9)
    U = [torch.rand(B, L, generator=gen) for _ in range(3)]
    batch = replace(batch, rewards=torch.tensor(REWARDS),
                    totals=replace(batch.totals, num_tokens=float(batch.response_mask.sum())))
    return model, batch, offsets, U


def drawn(batch, u, ratio, remasking):
    P = batch.prompt_length
    G = batch.sequences.shape[1] - P
    if remasking == "arlike":
        masked = u[:, P:] > maskgrpo.completion_keep(P, P + G, ratio, run_config("maskgrpo"))
    else:
        masked = u[:, P:] < ratio
    return Draw(torch.cat([torch.zeros(4, P, dtype=torch.bool), masked], dim=1), t=torch.full((4,), ratio))


def test_advantages_are_the_originals():
    cfg = run_config("maskgrpo")
    assert maskgrpo.advantages(torch.tensor(REWARDS).view(2, 2), cfg).reshape(-1).tolist() == \
        pytest.approx(ADVANTAGES, abs=1e-6)


@pytest.mark.parametrize("remasking", ["arlike", "random"])
def test_masks_logps_loss_and_gradients_are_the_originals(remasking):
    model, batch, offsets, U = setup()
    cfg = run_config("maskgrpo", remasking=remasking, min_mask_rate=0.6, beta=0.01, epsilon=0.2)
    cfg = replace(cfg, rl=replace(cfg.rl, num_iterations=3))
    batch = replace(batch, advantages=torch.tensor(ADVANTAGES))
    masks, olds, losses, grads = [ARLIKE_MASKS, ARLIKE_OLD, ARLIKE_LOSS, ARLIKE_GRADS] if remasking == "arlike" else \
        [RANDOM_MASKS, RANDOM_OLD, RANDOM_LOSS, RANDOM_GRADS]
    for i in range(3):
        ratio = maskgrpo.mask_ratio(i, cfg)
        draw = drawn(batch, U[i], ratio, remasking)
        assert draw.masked[:, batch.prompt_length:].long().tolist() == masks[i]
        with torch.no_grad():
            own = maskgrpo.token_logps(model, batch, draw, cfg)
        assert own.sum(1).tolist() == pytest.approx(olds[i], abs=1e-4)
        model.zero_grad()
        loss, _ = maskgrpo.loss(maskgrpo.token_logps(model, batch, draw, cfg), own + 0.2 * (i + 1) * offsets,
                                own + 0.05, batch, draw, cfg)
        loss.backward()
        assert loss.item() == pytest.approx(losses[i], rel=1e-5)
        params = dict(model.named_parameters())
        for name, (norm, proj) in grads[i].items():
            g = params[name].grad
            assert g.norm().item() == pytest.approx(norm, rel=1e-4)
            assert (g * torch.linspace(-1, 1, g.numel()).view_as(g)).sum().item() == pytest.approx(proj, rel=1e-3, abs=1e-7)


def test_the_ratio_rises_over_the_updates_and_the_arlike_mask_masks_later_positions_more():
    cfg = run_config("maskgrpo", min_mask_rate=0.6)
    cfg = replace(cfg, rl=replace(cfg.rl, num_iterations=4))
    assert [maskgrpo.mask_ratio(i, cfg) for i in range(4)] == pytest.approx([0.7, 0.8, 0.9, 0.999])
    keep = maskgrpo.keep_probabilities(200, 0.7)
    assert (keep[1:] <= keep[:-1]).all() and abs(1 - keep.mean().item() - 0.7) < 1e-4
    paper = replace(cfg, algo=replace(cfg.algo, ar_span="completion"))
    assert torch.equal(maskgrpo.completion_keep(50, 250, 0.7, paper), keep)
    code = maskgrpo.completion_keep(50, 250, 0.7, cfg)  # the curve over positions 1..249, read at 50..249
    assert len(code) == 200 and 1 - code.mean().item() > 0.75  # more masked than the ratio says (0.76)
    _, batch, _, _ = setup()
    masked = torch.stack([maskgrpo.sample_noise(batch.drawing(1), torch.Generator().manual_seed(s), cfg)
                          .masked[:, batch.prompt_length:] for s in range(300)]).float()
    share = masked.mean(dim=(0, 1))
    assert share[:4].mean() < share[-4:].mean()
    expected = 1 - maskgrpo.completion_keep(batch.prompt_length, batch.sequences.shape[1], 0.8, cfg).mean().item()
    assert abs(masked.mean().item() - expected) < 0.02
    with pytest.raises(ValueError):
        maskgrpo.check_config(replace(cfg, rl=replace(cfg.rl, noise_draws="once")))

