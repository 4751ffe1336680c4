"""IGPO (baselines/igpo) against the ORIGINAL code, facebookresearch/igpo @e85eaea, run in a scratch folder (never
committed) on tiny weights, its functions and blocks exec'd from its source text:

- the hint layout: `create_spacing_scaled_inpainting_sequence` / `scale_chunk_positions` (utils/generate.py) on
  references of 9-30 tokens, with the draws it made (Python's `random`: chunk sizes, the chunks kept back) recorded
  and given to `layout`;
- the replacement of a failed group's completions (the block of `_generate_and_score_completions`), global torch
  seed 11 (the same stream as a generator seeded 11);
- `_get_per_token_logps_grpo` (log-probs and entropies, d1_masking: the whole completion masked), the entropy
  filter block and `compute_loss` (use_gspo, beta 0.05, eps 0.2) with its gradients, on `injected()`'s tiny LLaDA
  (tests/test_tracerl_masked.py) with every weight x 4 (sharper predictions: the entropies rank the hint tokens),
  hint masks on three rows, old log-probs offset and advantages x 3 (as below).

The hinted rollout in the loop (`dare.train.hints`) is tested on the same tiny LLaDA with stand-in hooks."""

import contextlib
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from baselines.igpo import algorithm as igpo
from conftest import run_config
from dare.rollout import RolloutOutput, generate
from dare.train.batches import put, take
from dare.train.hints import hinted_rollout
from dare.train.hooks import bind
from dare.train.noise import Draw
from dare.utils import make_generator
from test_tracerl_masked import ADVANTAGES, injected

# (reference length, gen_length, share, min_chunk, max_spacing, the sizes drawn, the chunks kept back,
#  the original's canvas: {start: tokens}); the reference is the tokens 10, 11, ...; 30 positions free at the end
LAYOUTS = [
    (23, 48, 0.4, 3, 100, [4, 4, 3, 4, 5], [3, 4, 1], {0: [10, 11, 12, 13], 8: [18, 19, 20], 15: [25, 26, 27]}),
    (12, 50, 0.25, 2, 2, [2, 2, 3, 2, 3], [3, 4, 2], {0: [10, 11, 12, 13], 6: [19, 20, 21]}),
    (30, 40, 0.55, 2, 100, [2, 2, 2, 3, 2], [2], {0: [10, 11, 12, 13], 6: [16, 17, 18]}),
    (9, 45, 0.3, 1, 3, [1, 1, 2, 2, 1, 1, 2], [2, 4, 1, 5], {0: [10], 4: [14, 15], 9: [18]}),
    (17, 45, 0.6, 5, 100, [6, 7, 5], [], {0: list(range(10, 23))}),
]
# the replacement block on four groups of 8 (3.0: correct): six correct (4 drawn), none, one, all eight
HINTED_SCORES = [[0., 3., 3., 0., 3., 3., 3., 3.], [0.] * 8, [3.] + [0.] * 7, [3.] * 8]
REPLACED = [105, 107, 104, 102, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 116, 17, 18, 19, 20, 21, 22, 23,
            131, 127, 126, 129, 28, 29, 30, 31]  # row i: 100 + the hinted row that replaced it, else i
# _get_per_token_logps_grpo's (row sums) and the filter's kept tokens, compute_loss and 7 parameters' gradients
# (norm, projection on linspace(-1, 1))
LOGPS = [-48.283642, -37.706146, -37.803097, -48.773563]
ENTROPY = [25.927568, 23.377274, 27.915232, 28.456699]
KEEP = [[1, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 12, [0, 0, 1, 1, 1, 1, 0, 0, 1, 0, 0, 1],
        [1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1]]
LOSS = 0.16779069602489471
GRADS = {"model.transformer.wte.weight": (53.71486282348633, -24.299882888793945),
         "model.transformer.blocks.0.attn_norm.weight": (1.0697838068008423, -0.5569884777069092),
         "model.transformer.blocks.0.ff_norm.weight": (0.6587399840354919, -0.29398113489151),
         "model.transformer.blocks.0.q_proj.weight": (20.851072311401367, -10.4169921875),
         "model.transformer.blocks.0.k_proj.weight": (27.846786499023438, -9.659913063049316),
         "model.transformer.blocks.0.v_proj.weight": (42.46950149536133, 13.0015287399292),
         "model.transformer.blocks.0.attn_out.weight": (38.681243896484375, 18.81464385986328)}


@pytest.mark.parametrize("n, gen, share, min_chunk, spacing, sizes, hidden, canvas", LAYOUTS)
def test_hint_layout_is_the_originals(n, gen, share, min_chunk, spacing, sizes, hidden, canvas):
    cfg = run_config("igpo", min_chunk=min_chunk, max_chunk=10, free_tail=30, max_spacing=spacing)
    expected = [-1] * gen
    for start, tokens in canvas.items():
        expected[start:start + len(tokens)] = tokens
    assert igpo.layout(list(range(10, 10 + n)), share, gen, sizes, set(hidden), cfg) == expected


def test_hints_go_to_failed_groups_only_and_show_the_reference():
    cfg = run_config("igpo", min_chunk=1, max_chunk=2, free_tail=2)
    rewards = torch.tensor([[0.0, 1.0, 0.1, 0.0], [0.0, 0.1, 0.0, 0.0]])  # group 0 has a correct completion
    references = [[5, 6, 7], [20, 21, 22, 23, 24, 25]]
    fixed = igpo.hints(rewards, references, 10, torch.Generator().manual_seed(0), cfg)
    assert (fixed[:4] == -1).all() and (fixed[4:] >= 0).any(dim=1).all()  # every row of the failed group has a hint
    assert (fixed[4:, -2:] == -1).all()  # the free tail
    shown = fixed[4:][fixed[4:] >= 0]
    assert set(shown.tolist()) <= set(references[1])
    for row in fixed[4:]:  # the reference's order is kept, and its last chunk is always shown
        tokens = row[row >= 0].tolist()
        assert tokens == sorted(tokens) and tokens[-1] == 25
    assert igpo.hints(torch.ones(2, 4), references, 10, torch.Generator(), cfg) is None


def test_replacements_are_the_originals():
    cfg = run_config("igpo", solved_at=3.0, max_replacements=4)
    scores = torch.tensor(HINTED_SCORES)
    source = igpo.hinted(torch.zeros(4, 8), scores, torch.Generator().manual_seed(11), cfg)
    assert source.tolist() == [r - 100 if r >= 100 else -1 for r in REPLACED]
    nan = torch.full((4, 8), torch.nan)  # rows not decoded again are never taken
    assert (igpo.hinted(torch.zeros(4, 8), nan, torch.Generator(), cfg) == -1).all()


def sharp():
    model, batch, offsets = injected("llada")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    G = batch.sequences.shape[1] - batch.prompt_length
    given = torch.zeros(4, G, dtype=torch.bool)
    given[0, 1:6] = True  # 5 hint tokens: max(1, int(1.0)) = 1 kept
    given[2, [0, 1, 6, 7, 8, 9, 10]] = True  # 7: int(1.4) = 1
    given[3, 2:12] = True  # 10: 2
    batch = replace(batch, rollout=replace(batch.rollout, given=given),
                    advantages=torch.tensor(ADVANTAGES) * 3)
    return model, batch, offsets


def test_logps_entropies_filter_loss_and_gradients_are_the_originals():
    model, batch, offsets = sharp()
    cfg = run_config("igpo", beta=0.05, epsilon=0.2, hint_keep=0.2)
    with torch.no_grad():
        scored = igpo.token_logps(model, batch, Draw(), cfg)
    assert scored.shape == (4, 2, 12)
    assert scored[:, 0].sum(1).tolist() == pytest.approx(LOGPS, abs=1e-4)
    assert scored[:, 1].sum(1).tolist() == pytest.approx(ENTROPY, abs=1e-4)  # the original adds 1e-8 in the log
    keep = igpo.kept_tokens(batch.given, scored[:, 1], 0.2)
    assert keep.long().tolist() == KEEP
    units = igpo.loss_units(batch, Draw(), cfg)
    assert units == sum(map(sum, KEEP))
    batch = replace(batch, totals=replace(batch.totals, num_units=units))
    old = scored.clone()
    old[:, 0] += offsets * 0.3
    ref = scored.clone()
    ref[:, 0] += 0.1 * torch.linspace(-1, 1, 12)
    model.zero_grad()
    loss, metrics = igpo.loss(igpo.token_logps(model, batch, Draw(), cfg), old, ref, batch, Draw(), cfg)
    loss.backward()
    assert loss.item() == pytest.approx(LOSS, rel=1e-5)
    grads = dict(model.named_parameters())
    for name, (norm, proj) in GRADS.items():
        g = grads[name].grad
        assert g.norm().item() == pytest.approx(norm, rel=1e-4)
        assert (g * torch.linspace(-1, 1, g.numel()).view_as(g)).sum().item() == pytest.approx(proj, rel=1e-4, abs=1e-4)
    assert metrics["stats/hint_tokens"] == pytest.approx(4 / units)  # 1 + 1 + 2 hint tokens kept


def test_kept_tokens_without_hints_is_every_position():
    given = torch.zeros(2, 5, dtype=torch.bool)
    assert igpo.kept_tokens(given, torch.rand(2, 5), 0.2).all()


def test_check_config_refuses_what_the_hinted_rollout_cannot_follow():
    cfg = run_config("igpo")
    igpo.check_config(cfg)
    for model, decoding in ((replace(cfg.model, family="sdar"), cfg.rl.decoding),
                            (cfg.model, replace(cfg.rl.decoding, masked=replace(cfg.rl.decoding.masked, cache="dual"))),
                            (cfg.model, replace(cfg.rl.decoding, masked=replace(cfg.rl.decoding.masked, threshold=0.9)))):
        with pytest.raises(ValueError):
            igpo.check_config(replace(cfg, model=model, rl=replace(cfg.rl, decoding=decoding)))


def test_put_is_takes_inverse_and_refuses_a_missing_field():
    a = RolloutOutput(sequences=torch.arange(12).view(4, 3), attention_mask=torch.ones(4, 3), prompt_length=1,
                      response_mask=torch.ones(4, 2, dtype=torch.bool), step_map=torch.zeros(4, 2), nfe=3)
    b = replace(a, sequences=-torch.arange(6).view(2, 3), attention_mask=torch.ones(2, 3),
                response_mask=torch.zeros(2, 2, dtype=torch.bool), step_map=torch.ones(2, 2), nfe=5)
    rows = torch.tensor([3, 1])
    merged = put(a, rows, b, 4)
    assert torch.equal(take(merged, rows, 4).sequences, b.sequences) and merged.nfe == 3
    assert torch.equal(merged.sequences[[0, 2]], a.sequences[[0, 2]]) and torch.equal(a.sequences, torch.arange(12).view(4, 3))
    with pytest.raises(ValueError, match="lacks"):
        put(a, rows, replace(b, given=torch.zeros(2, 2, dtype=torch.bool)), 4)


def test_the_hinted_rollout_replaces_the_chosen_rows_with_hinted_completions():
    """`hinted_rollout` with stand-in hooks on the tiny LLaDA: the second group's rows are decoded again with
    given tokens; hinted row 3 replaces row 2; the rest of the rollout, its rewards and its given mask stay."""
    model, batch, _ = injected("llada")
    P = batch.prompt_length
    decoding = replace(run_config("igpo").rl.decoding, gen_length=12, block_length=6, steps=6, temperature=0.0)
    ids, mask = batch.sequences[:, :P], batch.attention_mask[:, :P]
    out = generate(model, ids, mask, decoding)
    fixed = torch.full((4, 12), -1)
    fixed[2:, 0:3] = torch.tensor([12, 14, 13])

    def hints(rewards, references, gen_length, generator, cfg):
        assert references == [[7, 8], [9]] and gen_length == 12 and rewards.shape == (2, 2)
        return fixed

    def hinted(rewards, hinted_rewards, generator, cfg):
        assert torch.isnan(hinted_rewards[0]).all() and hinted_rewards[1].tolist() == [2.0, 3.0]
        return torch.tensor([-1, -1, 3, -1])

    hooks = bind(SimpleNamespace(RECIPE="rl", SCORE="token", advantages=igpo.advantages, token_logps=igpo.token_logps,
                                 loss=igpo.loss, hints=hints, hinted=hinted, __name__="stand-in"))
    r = SimpleNamespace(
        cfg=SimpleNamespace(run=SimpleNamespace(seed=0), rl=SimpleNamespace(group_size=2, gather_rollout=True)),
        dist=SimpleNamespace(any=lambda flag: flag, rank=0, device=torch.device("cpu")), hooks=hooks,
        task=SimpleNamespace(target=lambda row: row["solution"]),
        tokenizer=lambda texts, add_special_tokens: {"input_ids": [[int(c) for c in t.split()] for t in texts]},
        trainer=SimpleNamespace(model=model, autocast=contextlib.nullcontext),
        counter=SimpleNamespace(phase=lambda name: contextlib.nullcontext()), rollout_cfg=decoding, marker=None)
    rows_of = [{"solution": "7 8"}] * 2 + [{"solution": "9"}] * 2
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0])
    merged, new_rewards = hinted_rollout(r, out, rewards, (ids, mask), rows_of,
                                         lambda completions, rows: torch.tensor([2.0, 3.0]), step=5)
    again = generate(model, ids[2:], mask[2:], decoding, make_generator(0, "hints/5/0"), fixed=fixed[2:])
    assert torch.equal(merged.sequences[[0, 1, 3]], out.sequences[[0, 1, 3]])
    assert torch.equal(merged.sequences[2], again.sequences[1]) and torch.equal(merged.step_map[2], again.step_map[1])
    assert merged.given[2].tolist() == [True] * 3 + [False] * 9 and not merged.given[[0, 1, 3]].any()
    assert new_rewards.tolist() == [0.0, 1.0, 3.0, 0.0] and rewards.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert merged.nfe == out.nfe + again.nfe
