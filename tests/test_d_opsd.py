"""d-OPSD (baselines/d_opsd) against the ORIGINAL code, xingzhejun/d-OPSD @1b55cf3, run in a scratch folder (never
committed) on `injected()`'s tiny LLaDA (tests/test_tracerl_masked.py) with every weight x 3, the teacher a copy
moved by 0.3 N(0, 1) (seed 4) and swapped in by a stand-in `disable_adapter` (fixed_teacher), its functions and
blocks exec'd from the source text: `generate` (d-opsd/utils.py) at temperature 0 (24 tokens, blocks of 8, 12
steps: two tokens a step) and the states it records; the teacher-trajectory block of `_generate_and_score_completions`
(retain 0.25, `torch.randperm` replaced by the identity, so the first candidates are shown); `compute_loss` (beta 1,
top-k 5, clip 0.05, batch_divide 2) at both updates with its gradients; `generalized_jsd_loss` on random logits
(seed 2, (3, 2, 9) x 2, top-k 4) for beta 0, 0.5 and 1."""

from dataclasses import replace

import copy
import pytest
import torch

from baselines.d_opsd import algorithm as d_opsd
from conftest import run_config
from dare.config import DecodingConfig
from dare.rollout import generate
from dare.train import noise
from dare.train.noise import Draw
from test_tracerl_masked import injected

COMPLETION = [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 7, 3, 18, 13, 12, 4, 12, 12, 12, 12, 12, 12]
SHOWN = [[8, 9, 10, 11], [8, 9, 10, 11], [8, 9, 10, 11], [8, 9, 10, 11], [16, 17], [16, 17], [16, 17], []]
LOSSES = [-0.08481281250715256, -0.06097981333732605]
GRADS = [{'model.transformer.wte.weight': (2.244105815887451, -1.663688063621521), 'model.transformer.blocks.0.attn_norm.weight': (0.04852853715419769, -0.01701989956200123), 'model.transformer.blocks.0.ff_norm.weight': (0.03635573759675026, 0.02117297053337097)}, {'model.transformer.wte.weight': (5.222617149353027, -0.35161375999450684), 'model.transformer.blocks.0.attn_norm.weight': (0.13441599905490875, 0.013478634878993034), 'model.transformer.blocks.0.ff_norm.weight': (0.053405195474624634, 0.018474766984581947)}]
JSD = {0.0: (-0.22409109771251678, 0.5), 0.5: (0.2551480531692505, 0.4166666567325592), 1.0: (-0.12181239575147629, 0.375)}

DECODING = DecodingConfig(gen_length=24, block_length=8, steps=12, temperature=0.0)


def setup():
    model, batch, _ = injected("llada")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    teacher = copy.deepcopy(model)
    with torch.no_grad():
        g = torch.Generator().manual_seed(4)
        for p in teacher.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    P = batch.prompt_length
    out = generate(model, batch.sequences[:1, :P], batch.attention_mask[:1, :P], DECODING)
    batch = replace(batch, rollout=out, rewards=torch.tensor([1.0]), advantages=torch.zeros(1), group_size=1,
                    totals=replace(batch.totals, num_sequences=1))
    return model, teacher, batch


def cfg_of(**algo):
    cfg = run_config("d_opsd", top_k=5, beta=1.0, token_clip=0.05, retain=0.25, **algo)
    return replace(cfg, rl=replace(cfg.rl, num_iterations=2, group_size=1, decoding=DECODING))


def test_the_trajectory_and_its_recorded_states_are_the_originals():
    model, teacher, batch = setup()
    assert batch.responses[0].tolist() == COMPLETION
    batch = d_opsd.prepare(batch, cfg_of())
    assert batch.extras["states"][0].nonzero()[:, 0].tolist() == list(range(len(SHOWN)))  # blocks 0 and 1, no EOS


def test_the_teachers_view_follows_the_originals_rule():
    model, teacher, batch = setup()
    cfg = cfg_of()
    batch = d_opsd.prepare(batch, cfg)
    for j in range(2):
        draw = d_opsd.sample_noise(batch.drawing(j), torch.Generator().manual_seed(j), cfg)
        draw.check()
        assert draw.steps[0].tolist() == [3 * j, 3 * j + 1, 3 * j + 2]  # (8 - 1) // 2 = 3 states an update, in turn
        P = batch.prompt_length
        for k, step in enumerate(draw.steps[0].tolist()):
            shown = draw.shown[0, k, P:].nonzero()[:, 0].tolist()
            expected = SHOWN[step]  # the original's first candidates; ours drawn: the same count, the same range
            assert len(shown) == len(expected) and all(p >= expected[0] for p in shown)
            assert not (draw.shown[0, k] & ~draw.masked[0, k]).any()  # only masked positions are shown


@pytest.mark.parametrize("j", [0, 1])
def test_loss_and_gradients_are_the_originals(j):
    model, teacher, batch = setup()
    cfg = cfg_of()
    batch = d_opsd.prepare(batch, cfg)
    P, G = batch.prompt_length, 24
    steps = torch.tensor([[3 * j, 3 * j + 1, 3 * j + 2]])
    masked, _ = noise.step_states(batch.step_map, steps)
    shown = torch.zeros_like(masked)
    for k, step in enumerate(steps[0].tolist()):
        shown[0, k, SHOWN[step]] = True
    prompt = torch.zeros(1, 3, P, dtype=torch.bool)
    draw = Draw(masked=torch.cat([prompt, masked], 2), steps=steps, shown=torch.cat([prompt, shown], 2))
    with torch.no_grad():
        ref = d_opsd.reference_logps(teacher, batch, draw, cfg)
    model.zero_grad()
    loss, _ = d_opsd.loss(d_opsd.token_logps(model, batch, draw, cfg), None, ref, batch, draw, cfg)
    loss.backward()
    assert loss.item() == pytest.approx(LOSSES[j], rel=1e-4)
    params = dict(model.named_parameters())
    for name, (norm, proj) in GRADS[j].items():
        g = params[name].grad
        assert g.norm().item() == pytest.approx(norm, rel=1e-4)
        assert (g * torch.linspace(-1, 1, g.numel()).view_as(g)).sum().item() == pytest.approx(proj, rel=1e-3, abs=1e-7)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_the_divergence_is_the_originals_generalized_jsd(beta):
    gen = torch.Generator().manual_seed(2)
    student, teacher = torch.randn(3, 2, 9, generator=gen) * 2, torch.randn(3, 2, 9, generator=gen) * 2
    tokens = teacher.topk(4, dim=-1).indices
    terms = d_opsd.divergence(student.gather(-1, tokens).log_softmax(-1), teacher.gather(-1, tokens).log_softmax(-1),
                              beta)
    loss, clip_ratio = JSD[beta]
    assert terms.clamp(max=0.05).sum().item() / 3 == pytest.approx(loss, rel=1e-5)
    assert (terms > 0.05).float().mean().item() == pytest.approx(clip_ratio)


def test_only_the_first_correct_completion_of_a_group_is_trained():
    model, teacher, batch = setup()
    out = batch.rollout
    four = replace(out, **{k: getattr(out, k).expand(4, *getattr(out, k).shape[1:]).clone()
                           for k in ("sequences", "attention_mask", "response_mask", "step_map", "commit_logps")})
    batch = replace(batch, rollout=four, rewards=torch.tensor([1.0, 1.0, 0.0, 0.1]), group_size=2)
    batch = d_opsd.prepare(batch, cfg_of())
    assert batch.extras["states"].any(dim=1).tolist() == [True, False, False, False]  # the first correct only
    assert batch.kept_groups[:, 0].tolist() == [True, False]
    with pytest.raises(ValueError):
        d_opsd.check_config(replace(cfg_of(), model=replace(cfg_of().model, family="sdar")))

