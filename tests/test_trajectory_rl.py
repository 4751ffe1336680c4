"""Trajectory methods on masked models: CJ-GRPO's trainer replays the sampler's own states from the
step map (ASS + EOSER rollouts, left-padded batches); MDPO's trains each chosen step on the sampler's
state and full prediction (with and without RCR), with the reference code's step advantages; both
losses match hand-computed values."""

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from baselines.cj_grpo import algorithm as cj
from conftest import run_config
from dare.app import baselines
from dare.config import DecodingConfig, ScratchModelConfig
from dare.models import facts, new_model
from dare.models.tokenizer import char_tokenizer
from dare.rollout import generate, left_pad
from dare.train import noise
from dare.train.estimators import Compute
from dare.train.rl import RLBatch, Totals
from test_reference_samplers import never_mask

PROMPTS = [[5, 9, 7], [5, 11, 6, 8, 9, 10], [6]]


def tiny_llada():
    """A tiny random LLaDA that, like trained checkpoints, never predicts MASK (its logit is pushed
    to -1e4), so every step commits a real token."""
    tok = char_tokenizer("0123456789+=", "llada")
    return never_mask(new_model("llada", tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2,
                                                                 mlp_hidden_size=64), 0).eval())


def rollout_batch(model, decoding, seed=0):
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    out = generate(model, ids, mask, decoding, torch.Generator().manual_seed(seed))
    B = out.sequences.shape[0]
    batch = RLBatch(rollout=out, facts=facts(model), rewards=torch.zeros(B), advantages=torch.zeros(B),
                    totals=Totals(num_tokens=float(out.response_mask.sum()), num_sequences=B), compute=Compute(pack=False))
    return out, batch


@pytest.mark.parametrize("settings", [dict(gen_length=11, steps=3, masked=dict(schedule="ass", eos_gamma_min=0.01)),
                                      dict(gen_length=12, steps=3, masked=dict(schedule="ass", ass_blocks=3)),
                                      dict(gen_length=8, block_length=4, steps=8)])
def test_cj_grpo_scores_each_token_in_the_state_the_sampler_committed_it_from(settings):
    """For every step s, the trainer's input is the sampler's canvas before step s (the recorded
    trajectory), its scored tokens are the ones step s committed, and its log-prob is the model's
    log-softmax there: what the sampler drew from at temperature 1 (one forward per state, per row)."""
    model = tiny_llada()
    out, batch = rollout_batch(model, DecodingConfig(temperature=1.0, record=("states",), **settings), seed=4)
    batch = cj.prepare(batch, run_config("cj_grpo"))
    rounds = batch.extras["rounds"]
    P, mask_id, states = batch.prompt_length, facts(model).mask_token_id, out.trajectory.transpose(0, 1)  # (S, B, G)
    assert torch.equal(rounds[:, P:], out.step_map)  # every step commits: the round is the step
    with torch.no_grad():
        trainer = cj.token_logps(model, batch, None, run_config("cj_grpo"))
        for b, prompt in enumerate(PROMPTS):
            for s in range(states.shape[0]):
                before = states[s - 1, b] if s else torch.full_like(out.responses[b], mask_id)
                assert torch.equal(torch.where(rounds[b, P:] >= s, mask_id, out.responses[b]), before)
                committed = (before == mask_id) & (states[s, b] != mask_id)
                assert torch.equal(committed, rounds[b, P:] == s)
                x = torch.cat([torch.tensor(prompt), before])[None]
                logp = torch.log_softmax(model(x).logits.float(), -1)[0, len(prompt):]
                expected = logp.gather(-1, out.responses[b][:, None])[:, 0]
                assert torch.allclose(trainer[b][committed], expected[committed], atol=1e-5), (b, s)


def test_cj_grpo_advantages_are_group_means():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert torch.allclose(cj.advantages(rewards, run_config("cj_grpo")),
                          torch.tensor([[2 / 3, -1 / 3, -1 / 3], [0.0, 0.0, 0.0]]))


def hand_batch():
    """Two rows, prompt of 1, 4 completion positions. Row 0 committed by steps 0, 0, 1, 2 (transitions
    of 2, 1, 1 tokens: weights 1/6, 1/6, 1/3, 1/3); row 1 by steps 3, 1, 3 and never (ranked 1, 0, 1:
    weights 1/4, 1/2, 1/4, 0)."""
    step_map = torch.tensor([[0, 0, 1, 2], [3, 1, 3, -1]])
    return SimpleNamespace(prompt_length=1, step_map=step_map, block_size=None, sequences=torch.zeros(2, 5, dtype=torch.long),
                           attention_mask=torch.ones(2, 5, dtype=torch.long), advantages=torch.tensor([1.0, -0.5]),
                           num_sequences=2)


def test_cj_grpo_transition_weights_by_hand():
    batch = hand_batch()
    rounds = noise.rollout_rounds(batch)
    assert rounds[:, 1:].tolist() == [[0, 0, 1, 2], [1, 0, 1, noise.NEVER]]
    w = cj.transition_weights(batch, rounds)
    assert w.dtype == torch.float64
    assert torch.equal(w, torch.tensor([[1 / 6, 1 / 6, 1 / 3, 1 / 3], [1 / 4, 1 / 2, 1 / 4, 0.0]], dtype=torch.float64))


def block_231_batch(rows: int = 1):
    """DARE's `make_231_case` (yjyddq/DARE @83ae8a3, tests/test_cj_grpo_paper_exact.py) as an RL batch: a block
    model (block 4), a prompt of 4 (block 0), three completion blocks decoded in 2, 3 and 1 steps (local steps
    0 0 1 1 | 0 1 2 2 | 0 0 0 0; here as global steps, each block's after the previous block's)."""
    steps = torch.tensor([[0, 0, 1, 1, 2, 3, 4, 4, 5, 5, 5, 5]]).repeat(rows, 1)
    return SimpleNamespace(prompt_length=4, step_map=steps, block_size=4, sequences=torch.zeros(rows, 16, dtype=torch.long),
                           attention_mask=torch.ones(rows, 16, dtype=torch.long), num_sequences=rows)


def paper_exact(values: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """DARE's `paper_exact_cj_loss` re-stated: per row, the token mean of each (block, step) transition, their
    mean, then the mean over rows; `steps` (B, 12) the global step of each token (-1: not in the loss)."""
    rows = []
    for b in range(values.shape[0]):
        means = [values[b][steps[b] == s].mean() for s in steps[b].unique().tolist() if s >= 0]
        rows.append(torch.stack(means).mean())
    return torch.stack(rows).mean()


def test_cj_grpo_reduction_does_not_merge_distinct_block_transitions():
    """DARE's check, float64: one value per transition (block, local step); the loss is the mean of the six
    transitions, not of the three local steps (which pools the blocks that share a local step)."""
    batch = block_231_batch()
    rounds = noise.rollout_rounds(batch)
    assert rounds[0, 4:].tolist() == [0, 0, 1, 1, 0, 1, 2, 2, 0, 0, 0, 0]  # each block's own steps
    value = {0: 1.0, 1: 2.0, 2: 10.0, 3: 20.0, 4: 30.0, 5: 100.0}  # global step -> its transition's value
    values = torch.tensor([[value[s] for s in batch.step_map[0].tolist()]], dtype=torch.float64)
    got = (values * cj.transition_weights(batch, rounds)).sum()
    expected = torch.tensor(sum(value.values()) / 6, dtype=torch.float64)
    merged = torch.stack([values[0][rounds[0, 4:] == s].mean() for s in range(3)]).mean()
    torch.testing.assert_close(got, expected, rtol=0.0, atol=1e-12)
    assert not torch.isclose(got, merged)


def test_cj_grpo_loss_is_exact_and_micro_batch_partition_invariant_in_float64():
    """DARE's check, through our loss in float64: four rows of the 2-3-1 case, two of them ending early (the
    positions after EOS committed by no step, as DARE's test removes them), PPO token losses from injected
    log-probs; the loss of the whole batch equals the paper's reduction, and the sum of the losses of micro-batches
    (1, 2, 1) equals it, both to 1e-12 (losses are normalized by the step's totals, never the micro-batch's)."""
    batch = block_231_batch(4)
    batch.step_map[1, 9:] = -1
    batch.step_map[3, 6:] = -1
    batch.advantages = torch.tensor([0.9, -0.4, 0.3, -0.8], dtype=torch.float64)
    rounds = noise.rollout_rounds(batch)
    batch.extras = {"rounds": rounds}
    cfg = run_config("cj_grpo", epsilon=0.2, beta=0.0)
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 12, generator=g, dtype=torch.float64) * 3
    logps = old + torch.linspace(-0.35, 0.35, 12, dtype=torch.float64)
    full, _ = cj.loss(logps, old, None, batch, None, cfg)
    ratio = torch.exp(logps - old)
    per_token = -torch.min(ratio * batch.advantages[:, None], ratio.clamp(0.8, 1.2) * batch.advantages[:, None])
    assert full.dtype == torch.float64
    torch.testing.assert_close(full, paper_exact(per_token, batch.step_map), rtol=0.0, atol=1e-12)
    split = torch.zeros((), dtype=torch.float64)
    for lo, hi in ((0, 1), (1, 3), (3, 4)):
        part = SimpleNamespace(**{**vars(batch), "step_map": batch.step_map[lo:hi], "sequences": batch.sequences[lo:hi],
                                  "attention_mask": batch.attention_mask[lo:hi], "advantages": batch.advantages[lo:hi],
                                  "extras": {"rounds": rounds[lo:hi]}})
        split = split + cj.loss(logps[lo:hi], old[lo:hi], None, part, None, cfg)[0]
    torch.testing.assert_close(split, full, rtol=0.0, atol=1e-12)


def test_cj_grpo_loss_hand_computed_and_ratio_one_at_the_old_policy():
    batch = hand_batch()
    batch.extras = {"rounds": noise.rollout_rounds(batch)}
    cfg = run_config("cj_grpo", epsilon=0.2, beta=0.5)
    old = torch.tensor([[-1.0, -2.0, -0.5, -0.1], [-0.3, -1.0, -2.0, -1.0]])
    delta = torch.tensor([[0.5, -0.1, 0.0, 0.1], [0.1, 0.3, -0.4, 7.0]])  # the last token is never committed
    ref = old - 0.2
    loss, metrics = cj.loss(old + delta, old, ref, batch, None, cfg)
    w = [[1 / 6, 1 / 6, 1 / 3, 1 / 3], [1 / 4, 1 / 2, 1 / 4, 0.0]]
    adv = [1.0, -0.5]
    expected = 0.0
    for i in range(2):
        for k in range(4):
            rho = math.exp(delta[i, k])
            surrogate = min(rho * adv[i], min(max(rho, 0.8), 1.2) * adv[i])
            d = float(ref[i, k] - (old[i, k] + delta[i, k]))
            expected += w[i][k] * (-surrogate + 0.5 * (math.exp(d) - d - 1)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    at_old, _ = cj.loss(old, old, None, batch, None, run_config("cj_grpo", beta=0.0))
    assert at_old.item() == pytest.approx(-(1.0 - 0.5) / 2, abs=1e-7)  # ratio 1: -mean_i A_i (weights sum to 1)


@pytest.mark.parametrize("name", ["cj_grpo", "tracerl"])
@pytest.mark.parametrize("option", ["editing_threshold", "dynamic"])
def test_trajectory_replays_refuse_token_editing_and_dynamic_blocks(name, option):
    """Both replay the step map, which needs each token committed once (`estimators.check_replayable`)."""
    cfg = run_config(name)
    setattr(cfg.rl.decoding.block, option, 0.5 if option == "editing_threshold" else True)
    with pytest.raises(ValueError, match=f"rl.decoding.block.{option}"):
        baselines.load(name).algorithm.check_config(cfg)
    baselines.load(name).algorithm.check_config(run_config(name))


# ------------------------------------------------------------------------------------------------
# MDPO: step advantages from intermediate rewards, the trained steps' states and predictions


def test_mdpo_step_advantages_equal_the_reference_code():
    """adv-v4 and the per-step group normalization: the expected values were printed by the lines of
    autonomousvision/mdpo@e6ae439 `mdpo_trainer.py` (_generate_and_score_completions) run on these
    rewards in a scratch folder (2 groups of 4, 5 steps), with its top-2 steps by |A|."""
    from baselines.mdpo import algorithm as mdpo

    rewards = torch.tensor([[0., 0., 1., 1., 0.], [0., 1., 1., 1., 1.], [1., 0., 0., 1., 1.], [0., 0., 0., 0., 1.],
                            [1., 1., 1., 1., 1.], [0., 0., 0., 0., 0.], [0., 1., 0., 1., 0.], [0., 0., 1., 0., 1.]])
    expected = [[-0.56363, 0.0, 1.22444, -1.22459, -1.39065], [0.33818, 1.35859, 0.0, 0.0, 0.19866],
                [1.23999, -1.01895, 0.0, 1.22459, 0.19866], [-1.01454, -0.33965, -1.22444, 0.0, 0.99332],
                [1.44321, 0.43908, 0.54766, 0.86588, 0.38727], [-0.86593, -1.31723, -0.54766, -0.86588, -0.38727],
                [-0.28864, 1.02452, -1.09533, 0.86588, -1.16181], [-0.28864, -0.14636, 1.09533, -0.86588, 1.16181]]
    adv = mdpo.step_advantages(rewards, 4)
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-5)
    noise = mdpo.trained_steps(rewards, 4, run_config("mdpo", train_steps=2))
    assert noise["steps"].tolist() == [[4, 3], [1, 0], [0, 3], [2, 0], [0, 3], [1, 0], [4, 2], [4, 2]]
    assert torch.allclose(noise["advantages"], adv.gather(1, noise["steps"]))


def mdpo_batch(rcr: bool):
    model = tiny_llada()
    decoding = DecodingConfig(sampler="maskgit", gen_length=8, block_length=4, steps=4, temperature=1.0,
                              maskgit={"rcr": rcr}, record=("states", "predictions"))
    out, batch = rollout_batch(model, decoding, seed=2)
    return model, out, batch


@pytest.mark.parametrize("rcr", [False, True])
def test_mdpo_trains_each_step_on_the_sampler_state_and_its_prediction(rcr):
    """The input of trained step s is the canvas the sampler decoded step s from (all MASK before step
    0; with RCR, re-masked tokens are masked again), the targets its full prediction at that step, and
    the log-prob is the model's log-softmax of logits / (T + eps) there (T: the config's rollout temperature)."""
    from baselines.mdpo import algorithm as mdpo

    model, out, batch = mdpo_batch(rcr)
    steps = torch.tensor([[3, 0], [1, 2], [2, 1]])
    inputs, targets, masked = mdpo.step_inputs(batch, steps)
    mask_id = facts(model).mask_token_id
    for b in range(3):
        for k, s in enumerate(steps[b].tolist()):
            before = out.trajectory[b, s - 1] if s else torch.full_like(out.responses[b], mask_id)
            assert torch.equal(inputs[b, k], before) and torch.equal(targets[b, k], out.predictions[b, s])
            assert torch.equal(masked[b, k], before == mask_id)
    with torch.no_grad():
        cfg = run_config("mdpo")  # the paper's rollout temperature, 0.4: the log-probs divide by 0.4 + eps
        batch = dataclasses.replace(batch, rollout=dataclasses.replace(batch.rollout, decoding=cfg.rl.decoding),
                                    extras={"steps": steps})
        logps = mdpo.token_logps(model, batch, None, cfg)
        for b, prompt in enumerate(PROMPTS):
            for k in range(2):
                x = torch.cat([torch.tensor(prompt), inputs[b, k]])[None]
                logp = torch.log_softmax(model(x).logits.float() / (0.4 + torch.finfo(torch.float32).eps), -1)
                expected = logp[0, len(prompt):].gather(-1, targets[b, k][:, None])[:, 0]
                assert torch.allclose(logps[b, k][masked[b, k]], expected[masked[b, k]], atol=1e-5)
                assert (logps[b, k][~masked[b, k]] == 0).all()


def test_mdpo_loss_hand_computed():
    """One completion per group of 2 rows, K = 1 trained step: lambda = G / (|M| + 1e-4), the surrogate
    weighted by lambda and the rollout confidence, the k2 KL by the confidence only, each pair's sum
    divided by |M| + 1e-4, the mean over pairs."""
    from baselines.mdpo import algorithm as mdpo

    mask = 30
    trajectory = torch.tensor([[[1, mask, mask], [1, 2, mask]], [[mask, 3, mask], [4, 3, mask]]])  # (B, S, G)
    batch = SimpleNamespace(trajectory=trajectory, predictions=trajectory.clone(), mask_token_id=mask,
                            confidences=torch.tensor([[[0.5, 0.5, 0.5], [0.2, 0.4, 0.8]], [[0.9, 0.1, 0.3], [1., 1., 1.]]]),
                            responses=torch.zeros(2, 3), num_sequences=2)
    batch.extras = {"steps": torch.tensor([[1], [0]]), "advantages": torch.tensor([[0.7], [-1.2]])}
    # row 0 trains step 1: its input is the state after step 0, [1, M, M]: masked {1, 2}; row 1 step 0: all masked
    old = torch.tensor([[[-1.0, -2.0, -0.5]], [[-0.3, -1.0, -2.0]]])
    delta = torch.tensor([[[9.0, 0.1, -0.3]], [[0.2, -0.1, 0.05]]])
    ref = old + 0.3
    cfg = run_config("mdpo", epsilon=0.2, beta=0.5)
    loss, _ = mdpo.loss(old + delta, old, ref, batch, None, cfg)
    rows = [(0, [1, 2], 0.7, [0.2, 0.4, 0.8]), (1, [0, 1, 2], -1.2, [0.9, 0.1, 0.3])]
    expected = 0.0
    for b, positions, a, conf in rows:
        lam = 3 / (len(positions) + 1e-4)
        total = 0.0
        for k in positions:
            rho = math.exp(delta[b, 0, k])
            surrogate = min(rho * a, min(max(rho, 0.8), 1.2) * a)
            logp = float(old[b, 0, k] + delta[b, 0, k])
            total += (-surrogate * lam + 0.5 * (float(ref[b, 0, k]) - logp) ** 2 / 2) * conf[k]
        expected += total / (len(positions) + 1e-4) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)
