"""AGRPO: the trainer scores each drawn step's tokens with exactly the distribution the truncated sampler
drew them from (temperature, top-k/top-p support, the state before the step), the step draws are
stratified and their importance weights keep the estimate unbiased, and the loss matches a
hand computation."""

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from baselines.agrpo import algorithm as agrpo
from conftest import run_config
from dare.config import ConfigError, DecodingConfig, TrainConfig
from dare.models import facts
from dare.rollout import generate, left_pad
from dare.train.optim import lr_factor
from dare.train.estimators import Compute, masked_logps
from dare.train.noise import Draw
from dare.train.rl import RLBatch, Totals
from test_trajectory_rl import PROMPTS, tiny_llada

DECODING = DecodingConfig(sampler="truncated", gen_length=8, block_length=4, steps=4, temperature=0.7,
                          truncated={"top_k": 5, "top_p": 0.9, "remasking": "random"}, record=("states", "supports"))


def agrpo_config(decoding=DECODING, **algo):
    cfg = run_config("agrpo", **algo)
    return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, decoding=decoding))


def rollout_batch(model, decoding=DECODING, seed=3):
    f = facts(model)
    ids, mask = left_pad(PROMPTS, f.pad_token_id)
    out = generate(model, ids, mask, decoding, torch.Generator().manual_seed(seed))
    B = out.sequences.shape[0]
    batch = RLBatch(rollout=out, facts=f, rewards=torch.zeros(B), advantages=torch.tensor([1.0, -1.0, 0.5]),
                    totals=Totals(num_tokens=float(out.response_mask.sum()), num_sequences=B),
                    compute=Compute(pack=False))
    return out, batch


def every_step(batch, steps):
    B = batch.sequences.shape[0]
    return Draw(steps=torch.arange(steps).expand(B, -1), weight=torch.ones(B, steps))


def test_the_trainer_scores_the_distribution_the_sampler_drew_from():
    """Each step's tokens, replayed in the sampler's state before the step (left-padded rows of different
    prompt lengths), get the log-prob they were drawn with: the logits / T renormalized over the recorded
    top-k/top-p support. Without the support (the untruncated softmax) they do not."""
    model = tiny_llada()
    out, batch = rollout_batch(model)
    assert out.supports is not None and not out.supports.all()  # top-k 5 of the vocabulary truncates
    cfg = agrpo_config()
    logps = agrpo.token_logps(model, batch, every_step(batch, 4), cfg)  # (B, 4, G)
    at = batch.step_map[:, None, :] == torch.arange(4)[None, :, None]
    assert (at.sum(dim=1) == 1).all()  # each token scored once, by the step that committed it
    scored = (logps * at).sum(dim=1)
    assert torch.allclose(scored, out.logps, atol=1e-5)
    untruncated = agrpo.token_logps(model, dataclasses.replace(batch, rollout=dataclasses.replace(out, supports=None)), every_step(batch, 4), cfg)
    assert ((untruncated * at).sum(dim=1) - out.logps).abs().max() > 1e-2
    # at the sampler's policy every ratio is 1: the policy loss is -sum_i A_i * (tokens per step) / N
    loss, metrics = agrpo.loss(logps, None, None, batch, every_step(batch, 4), cfg)
    assert loss.item() == pytest.approx(-(1.0 - 1.0 + 0.5) * 4 * 2 / (4 * 3), abs=1e-5)
    assert metrics["stats/clip_low"] == metrics["stats/clip_high"] == 0.0


def test_the_loss_adds_up_over_micro_batches():
    """The loop splits a step's rows into micro-batches (`take`) after drawing the noise on the whole batch:
    the micro-batch losses and gradients add up to the whole batch's."""
    from dare.train.batches import take

    model = tiny_llada()
    out, batch = rollout_batch(model)
    cfg = agrpo_config(mc_samples=3)
    draws = agrpo.sample_noise(batch, torch.Generator().manual_seed(1), cfg)

    def loss_and_grad(rows):
        model.zero_grad()
        mb, z = take(batch, rows, 3), take(draws, rows, 3)
        loss, _ = agrpo.loss(agrpo.token_logps(model, mb, z, cfg), None, None, mb, z, cfg)
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole, g = loss_and_grad(slice(0, 3))
    a, ga = loss_and_grad(slice(0, 1))
    b, gb = loss_and_grad(slice(1, 3))
    assert whole == pytest.approx(a + b, abs=1e-6) and abs(whole) > 1e-4
    assert all(torch.allclose(x, y + z, atol=1e-6) for x, y, z in zip(g, ga, gb))


def test_top_p_drops_the_crossing_token_as_the_reference_does():
    """AGRPO's top-p removes the token whose cumulative probability crosses top_p (Hugging Face keeps it):
    probabilities 0.8, 0.195, 0.005 at top-p 0.99 keep the first token only."""
    from dare.rollout.truncated import truncate

    logits = torch.tensor([[0.8, 0.195, 0.005]]).log()
    kept, support = truncate(logits, dataclasses.replace(DECODING, temperature=1.0, truncated={"top_p": 0.99}))
    assert support.tolist() == [[True, False, False]] and torch.isinf(kept[0, 1:]).all()
    _, wider = truncate(logits, dataclasses.replace(DECODING, temperature=1.0, truncated={"top_p": 0.999}))
    assert wider.tolist() == [[True, True, False]]


def test_the_replayed_states_are_the_step_map_rebuild():
    """The recorded state before step s equals the final completion with every token of step >= s masked
    (how the reference rebuilds it from `unmask_steps`)."""
    model = tiny_llada()
    out, batch = rollout_batch(model)
    mask_id = facts(model).mask_token_id
    for s in range(4):
        before = out.trajectory[:, s - 1] if s else torch.full_like(batch.responses, mask_id)
        assert torch.equal(before, torch.where(batch.step_map >= s, mask_id, batch.responses))


def hand_batch():
    """Two completions of 4 tokens, 2 steps of 2 tokens; EOS = 9. Row 0: steps 0, 1, 0, 1, EOS at the end
    committed by step 1 after a real token of step 1, so last = 1; row 1: its only non-EOS tokens are
    step 0's, so last = 0 although step 1 committed two EOS."""
    responses = torch.tensor([[3, 4, 5, 9], [6, 9, 7, 9]])
    step_map = torch.tensor([[0, 1, 0, 1], [0, 1, 0, 1]])
    return SimpleNamespace(sequences=torch.cat([torch.ones(2, 1, dtype=torch.long), responses], dim=1),
                           responses=responses, prompt_length=1, step_map=step_map, eos_token_id=9,
                           rollout=SimpleNamespace(entropies=torch.tensor([[0.5, 0.25, 1.5, 0.25], [1.0, 0.0, 1.0, 0.0]]),
                                                   logps=torch.tensor([[-1.0, -2.0, -0.5, -0.1], [-0.3, -1.0, -2.0, -1.0]])),
                           advantages=torch.tensor([1.0, -0.5]), num_sequences=2)


def test_last_step_and_entropy_step_probabilities_by_hand():
    batch = hand_batch()
    assert agrpo.last_steps(batch).tolist() == [1, 0]
    probs = agrpo.step_probs(batch, 2)
    # row 0: step 0 carries 0.5 + 1.5, step 1 0.25 + 0.25 (+1e-8 each); row 1: only step 0 is allowed
    assert torch.allclose(probs, torch.tensor([[2.0 / 2.5, 0.5 / 2.5], [1.0, 0.0]]), atol=1e-7)


def test_step_draws_are_stratified_and_importance_weights_unbiased():
    """Uniform draws: M = 100 low-discrepancy uniforms hit each of the 4 steps of a completion exactly 25
    times. Entropy draws: the weighted mean of any per-step function over the draws estimates its mean over
    the steps <= last (each p(s) w(s) = 1 / (last + 1))."""
    B, G, S, M = 1, 8, 4, 100
    step_map = torch.arange(G).div(2, rounding_mode="floor")[None]  # steps 0 0 1 1 2 2 3 3
    batch = SimpleNamespace(step_map=step_map, responses=torch.ones(B, G, dtype=torch.long), eos_token_id=9,
                            rollout=SimpleNamespace(entropies=torch.tensor([[0.1, 0.1, 2.0, 1.0, 0.5, 0.0, 0.2, 0.2]])))
    batch.decoding = decoding = dataclasses.replace(DECODING, gen_length=G, steps=S)
    draw = agrpo.sample_noise(batch, torch.Generator().manual_seed(0),
                              agrpo_config(decoding, mc_samples=M, importance_sampling="uniform"))
    steps, weights = draw.steps, draw.weight
    assert torch.bincount(steps[0], minlength=S).tolist() == [25, 25, 25, 25] and (weights == 1).all()
    draw = agrpo.sample_noise(batch, torch.Generator().manual_seed(0),
                              agrpo_config(decoding, mc_samples=M, importance_sampling="entropy"))
    steps, weights = draw.steps, draw.weight
    probs = agrpo.step_probs(batch, S)
    counts = torch.bincount(steps[0], minlength=S).float()
    assert (counts - M * probs[0]).abs().max() <= 1  # stratified: each step drawn in proportion to p(s)
    f = torch.tensor([3.0, -1.0, 0.5, 2.0])
    assert (weights[0] * f[steps[0]]).mean().item() == pytest.approx(f.mean().item(), abs=0.03)


def test_loss_hand_computed():
    batch = hand_batch()
    steps, weights = torch.tensor([[0, 1], [0, 0]]), torch.tensor([[0.5, 2.0], [1.0, 1.0]])
    delta = torch.tensor([[0.5, -0.1, 0.0, 0.3], [0.1, 9.0, -0.4, 9.0]])  # row 1's EOS tokens are never drawn
    logps = (batch.rollout.logps + delta)[:, None, :].expand(-1, 2, -1)
    ref = logps - 0.2
    batch.decoding = decoding = dataclasses.replace(DECODING, gen_length=4, steps=2)
    cfg = agrpo_config(decoding, mc_samples=2, epsilon=0.2, beta=0.5)
    loss, metrics = agrpo.loss(logps, None, ref, batch, Draw(steps=steps, weight=weights), cfg)
    expected, adv = 0.0, [1.0, -0.5]
    for i in range(2):
        for m in range(2):
            for k in range(4):
                if batch.step_map[i, k] != steps[i, m]:
                    continue
                rho = math.exp(delta[i, k])
                surrogate = min(rho * adv[i], min(max(rho, 0.8), 1.2) * adv[i])
                kl = rho * (math.exp(-0.2) + 0.2 - 1)
                expected += weights[i, m].item() * (-surrogate + 0.5 * kl) / (2 * 2)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # of the 2 x 2 x 2 scored tokens, high-clipped (rho > 1.2, A > 0): row 0's tokens 0 (e^0.5) and 3 (e^0.3);
    # low-clipped (rho < 0.8, A < 0): row 1's token 2 (e^-0.4), drawn twice
    assert metrics["stats/clip_high"] == pytest.approx(2 / 8) and metrics["stats/clip_low"] == pytest.approx(2 / 8)


def test_masked_logps_with_a_support_renormalizes_over_it_on_every_path():
    model = tiny_llada()
    torch.manual_seed(0)
    x = torch.randint(0, 10, (2, 7))
    where = torch.zeros(2, 7, dtype=torch.bool)
    where[0, 5:], where[1, 3:] = True, True
    attention = torch.ones(2, 7, dtype=torch.long)
    attention[0, :2] = 0
    V = model.get_output_embeddings().weight.shape[0]
    support = torch.rand(int(where.sum()), V) < 0.5
    support[torch.arange(len(support)), x[where]] = True  # the targets are in their supports
    from dare.models import token_logits
    logits = token_logits(model, x, attention).float() / 0.7
    expected = torch.log_softmax(logits[where].masked_fill(~support, -torch.inf), dim=-1).gather(1, x[where][:, None])[:, 0]
    for kw in (dict(chunk=0), dict(chunk=2), dict(chunk=2, pack=True, min_padding=0.0)):
        got = masked_logps(model, x, x, where, attention, temperature=0.7, support=support, **kw)
        assert torch.allclose(got[where], expected, atol=1e-5), kw
        assert (got[~where] == 0).all()


def test_config_rules():
    with pytest.raises(ValueError, match="sampler=truncated"):
        agrpo.check_config(agrpo_config(dataclasses.replace(DECODING, sampler="masked")))
    with pytest.raises(ValueError, match="T > 0"):
        agrpo.check_config(agrpo_config(dataclasses.replace(DECODING, temperature=0.0)))
    agrpo.check_config(agrpo_config())


def test_warmup_ratio_gives_as_many_warmup_steps_as_transformers():
    """ceil(ratio x total) warmup steps, as transformers counts them (the ramp itself is dare's: it starts
    at 1 / warmup, `lr_factor`)."""
    train = TrainConfig(steps=250, warmup_ratio=0.01, schedule="cosine")
    assert [lr_factor(s, 250, train) for s in range(4)] == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0], abs=1e-3)
    with pytest.raises(ConfigError, match="not both"):
        from dare.config import load
        load(TrainConfig, overrides=["warmup_steps=2", "warmup_ratio=0.1"])


def test_the_truncated_sampler_refuses_a_block_model_by_name():
    sampler = "truncated"
    from dare.utils import UserError
    from test_block_rl import tiny

    model = tiny("sdar")
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    with pytest.raises(UserError, match=f"sampler={sampler}: .*block-causal: use sampler=block"):
        generate(model, ids, mask, dataclasses.replace(DECODING, sampler=sampler))
