"""Trajectory methods on masked models (CJ-GRPO): the trainer replays the sampler's own states
from the step map (ASS + EOSER rollouts, left-padded batches), and the loss matches hand-computed
values."""

import math
from types import SimpleNamespace

import pytest
import torch

from baselines.cj_grpo import algorithm as cj
from conftest import run_config
from dare.config import DecodingConfig, ScratchModelConfig
from dare.models import facts, new_model
from dare.models.tokenizer import char_tokenizer
from dare.rollout import generate, left_pad
from dare.train import noise
from dare.train.estimators import Compute
from dare.train.rl import RLBatch

PROMPTS = [[5, 9, 7], [5, 11, 6, 8, 9, 10], [6]]


def tiny_llada():
    """A tiny random LLaDA that, like trained checkpoints, never predicts MASK (its logit is pushed
    to -1e4), so every step commits a real token."""
    tok = char_tokenizer("0123456789+=", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0).eval()
    mask_id = facts(model).mask_token_id

    def never_mask(head, inputs, logits):
        logits[..., mask_id] = -1e4
        return logits

    model.get_output_embeddings().register_forward_hook(never_mask)
    return model


def rollout_batch(model, decoding, seed=0):
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    out = generate(model, ids, mask, decoding, torch.Generator().manual_seed(seed))
    B = out.sequences.shape[0]
    batch = RLBatch(out.sequences, out.attention_mask, out.prompt_length, out.response_mask, out.step_map,
                    torch.zeros(B), torch.zeros(B), 1, out.trajectory, None, None, float(out.response_mask.sum()),
                    B, Compute(pack=False))
    return out, batch


@pytest.mark.parametrize("settings", [dict(gen_length=11, steps=3, schedule="ass", eos_gamma_min=0.01),
                                      dict(gen_length=12, steps=3, schedule="ass", ass_blocks=3),
                                      dict(gen_length=8, block_length=4, steps=8)])
def test_cj_grpo_scores_each_token_in_the_state_the_sampler_committed_it_from(settings):
    """For every step s, the trainer's input is the sampler's canvas before step s (the recorded
    trajectory), its scored tokens are the ones step s committed, and its log-prob is the model's
    log-softmax there: what the sampler drew from at temperature 1 (one forward per state, per row)."""
    model = tiny_llada()
    out, batch = rollout_batch(model, DecodingConfig(temperature=1.0, record_trajectory=True, **settings), seed=4)
    rounds = cj.sample_noise(batch, None, run_config("cj_grpo"))
    P, mask_id, states = batch.prompt_length, facts(model).mask_token_id, out.trajectory
    assert torch.equal(rounds[:, P:], out.step_map)  # every step commits: the round is the step
    with torch.no_grad():
        trainer = cj.token_logps(model, batch, rounds, run_config("cj_grpo"))
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
    assert torch.allclose(w, torch.tensor([[1 / 6, 1 / 6, 1 / 3, 1 / 3], [1 / 4, 1 / 2, 1 / 4, 0.0]]))


def test_cj_grpo_loss_hand_computed_and_ratio_one_at_the_old_policy():
    batch = hand_batch()
    rounds = noise.rollout_rounds(batch)
    cfg = run_config("cj_grpo", epsilon=0.2, beta=0.5)
    old = torch.tensor([[-1.0, -2.0, -0.5, -0.1], [-0.3, -1.0, -2.0, -1.0]])
    delta = torch.tensor([[0.5, -0.1, 0.0, 0.1], [0.1, 0.3, -0.4, 7.0]])  # the last token is never committed
    ref = old - 0.2
    loss, metrics = cj.loss(old + delta, old, ref, batch, rounds, cfg)
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
    at_old, _ = cj.loss(old, old, None, batch, rounds, run_config("cj_grpo", beta=0.0))
    assert at_old.item() == pytest.approx(-(1.0 - 0.5) / 2, abs=1e-7)  # ratio 1: -mean_i A_i (weights sum to 1)


def test_cj_grpo_refuses_token_editing():
    cfg = run_config("cj_grpo")
    cfg.rl.decoding.editing_threshold = 0.5
    with pytest.raises(ValueError, match="editing_threshold"):
        cj.check_config(cfg)
