"""RLDF: the step sampler draws the reference's steps from the same seed, the loss and its gradient match Drift's
code on injected inputs (pinned below), the low-probability filter, the kept groups, the loss adds up over
micro-batches."""

import math
from dataclasses import replace

import pytest
import torch

from baselines.rldf import algorithm as rldf
from conftest import run_config
from dare.train import noise
from dare.rollout import RolloutOutput
from dare.train.batches import take
from dare.train.rl import RLBatch, Totals

# Drift (ant-research/Drift@7abd99b79f20175aff3f5082501eb5b43333bad9), run unchanged outside this repository:
# trainer/masking_strategy.py build_masking_schedule("sequential_masking", k=4, seed=123, token_probs=exp(commit
# log-probs)) on rollout/llada_rollout.py's remap_step_map_continuous of the step map below; trainer/main_rl.py
# DriftTrainer.compute_loss (num_generations 4, loss_norm "sample", kl_type k3) with the old log-probs of its
# compute_per_token_logps (mu > 1); the model is the toy of `Toy` (its logits are tables, input-dependent), the
# DeepSpeed engine's backward is loss.backward() (the objective pinned is the sum of its backward calls), the
# reward function returns the injected rewards; trainer/rollout_utils.py filter_rollout_samples for the kept groups.
# STEPS: the reference's selected steps per row (its remapped step ids), PROBS: its softmax over rows 0 and 1's steps.
STEPS = [[0, 1, 2, 1], [0, 3, 2, 4], [0, 1, 2, 0], [0, 1, 0, 0], [0, 1, 2, 0], [0, 1, 0, 0], [0, 1, 2, 0], [0, 1, 2, 1]]
PROBS = [[0.2883661389350891, 0.5543262958526611, 0.15730756521224976],
         [0.2582564651966095, 0.060111742466688156, 0.24236497282981873, 0.32278668880462646, 0.07274916768074036,
          0.043730974197387695]]
UNIFORM_STEPS = [[0, 1, 2, 1], [0, 1, 2, 5], [0, 1, 2, 2], [0, 1, 0, 1], [0, 1, 2, 1], [0, 1, 0, 1], [0, 1, 2, 1],
                 [0, 1, 2, 1]]
ARGMAX_STEPS = [[0, 1, 2, 1], [3, 0, 2, 4], [0, 1, 2, 0], [0, 1, 1, 1], [0, 1, 2, 0], [0, 1, 0, 0], [0, 1, 2, 0],
                [0, 1, 2, 0]]
# (objective, sum |dL/dW| over the completion rows, dL/dW[P, :4], sum |dL/dE|)
REF = {
    "reinforce_kl": (0.12773817777633667, 0.7664678692817688,
                     [-0.01434208545833826, 0.0050992718897759914, 0.026081671938300133, -0.03404262289404869],
                     0.22876578569412231),
    "ppo_kl": (0.004776865243911743, 0.7873101830482483,
               [-0.012271976098418236, 0.008232391439378262, -0.0005937810055911541, -0.03746875002980232],
               0.33881011605262756),
    "plain": (0.20519538968801498, 0.73116135597229,
              [-0.03135167434811592, 0.017609814181923866, 0.004693055525422096, -0.002238776534795761],
              0.20824195444583893),
    "uniform": (0.16824950277805328, 0.7367557287216187,
                [-0.014185000211000443, 0.005361907184123993, 0.025834962725639343, -0.020576762035489082],
                0.21186000108718872),
    "argmax": (0.06964308023452759, 0.7895328402519226,
               [-0.014662456698715687, 0.0033455556258559227, 0.025239139795303345, -0.00780110526829958],
               0.2085343301296234),
}
REF_PPO_CLIPPED = 0.1822916716337204  # the reference's mean clip share (per state, per row, over kept tokens)
CASES = {"reinforce_kl": dict(mu=1, beta=0.01, low_prob_threshold=0.6, step_temperature=1.0),
         "ppo_kl": dict(mu=2, beta=0.04, low_prob_threshold=0.6, step_temperature=1.0),
         "plain": dict(mu=1, beta=0.0, low_prob_threshold=0.0, step_temperature=1.0),
         "uniform": dict(mu=1, beta=0.0, low_prob_threshold=0.6, step_temperature=math.inf),
         "argmax": dict(mu=1, beta=0.0, low_prob_threshold=0.6, step_temperature=0.0)}

B, P, G, V, MASK = 8, 3, 6, 11, 10
L = P + G


def _inputs():
    """The pinning script's tensors, drawn in its order from the same seed."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(L, V, generator=g)
    E = torch.randn(V, V, generator=g)
    E2 = torch.randn(V, V, generator=g)
    W_old = W + 0.3 * torch.randn(L, V, generator=g)
    W_ref = W + 0.3 * torch.randn(L, V, generator=g)
    ids = torch.randint(0, 10, (B, L), generator=g)
    step_map = torch.stack([torch.randperm(G, generator=g) // 2 * 3 for _ in range(B)])  # several tokens a step
    step_map[1] = torch.tensor([0, 1, 2, 3, 4, 5])
    step_map[2] = torch.tensor([0, 5, 5, 9, 9, 9])
    response = torch.ones(B, G, dtype=torch.bool)
    response[3, 4:] = False
    response[5, 2:] = False
    response[6, 5:] = False
    first = torch.where(response, step_map, 10**6).min(dim=1).values  # tails decoded in the row's first step
    step_map = torch.where(response, step_map, first[:, None])
    commit_logps = torch.log(torch.rand(B, G, generator=g) * 0.95 + 0.02)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    return W, E, E2, W_old, W_ref, ids, step_map, response, commit_logps, rewards


def _logps(W, E, E2, ids, masked):
    """(B, K, G) the toy model's log p(o_k | z_j) at each state's masked completion positions, 0 elsewhere."""
    x = torch.where(masked, MASK, ids[:, None, :])  # (B, K, L)
    logits = W + E[x] + 0.5 * E2[x].mean(dim=2, keepdim=True)
    lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, None, :, None].expand(-1, x.shape[1], -1, 1))[..., 0]
    return torch.where(masked[:, :, P:], lp[:, :, P:], 0.0)


def _case(name, seed=None):
    """The pinning script's inputs; the states the reference replayed (seed None), or our own draw from `seed`."""
    c = CASES[name]
    W, E, E2, W_old, W_ref, ids, step_map, response, commit_logps, rewards = _inputs()
    cfg = run_config("rldf", beta=c["beta"], low_prob_threshold=c["low_prob_threshold"],
                     step_temperature=c["step_temperature"], keep_groups=1.0)
    cfg.rl.group_size, cfg.rl.num_iterations = 4, c["mu"]
    rollout = RolloutOutput(sequences=ids, attention_mask=torch.ones_like(ids), prompt_length=P, response_mask=response,
                            step_map=step_map, commit_logps=commit_logps, nfe=0)
    batch = RLBatch(rollout=rollout, rewards=rewards, group_size=4, totals=Totals(num_sequences=B),
                    advantages=rldf.advantages(rewards.view(2, 4), cfg).view(-1))
    batch = rldf.prepare(batch, cfg)
    draw = _reference_draw(batch, REF_STEPS[name]) if seed is None else rldf.sample_noise(
        batch, torch.Generator().manual_seed(seed), cfg)
    batch = replace(batch, totals=replace(batch.totals, num_units=rldf.loss_units(batch, draw, cfg)))
    W = W.clone().requires_grad_(True)
    E = E.clone().requires_grad_(True)
    logps = _logps(W, E, E2, ids, draw.masked)
    old = _logps(W_old, E, E2, ids, draw.masked).detach() if c["mu"] > 1 else logps.detach()
    ref = _logps(W_ref, E, E2, ids, draw.masked).detach()
    return W, E, logps, old, ref, batch, draw, cfg


REF_STEPS = {"reinforce_kl": STEPS, "ppo_kl": STEPS, "plain": STEPS, "uniform": UNIFORM_STEPS, "argmax": ARGMAX_STEPS}


def _reference_draw(batch, ranks):
    """The reference's replayed states: its remapped step ids (the rank among the row's distinct response steps)
    as our raw step ids, and the states before them."""
    steps = torch.stack([torch.unique(batch.step_map[b][batch.response_mask[b]])[torch.tensor(ranks[b])]
                         for b in range(B)])
    masked, _ = noise.step_states(batch.step_map, steps)
    return noise.Draw(masked=torch.cat([torch.zeros(B, len(ranks[0]), P, dtype=torch.bool), masked], dim=2),
                      steps=steps)


def _ranks(batch, steps):
    """Our raw steps as the reference's remapped ids: the rank among the row's distinct response steps."""
    out = []
    for b in range(B):
        distinct = torch.unique(batch.step_map[b][batch.response_mask[b]])
        out.append([int((distinct < s).sum()) for s in steps[b].tolist()])
    return out


def test_at_temperature_0_the_sampler_draws_the_reference_steps():
    """The top k are deterministic: sample_noise replays exactly the reference's states (its ARGMAX_STEPS)."""
    _, _, _, _, _, batch, draw, _ = _case("argmax", seed=123)
    assert _ranks(batch, draw.steps) == ARGMAX_STEPS
    assert torch.equal(draw.masked, _reference_draw(batch, ARGMAX_STEPS).masked)


def test_the_step_probabilities_are_the_softmax_of_the_steps_mean_surprisal():
    *_, step_map, response, commit_logps, _ = _inputs()
    valid, weights = noise.step_weights(step_map, response, -commit_logps)
    for b, want in enumerate(PROBS):  # the reference's softmax over rows 0 and 1's steps
        assert torch.softmax(weights[b][valid[b]], 0).tolist() == pytest.approx(want, rel=1e-5)
    # row 1: six steps of one token each, so its law is softmax(-log p of each token), in step order
    order = step_map[1].argsort()
    assert torch.softmax(weights[1][valid[1]], 0).tolist() == pytest.approx(
        torch.softmax(-commit_logps[1][order], 0).tolist(), rel=1e-5)


@pytest.mark.parametrize("temperature", [1.0, math.inf])
def test_the_draws_follow_the_references_law(temperature):
    """Each row's first draw has the reference's probabilities (softmax over its steps; uniform), the k draws of a
    row with at least k steps are distinct, and a row with fewer takes each of its steps once first (in step order;
    uniform: whole rounds). 4,000 draws of each row at once; 5 standard errors of the frequencies."""
    *_, step_map, response, commit_logps, _ = _inputs()
    N, k = 4000, 4
    steps = noise.weighted_steps(step_map.repeat(N, 1), response.repeat(N, 1), k, torch.Generator().manual_seed(0),
                                 -commit_logps.repeat(N, 1), temperature).view(N, B, k)
    valid, weights = noise.step_weights(step_map, response, -commit_logps)
    for b in range(B):
        ids = torch.nonzero(valid[b]).flatten()
        law = torch.full((len(ids),), 1 / len(ids)) if temperature == math.inf else torch.softmax(weights[b][ids], 0)
        if len(ids) >= k:
            first = (steps[:, b, :1] == ids).float().mean(0)
            assert (first - law).abs().max() < 5 * (0.25 / N) ** 0.5, (b, first, law)
            assert all(len(set(row)) == k for row in steps[:, b].tolist())  # without replacement
        else:
            assert (steps[:, b, :len(ids)] == ids).all()  # each once, in step order
            if temperature == math.inf:
                rounds = k // len(ids) * len(ids)
                assert (steps[:, b, :rounds] == ids.repeat(k // len(ids))).all()
            else:  # the rest with replacement from the softmax
                rest = (steps[:, b, len(ids):, None] == ids).float().mean((0, 1))
                assert (rest - law).abs().max() < 5 * (0.25 / N) ** 0.5, (b, rest, law)


def test_the_sampler_makes_one_host_read():
    """One read of the largest step id, whatever the rows and steps: no per-row or per-step Python loop reading
    tensors (`int`, `bool`, `item`, `tolist`, `cpu` are counted)."""
    g = torch.Generator().manual_seed(0)
    step_map = torch.stack([torch.randperm(64, generator=g) for _ in range(512)])
    reads, saved = [], {}
    names = ("__int__", "__bool__", "__float__", "item", "tolist", "cpu")
    try:
        for name in names:
            saved[name] = original = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, lambda self, *a, _f=original, _n=name, **k: (reads.append(_n), _f(self, *a, **k))[1])
        for temperature in (1.0, 0.0, math.inf):
            steps = noise.weighted_steps(step_map, torch.ones_like(step_map, dtype=torch.bool), 4, g,
                                         torch.rand(512, 64, generator=g), temperature)
    finally:
        for name in names:
            setattr(torch.Tensor, name, saved[name])
    assert reads == ["__int__"] * 3 and steps.shape == (512, 4) and (steps >= 0).all()


@pytest.mark.parametrize("name", list(REF))
def test_loss_and_gradient_match_the_reference_code(name):
    value, grad_abs, row0, grad_e = REF[name]
    W, E, logps, old, ref, batch, draw, cfg = _case(name)
    loss, metrics = rldf.loss(logps, old, ref, batch, draw, cfg)
    assert loss.item() == pytest.approx(value, rel=1e-5)
    loss.backward()
    assert W.grad[P:].abs().sum().item() == pytest.approx(grad_abs, rel=1e-5)
    assert W.grad[P, :4].tolist() == pytest.approx(row0, rel=1e-4, abs=1e-7)
    assert E.grad.abs().sum().item() == pytest.approx(grad_e, rel=1e-5)
    if name == "ppo_kl":
        assert metrics["stats/clipped"] == pytest.approx(REF_PPO_CLIPPED, rel=1e-6)


def test_the_kept_groups_are_the_references():
    """filter_rollout_samples (max_groups 2 of 4 groups of 2): the group whose rewards differ, then, none being
    all-correct, the all-wrong group with the most decoding steps (1.5, 3, 2 on average): rows [0, 1, 4, 5]."""
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    steps = torch.tensor([[2, 2], [2, 1], [3, 3], [2, 2]])
    keep = rldf.groups_kept(rewards, steps, 0.5)
    assert torch.nonzero(keep.repeat_interleave(2, 0).view(-1)).flatten().tolist() == [0, 1, 4, 5]
    # enough varied groups: only they are kept; all-correct groups before all-wrong ones
    rewards = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    assert rldf.groups_kept(rewards, steps, 0.5).view(-1).tolist() == [False, True, False, True]
    assert rldf.groups_kept(rewards, steps, 0.75).view(-1).tolist() == [True, True, False, True]


def test_dropped_groups_add_nothing_and_the_loss_averages_over_the_kept_rows():
    W, E, logps, old, ref, batch, draw, cfg = _case("reinforce_kl")
    whole, _ = rldf.loss(logps, old, ref, batch, draw, cfg)
    half = replace(cfg, algo=replace(cfg.algo, keep_groups=0.5))
    b2 = rldf.prepare(replace(batch, extras={}), half)
    b2 = replace(b2, totals=replace(b2.totals, num_units=rldf.loss_units(b2, draw, half)))
    assert b2.num_units == 4 and b2.extras["kept"].tolist() == [1.0] * 4 + [0.0] * 4  # both groups vary: the first
    part, _ = rldf.loss(logps, old, ref, b2, draw, half)
    rows = slice(0, 4)
    only = replace(take(batch, rows, B), extras={"kept": torch.ones(4)}, totals=replace(batch.totals, num_units=4.0))
    alone, _ = rldf.loss(logps[rows], old[rows], ref[rows], only,
                         noise.Draw(masked=draw.masked[rows], steps=draw.steps[rows]), cfg)
    assert part.item() == pytest.approx(alone.item(), rel=1e-6) and part.item() != pytest.approx(whole.item())


def test_the_loss_adds_up_over_micro_batches():
    W, E, logps, old, ref, batch, draw, cfg = _case("ppo_kl")
    whole, _ = rldf.loss(logps, old, ref, batch, draw, cfg)
    parts = 0.0
    for rows in (slice(0, 3), slice(3, 8)):
        mb = take(batch, rows, B)
        part, _ = rldf.loss(logps[rows], old[rows], ref[rows], mb,
                            noise.Draw(masked=draw.masked[rows], steps=draw.steps[rows]), cfg)
        parts = parts + part
    assert parts.item() == pytest.approx(whole.item(), rel=1e-5, abs=1e-7)  # float32 sums of a small difference


def test_the_filter_keeps_confident_tokens_and_the_replayed_steps_own():
    W, E, logps, old, ref, batch, draw, cfg = _case("plain")
    # every scored token below the threshold: only the tokens the replayed steps decoded are trained on
    strict = replace(cfg, algo=replace(cfg.algo, low_prob_threshold=0.99))
    low = torch.full_like(logps, math.log(0.5)).requires_grad_(True)
    loss, metrics = rldf.loss(low, low.detach(), None, batch, draw, strict)
    loss.backward()
    _, current = noise.step_states(batch.step_map, draw.steps)
    scored = draw.masked[:, :, P:] & batch.response_mask[:, None, :]
    assert torch.equal(low.grad != 0, current & batch.response_mask[:, None, :] & (batch.advantages != 0)[:, None, None])
    assert (low.grad[scored & ~current] == 0).all() and metrics["stats/kept_share"] < 1
    # no filter: every masked completion token is trained on
    loss, metrics = rldf.loss(low, low.detach(), None, batch, draw, cfg)
    assert metrics["stats/kept_share"] == pytest.approx(1.0)


def test_states_are_the_trajectory_before_each_step():
    step_map = torch.tensor([[2, 0, 5, 2, -1]])
    masked, current = noise.step_states(step_map, torch.tensor([[2, 0, 5, -1]]))
    assert masked[0].int().tolist() == [[1, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 1, 0, 1], [0, 0, 0, 0, 0]]
    assert current[0].int().tolist() == [[1, 0, 0, 1, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]]
    # no response token: no step; fewer steps than k under the uniform law: whole rounds first
    steps = noise.weighted_steps(torch.tensor([[0, 1], [3, 3]]), torch.tensor([[False, False], [True, True]]), 3,
                                 torch.Generator().manual_seed(0))
    assert steps.tolist() == [[-1, -1, -1], [3, 3, 3]]


def test_the_weighted_sampler_prefers_surprising_steps():
    step_map = torch.arange(4).repeat(1, 1)
    scores = torch.tensor([[0.1, 0.1, 3.0, 0.1]])  # step 2 committed a token the sampler gave p = e^-3
    g = torch.Generator().manual_seed(0)
    first = [noise.weighted_steps(step_map, torch.ones(1, 4, dtype=torch.bool), 1, g, scores, 1.0).item()
             for _ in range(400)]
    assert first.count(2) / 400 == pytest.approx(math.exp(3) / (math.exp(3) + 3 * math.exp(0.1)), abs=0.06)
    hot = [noise.weighted_steps(step_map, torch.ones(1, 4, dtype=torch.bool), 1, g, scores, 1e4).item() for _ in range(400)]
    assert hot.count(2) / 400 == pytest.approx(0.25, abs=0.07)  # uniform


def test_the_dream_sampler_is_refused_with_weighted_steps():
    cfg = run_config("rldf")
    cfg.rl.decoding = replace(cfg.rl.decoding, sampler="dream")
    with pytest.raises(ValueError, match="commit log-probs"):
        rldf.check_config(cfg)
    rldf.check_config(run_config("rldf", step_temperature=math.inf))
