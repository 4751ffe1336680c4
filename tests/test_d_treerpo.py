"""d-TreeRPO: tree rollouts whose siblings share their parent's state exactly (the engine's branching),
the code's leave-one-out tree advantages, segment and self-distillation weights and loss by hand, and
the trainer scoring every transition in its parent's canvas."""

import dataclasses
import math

import pytest
import torch

from baselines.d_treerpo import algorithm as tree_rpo
from conftest import run_config
from dare.config import DecodingConfig
from dare.models import facts, token_logits
from dare.rollout import generate, left_pad
from dare.rollout.tree import branch, level_bounds
from dare.train import noise
from dare.train.estimators import Compute
from dare.train.rl import RLBatch, StepAt, Totals
from dare.utils import UserError
from test_trajectory_rl import PROMPTS, tiny_llada

DECODING = DecodingConfig(sampler="masked", gen_length=8, block_length=4, steps=8, temperature=1.0,
                          masked={"cache": "none"}, record=("states",))


def config(widths, steps=8, **algo):
    cfg = run_config("d_treerpo", **algo)
    decoding = dataclasses.replace(cfg.rl.decoding, tree=widths, steps=steps)
    return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, decoding=decoding, group_size=math.prod(widths)))


def tree_rollout(model, widths, seed=0):
    n = math.prod(widths)
    ids, mask = left_pad([p for p in PROMPTS for _ in range(n)], facts(model).pad_token_id)
    return generate(model, ids, mask, dataclasses.replace(DECODING, tree=widths), torch.Generator().manual_seed(seed))


def test_siblings_share_their_parent_state_exactly_and_differ_after():
    """Tree (2, 3) over 8 steps (levels end at steps 4 and 8): the 3 leaves under each level-0 node have the
    same tokens, step map and recorded states up to step 4; the two level-0 nodes of a prompt, and siblings
    after the branch, differ (they draw their own noise)."""
    model = tiny_llada()
    out = tree_rollout(model, (2, 3))
    assert out.steps_done == 8 and out.sequences.shape[0] == 3 * 6
    traj = out.trajectory.transpose(0, 1)  # (8, rows, G)
    for node in range(3 * 2):
        rows = list(range(node * 3, node * 3 + 3))
        early = out.step_map[rows] < 4
        assert torch.equal(early, early[:1].expand(3, -1)) and torch.equal(traj[:4, rows], traj[:4, rows[:1]].expand(-1, 3, -1))
        assert torch.equal(out.responses[rows][early], out.responses[rows[:1]].expand(3, -1)[early])
        assert not torch.equal(out.responses[rows[0]], out.responses[rows[1]])
    assert not torch.equal(traj[3, 0], traj[3, 3])  # the two level-0 children of prompt 0


def test_a_one_wide_tree_is_the_plain_rollout_and_branch_continues_exactly():
    """Stopping and continuing is exact: tree (1, 1, 1) draws the same noise in the same order as one
    uninterrupted rollout; `branch` from a partial rollout with k = 1 at temperature 0 reproduces it."""
    model = tiny_llada()
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    plain = generate(model, ids, mask, DECODING, torch.Generator().manual_seed(5))
    tree = generate(model, ids, mask, dataclasses.replace(DECODING, tree=(1, 1, 1)), torch.Generator().manual_seed(5))
    assert torch.equal(plain.sequences, tree.sequences) and torch.equal(plain.step_map, tree.step_map)
    greedy = dataclasses.replace(DECODING, temperature=0.0)
    full = generate(model, ids, mask, greedy)
    half = generate(model, ids, mask, dataclasses.replace(greedy, tree=(1,)), None)
    from dare.rollout import llada
    partial = llada.generate(model, ids, mask, greedy, None, until=3)
    assert partial.steps_done == 3 and (partial.responses == facts(model).mask_token_id).sum() == 3 * 5
    done = branch(model, partial, 2, greedy)
    assert torch.equal(done.sequences[::2], full.sequences) and torch.equal(done.sequences[1::2], full.sequences)
    assert torch.equal(done.step_map[::2], full.step_map) and torch.equal(half.sequences, full.sequences)


def test_tree_rollouts_refuse_what_they_cannot_continue():
    """Groups that are not one prompt, a cache, and steps that would commit nothing (the level bounds
    count steps) are refused."""
    model = tiny_llada()
    ids, mask = left_pad([PROMPTS[0], PROMPTS[1]], facts(model).pad_token_id)
    with pytest.raises(UserError, match="groups of 2 identical prompts"):
        generate(model, ids, mask, dataclasses.replace(DECODING, tree=(2,)))
    with pytest.raises(Exception, match="no KV cache"):
        dataclasses.replace(DECODING, tree=(2,), masked={"cache": "dual"}).validate()
    with pytest.raises(Exception, match="every step must commit a token"):
        dataclasses.replace(DECODING, tree=(2,), steps=16).validate()
    with pytest.raises(ValueError, match="product of the widths"):
        tree_rpo.check_config(dataclasses.replace(config((2, 2)), rl=dataclasses.replace(config((2, 2)).rl, group_size=8)))


def test_tree_advantages_by_hand():
    """Leaves (1, 0, 1, 1) under (2, 2): level 1 against the one sibling: 1, -1, 0, 0; level 0: the nodes'
    values 0.5 and 1, each against the other."""
    levels = tree_rpo.tree_advantages(torch.tensor([[1.0, 0.0, 1.0, 1.0]]), (2, 2))
    assert levels[1].tolist() == [[1.0, -1.0, 0.0, 0.0]]
    assert levels[0].tolist() == [[-0.5, -0.5, 0.5, 0.5]]
    # three siblings: 1, 0.8, 0 -> each minus the mean of the other two
    assert torch.allclose(tree_rpo.tree_advantages(torch.tensor([[1.0, 0.8, 0.0]]), (3,))[0],
                          torch.tensor([[0.6, 0.3, -0.9]]))


def prepared(batch, cfg):
    """The batch as the loop hands it to the hooks: the rollout's decoding, then `prepare`'s extras."""
    if isinstance(batch, RLBatch):  # the decoding is the rollout's
        return tree_rpo.prepare(dataclasses.replace(batch, rollout=dataclasses.replace(batch.rollout,
                                                                                       decoding=cfg.rl.decoding)), cfg)
    return tree_rpo.prepare(dataclasses.replace(batch, decoding=cfg.rl.decoding), cfg)


def weights(batch, cfg):
    """(levels, advantages, policy weights, self-distillation weights) of `prepare`."""
    extras = prepared(batch, cfg).extras
    return extras["levels"], extras["advantages"], extras["pg_weight"], extras["sd_weight"]


@dataclasses.dataclass
class HandBatch:
    """The fields of an RL batch D-TreeRPO reads (`prepare` returns a copy with its extras)."""
    rewards: torch.Tensor
    step_map: torch.Tensor
    responses: torch.Tensor
    num_sequences: int
    progress: float
    eos_token_id: int = 9
    prompt_length: int = 1
    decoding: object = None
    extras: dict = dataclasses.field(default_factory=dict)


def hand_batch(rewards, step_map, responses, progress=0.0):
    return HandBatch(torch.tensor(rewards), torch.tensor(step_map), torch.tensor(responses), len(rewards), progress)


def test_segment_weights_levels_and_advantages_by_hand():
    """One prompt, tree (2, 2) over 4 steps (level 0: steps 0-1, level 1: 2-3); EOS = 9. Leaves 0, 1 share
    level-0 node 0, leaves 2, 3 node 1. Segments: 2 at level 0 + 4 at level 1 = 6, each a mean over its
    tokens up to the child's first EOS: leaf 2's level-0 segment is its EOS alone (and its level-1 tokens,
    after that EOS, count nowhere); leaf 1's level-1 segment stops at its EOS at position 2."""
    batch = hand_batch([1.0, 0.0, 0.0, 0.0], [[0, 1, 2, 3], [0, 1, 3, 2], [1, 0, 2, 3], [1, 0, 3, 2]],
                       [[5, 6, 7, 9], [5, 6, 9, 8], [9, 4, 7, 7], [9, 4, 5, 6]])
    levels, adv, pg, sd = weights(batch, config((2, 2), steps=4))
    assert levels[:, 1:].tolist() == [[0, 0, 1, 1]] * 4 and (levels[:, 0] == -1).all()
    assert adv.tolist() == [[0.5, 0.5, 1.0, 1.0], [0.5, 0.5, -1.0, -1.0], [-0.5, -0.5, 0.0, 0.0], [-0.5, -0.5, 0.0, 0.0]]
    assert torch.allclose(pg, torch.tensor([[1 / 12] * 4, [0, 0, 1 / 6, 0], [1 / 6, 0, 0, 0], [0.0] * 4]))
    # self-distillation: the only positive children are leaf 0's level-0 node and leaf 0 itself; 4 (parent,
    # position) pairs, each target the single positive child's token
    assert torch.allclose(sd, torch.tensor([[0.25] * 4, [0.0] * 4, [0.0] * 4, [0.0] * 4]))


def test_self_distillation_mixes_positive_siblings_by_softmax():
    """Tree (3,), advantages 0.6, 0.3, -0.9; tau = 2 at the start: weights 1 and e^-0.15, renormalized over
    the positive children that decoded the position; pairs: positions 0, 1 (both) and 2 (child 0 only, child
    1 stopped at its EOS)."""
    batch = hand_batch([1.0, 0.8, 0.0], [[0, 1, 1], [0, 0, 1], [0, 1, 1]], [[5, 6, 7], [5, 9, 7], [4, 4, 4]])
    _, _, _, sd = weights(batch, config((3,), steps=2))
    w0, w1 = 1 / (1 + math.exp(-0.15)), math.exp(-0.15) / (1 + math.exp(-0.15))
    assert torch.allclose(sd, torch.tensor([[w0 / 3, w0 / 3, 1 / 3], [w1 / 3, w1 / 3, 0.0], [0.0] * 3]))
    late = hand_batch([1.0, 0.8, 0.0], [[0, 1, 1], [0, 0, 1], [0, 1, 1]], [[5, 6, 7], [5, 9, 7], [4, 4, 4]], 0.99)
    _, _, _, sharp = weights(late, config((3,), steps=2))
    assert sharp[0, 0] > 0.97 / 3 > sd[0, 0]  # tau -> 0 late in training: the best child takes the target


def test_loss_hand_computed():
    batch = hand_batch([1.0, 0.0, 0.0, 0.0], [[0, 1, 2, 3], [0, 1, 3, 2], [1, 0, 2, 3], [1, 0, 3, 2]],
                       [[5, 6, 7, 9], [5, 6, 9, 8], [9, 4, 7, 7], [9, 4, 5, 6]], progress=0.5)
    cfg = config((2, 2), steps=4, epsilon=0.4, beta=0.1, sd_lambda_max=1.0)
    batch, z = prepared(batch, cfg), None
    old = torch.tensor([[-1.0, -2.0, -0.5, -0.1], [-0.3, -1.0, -2.0, -1.0], [-0.2, -0.4, -0.6, -0.8], [-1.0] * 4])
    delta = torch.tensor([[0.5, -0.1, 0.0, 0.1], [0.1, 0.3, -0.6, 9.0], [0.2, 0.0, 0.0, 0.0], [0.0] * 4])
    logps, ref = old + delta, old - 0.3
    loss, metrics = tree_rpo.loss(logps, old, ref, batch, z, cfg)
    lam = (math.exp(2 * 0.5) - 1) / (math.exp(2) - 1)
    adv, pg, sd = (batch.extras[k] for k in ("advantages", "pg_weight", "sd_weight"))
    expected = 0.0
    for i in range(4):
        for k in range(4):
            if pg[i, k] > 0:
                rho = math.exp(delta[i, k])
                a = adv[i, k].item()
                surrogate = min(rho * a, min(max(rho, 0.6), 1.4) * a)
                d = float(ref[i, k] - logps[i, k])
                expected += pg[i, k].item() * (-surrogate + 0.1 * (math.exp(d) - d - 1))
            expected -= lam * sd[i, k].item() * logps[i, k].item()
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # outside [0.6, 1.4]: leaf 0's first token (e^0.5, weight 1/12) and leaf 1's third (e^-0.6, weight 1/6)
    assert metrics["stats/clip_ratio"] == pytest.approx(1 / 12 + 1 / 6)
    at_old, _ = tree_rpo.loss(old, old, None, batch, z, config((2, 2), steps=4, sd_lambda_max=0.0))
    assert at_old.item() == pytest.approx(-(pg * adv).sum().item())  # ratio 1: -sum of weighted advantages


def test_each_transition_is_scored_in_its_parents_canvas():
    """On a real tree rollout, level l's tokens are scored by one forward on the parent's canvas: the
    recorded state at the end of level l - 1 (all MASK for the root), which is also the leaf with every
    token of level >= l masked."""
    model = tiny_llada()
    widths = (2, 2)
    out = tree_rollout(model, widths, seed=2)
    B, f = out.sequences.shape[0], facts(model)
    batch = RLBatch(rollout=out, facts=f, rewards=torch.arange(B, dtype=torch.float32) % 2,
                    advantages=torch.zeros(B), group_size=4, compute=Compute(pack=False),
                    totals=Totals(num_tokens=float(out.response_mask.sum()), num_sequences=B))
    cfg = config(widths)
    batch, z = prepared(batch, cfg), None
    logps = tree_rpo.token_logps(model, batch, z, cfg)
    P, bounds, level = out.prompt_length, level_bounds(8, 2), batch.extras["levels"][:, out.prompt_length:]
    for lv in range(2):
        canvas = (out.trajectory[:, bounds[lv - 1] - 1] if lv else torch.full_like(out.responses, f.mask_token_id))
        assert torch.equal(canvas, torch.where(level >= lv, f.mask_token_id, out.responses))
        x = torch.cat([out.sequences[:, :P], canvas], dim=1)
        direct = torch.log_softmax(token_logits(model, x, out.attention_mask).float(), dim=-1)[:, P:]
        direct = direct.gather(-1, out.responses[..., None])[..., 0]
        assert torch.allclose(logps[level == lv], direct[level == lv], atol=1e-5)
    assert (level != noise.NEVER).all()
    # the loop draws the tree weights on the whole batch, then splits the rows into micro-batches
    from dare.train.batches import take

    batch = dataclasses.replace(batch, rewards=torch.tensor([1.0, 0.0, 1.0, 1.0] * 3), at=StepAt(progress=0.5))
    cfg = config(widths, sd_lambda_max=0.5)
    batch, z = prepared(batch, cfg), None
    old = logps.detach() - 0.1
    whole, _ = tree_rpo.loss(tree_rpo.token_logps(model, batch, z, cfg), old, None, batch, z, cfg)
    parts = sum(tree_rpo.loss(tree_rpo.token_logps(model, take(batch, rows, B), take(z, rows, B), cfg),
                              take(old, rows, B), None, take(batch, rows, B), take(z, rows, B), cfg)[0]
                for rows in (slice(0, 5), slice(5, B)))
    assert whole.item() == pytest.approx(parts.item(), abs=1e-6) and abs(whole.item()) > 1e-4
