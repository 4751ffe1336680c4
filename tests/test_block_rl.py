"""RL on block-diffusion models (SDAR, LLaDA2.x): the trainer scores exactly what the block sampler
decoded (same blocks, same left padding, same prompt tail), a batch scores each row as it scores
that row alone, TraceRL's trajectory slices replay the sampler's states, and TraceRL's loss
matches hand-computed values."""

import math
from types import SimpleNamespace

import pytest
import torch

from baselines.tracerl import algorithm as tracerl
from conftest import run_config
from dare.config import DecodingConfig, ScratchModelConfig
from dare.models import facts, new_model
from dare.models.tokenizer import char_tokenizer
from dare.rollout import generate, left_pad
from dare.train import noise
from dare.train.estimators import Compute, completion_logps, diffusion_logps
from dare.train.rl import RLBatch, Totals

# prompts of 3, 6 and 1 tokens: with block 4 their tails start 3, 2 and 1 positions into a block
PROMPTS = [[5, 9, 7], [5, 11, 6, 8, 9, 10], [6]]


def tiny(family: str):
    tok = char_tokenizer("0123456789+=", family)
    return new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0).eval()


def rollout(model, decoding, seed=0):
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    return generate(model, ids, mask, decoding, torch.Generator().manual_seed(seed))


def rl_batch(model, out, adv=None) -> RLBatch:
    B = out.sequences.shape[0]
    return RLBatch(rollout=out, facts=facts(model), rewards=torch.zeros(B),
                   advantages=torch.zeros(B) if adv is None else adv,
                   totals=Totals(num_tokens=float(out.response_mask.sum()), num_sequences=B), compute=Compute(pack=False))


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_a_batch_scores_each_row_as_that_row_alone(family):
    """Per-token log-probs through the block layout: rows of different prompt lengths in one
    left-padded batch get the values they get alone (blocks counted from each row's first token)."""
    model = tiny(family)
    decoding = DecodingConfig(gen_length=7, steps=4, temperature=1.0, whole_last_block=False)
    out = rollout(model, decoding)
    batch = rl_batch(model, out)
    masked = noise.completion(batch.attention_mask, batch.prompt_length)
    together = completion_logps(model, batch, masked)
    for r, prompt in enumerate(PROMPTS):
        seq = torch.cat([torch.tensor(prompt), out.responses[r]])[None]
        alone = diffusion_logps(model, torch.where(torch.arange(seq.shape[1]) >= len(prompt), facts(model).mask_token_id,
                                                   seq), seq, torch.arange(seq.shape[1])[None] >= len(prompt))
        assert torch.allclose(together[r], alone[0, len(prompt):], atol=1e-5), r


@pytest.mark.parametrize("family,threshold", [("sdar", 0.0), ("llada2", 0.0), ("sdar", 0.3)])
def test_tracerl_scores_the_probability_the_sampler_drew_each_token_with(family, threshold):
    """Rollout/trainer agreement: at temperature 1 (no top-k/p) TraceRL's per-token log-prob of a
    token at its own trace step equals the log-probability the block sampler drew it with, up to
    the sampler never drawing the mask token (renormalised without it: - log(1 - p(MASK)))."""
    model = tiny(family)
    decoding = DecodingConfig(gen_length=9, steps=4, temperature=1.0, block={"threshold": threshold},
                              whole_last_block=False)
    out = rollout(model, decoding, seed=3)
    batch = rl_batch(model, out)
    batch = tracerl.prepare(batch, run_config("tracerl"))
    rounds, targets = batch.extras["rounds"], batch.extras["targets"]
    assert torch.equal(targets, batch.response_mask)  # block models: the completion up to its first EOS
    with torch.no_grad():
        trainer = tracerl.token_logps(model, batch, None, run_config("tracerl"))
        P, mask_id = batch.prompt_length, facts(model).mask_token_id
        p_mask = torch.zeros_like(trainer)
        for r in range(int(rounds[:, P:].max()) + 1):
            x = torch.where(rounds >= r, mask_id, batch.sequences)
            logits = model(torch.cat([x, batch.sequences], 1), attention_mask=batch.attention_mask,
                           block_diffusion=True).logits  # the noisy half
            p_mask += torch.softmax(logits.float(), -1)[:, P:, mask_id] * (rounds[:, P:] == r)
    expected = trainer - torch.log1p(-p_mask)
    assert (out.step_map >= 0).all() and (trainer[~targets] == 0).all()
    assert torch.allclose(out.logps[targets], expected[targets], atol=2e-5), (out.logps - expected)[targets].abs().max()


def test_trace_rounds_replay_the_sampler_states_and_commit_every_token_once():
    """The input of each round, block by block, is the sampler's canvas just before that block's
    step (the recorded trajectory), and the scored tokens of all rounds are the response, each once."""
    model = tiny("sdar")
    bs = facts(model).block_size
    decoding = DecodingConfig(gen_length=9, steps=4, temperature=1.0, block={"threshold": 0.2},
                              whole_last_block=False, record=("states",))
    out = rollout(model, decoding, seed=5)
    batch = rl_batch(model, out)
    rounds = tracerl.prepare(batch, run_config("tracerl")).extras["rounds"][:, batch.prompt_length:]
    block = noise.blocks(batch.attention_mask, bs)[:, batch.prompt_length:]
    mask_id, states = facts(model).mask_token_id, out.trajectory  # (B, steps, G)
    scored = torch.zeros_like(rounds)
    for r in range(int(rounds.max()) + 1):
        x = torch.where(rounds >= r, mask_id, out.responses)
        scored += (rounds == r).long()
        for b in range(len(PROMPTS)):
            for k in torch.nonzero(rounds[b] == r).flatten().tolist():
                step = int(out.step_map[b, k])
                before = states[b, step - 1] if step > 0 else torch.full_like(out.responses[b], mask_id)
                same = block[b] == block[b, k]
                assert torch.equal(x[b][same], before[same]), (r, b, k)
    assert (scored == 1).all()


def test_tracerl_shrink_merges_neighbouring_steps_per_block():
    step_map = torch.tensor([[0, 1, 1, 2, 3, 5, 4, 3]])
    segment = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    assert noise.trace_rounds(step_map, segment, 1).tolist() == [[0, 1, 1, 2, 0, 2, 1, 0]]
    assert noise.trace_rounds(step_map, segment, 2).tolist() == [[0, 0, 0, 1, 0, 1, 0, 0]]
    assert noise.trace_rounds(step_map, torch.zeros_like(segment), 3).tolist() == [[0, 0, 0, 0, 1, 1, 1, 1]]
    never = noise.trace_rounds(torch.tensor([[0, -1]]), torch.zeros(1, 2, dtype=torch.long))
    assert never.tolist() == [[0, noise.NEVER]]


def test_tracerl_advantages_are_group_z_scores_with_the_accuracy_filter():
    """rl_reward.py: z-score with the population std (0 when the group is uniform); groups with
    accuracy above 0.8 or below 0.2 are dropped (here: zero advantage)."""
    rewards = torch.tensor([[1.0] * 2 + [0.0] * 8, [1.0] * 9 + [0.0], [1.0] * 10])
    adv = tracerl.advantages(rewards, run_config("tracerl"))
    z = (rewards[0] - 0.2) / math.sqrt(0.16)  # accuracy 0.2: kept
    assert torch.allclose(adv[0], z) and (adv[1] == 0).all() and (adv[2] == 0).all()
    unfiltered = tracerl.advantages(rewards, run_config("tracerl", filter_low=0.0, filter_high=1.0))
    assert torch.allclose(unfiltered[1], (rewards[1] - 0.9) / math.sqrt(0.09)) and (unfiltered[2] == 0).all()
    partial = torch.tensor([[0.75, 0.5, 1.0, 0.5], [1.0, 1.0, 0.75, 1.0], [0.25, 0.0, 0.0, 0.0]])  # cell accuracies
    kept = tracerl.kept(partial, run_config("tracerl")).flatten().tolist()
    assert kept == [True, False, False]  # mean rewards 0.6875, 0.9375, 0.0625 (all three have a reward > 0)


def test_tracerl_loss_hand_computed_and_ratio_one_at_the_old_policy():
    cfg = run_config("tracerl", epsilon=0.2, beta=0.5)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    batch = SimpleNamespace(advantages=adv, old_values=None, response_mask=mask, num_tokens=3.0, num_sequences=2,
                            responses=torch.zeros(2, 3), block_size=4, extras={"targets": mask})
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -1.0]])
    new = old + torch.tensor([[0.5, -0.1, 9.0], [0.1, 0.0, 0.0]])
    loss, metrics = tracerl.loss(new, old, None, batch, None, cfg)
    rho = torch.exp(torch.tensor([0.5, -0.1, 0.1]))
    a = torch.tensor([1.0, 1.0, -2.0])
    surrogate = torch.min(rho * a, rho.clamp(0.8, 1.2) * a)
    k3 = torch.exp(-torch.log(rho)) - 1 + torch.log(rho)
    expected = ((-surrogate + 0.5 * k3).sum() / (3 * 2)).item()
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["stats/clip_ratio"] == pytest.approx(1 / 3)
    at_old, _ = tracerl.loss(old, old, None, batch, None, cfg)
    assert at_old.item() == pytest.approx(-(1.0 * 2 - 2.0) / 6, abs=1e-7)  # ratio 1, KL 0: -sum(A) / (L1 B)


def test_whole_last_block_false_ends_the_canvas_at_gen_length():
    """The default decodes the last block whole (both originals); RL's canvas ends at gen_length.
    The tokens before the last block are the same either way at temperature 0 (later blocks never
    change earlier ones)."""
    model = tiny("sdar")
    whole = rollout(model, DecodingConfig(gen_length=6, steps=4, temperature=0.0))
    cut = rollout(model, DecodingConfig(gen_length=6, steps=4, temperature=0.0, whole_last_block=False))
    assert whole.responses.shape == cut.responses.shape == (3, 6)
    assert (cut.step_map >= 0).all()
    block = noise.blocks(cut.attention_mask, 4)[:, cut.prompt_length:]
    full = block < block.max(dim=1, keepdim=True).values  # blocks before each row's last
    assert torch.equal(whole.responses[full], cut.responses[full])
