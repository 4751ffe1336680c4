"""Noise (mask) samplers for likelihood estimation, every one drawing from an explicit
`torch.Generator` so that old, reference and current log-probs can be computed on the SAME draws
(the reference repos reseed the global RNG inside the loss, or draw new masks per pass).

A sampler returns a bool mask shaped like `maskable`: True where the token is replaced by MASK;
`maskable` (B, L) marks the positions that may be masked (usually the valid completion tokens).
Draws are made on the generator's device (the CPU) and moved to the mask's device, so the same
seed gives the same masks on every accelerator. A draw handed between hooks is a `Draw`
(see `dare.train.hooks`): row-major, so micro-batching slices it with the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Draw:
    """One noise draw, as the hooks pass it around (row-major: dim 0 is the batch row). What every RL
    `sample_noise` returns; `Draw()` (nothing drawn) is the default of an algorithm whose inputs the
    rollout fixes (trajectory replays: their data is in `batch.extras`, from `prepare`). Each field has one
    shape, given by `masked`'s ((B, L) for one draw per row, (B, n, L) for n Monte Carlo draws per row):

    masked: bool, True where the input is the mask token, over the batch's sequence layout;
    t:      the masking ratio of each draw, `masked`'s shape without the positions: (B,) or (B, n);
    t_at:   the ratio each position was masked at, `masked`'s shape, for draws whose ratio varies along the
            sequence (one per block: coupled-GRPO on block models, EBPO's cells); `t` is then None;
    weight: the estimator's weight, per draw (`t`'s shape, e.g. 1/t or L/l) or per position (`masked`'s
            shape, EBPO's L_b / l_b), when it has one;
    steps:  (B, n) the decoding step each draw replays, for estimators that draw steps of the
            sampler's trajectory instead of masks (AGRPO, RLDF);
    shown:  `masked`'s shape, bool: masked positions a second view of the draw shows with the completion's own
            tokens (a teacher that sees part of the future: d-OPSD's `reference_logps`)."""

    masked: torch.Tensor | None = None
    t: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    steps: torch.Tensor | None = None
    t_at: torch.Tensor | None = None
    shown: torch.Tensor | None = None

    def check(self, who: str = "sample_noise") -> "Draw":
        """This draw, after raising ValueError if a field's shape is not the one the class docstring gives it."""
        if self.masked is None:
            return self
        rows = tuple(self.masked.shape[:-1])
        shapes = {"t": [rows], "t_at": [tuple(self.masked.shape)], "weight": [rows, tuple(self.masked.shape)],
                  "shown": [tuple(self.masked.shape)]}
        for name, allowed in shapes.items():
            value = getattr(self, name)
            if value is not None and tuple(value.shape) not in allowed:
                raise ValueError(f"{who}: Draw.{name} has shape {tuple(value.shape)}; with masked "
                                 f"{tuple(self.masked.shape)} it must be {' or '.join(map(str, allowed))}")
        if self.t is not None and self.t_at is not None:
            raise ValueError(f"{who}: a Draw gives the ratio per draw (t) or per position (t_at), not both")
        return self


def single_draws(draw: Draw, dim: int = 1) -> list[Draw]:
    """A multi-draw `Draw` cut into its Monte-Carlo draws along `dim` (each part keeps the dimension, of size 1):
    the parts an algorithm's `draw_parts` returns to backpropagate its estimate one draw at a time (BGPO, EBPO;
    VRPO along each side's draws, dim 2)."""
    def part(x, k):
        return None if x is None else x.narrow(dim, k, 1)
    return [Draw(part(draw.masked, k), part(draw.t, k), part(draw.weight, k), t_at=part(draw.t_at, k),
                 shown=part(draw.shown, k))
            for k in range(draw.masked.shape[dim])]


def _rand(shape, generator: torch.Generator, device) -> torch.Tensor:
    return torch.rand(shape, generator=generator).to(device)


def completion(attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """(B, P + G) bool: the completion positions of an RL batch (everything after the prompt)."""
    out = torch.zeros_like(attention_mask, dtype=torch.bool)
    out[:, prompt_length:] = True
    return out


def blocks(attention_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """(B, L) long: the block of every position of a left-padded batch, counted from the row's
    first real token (`position // block_size`, as the block sampler and the model's block rule
    count them), -1 on padding."""
    valid = attention_mask.bool()
    position = valid.long().cumsum(dim=1) - 1
    return torch.where(valid, position // block_size, -1)


def per_block(values: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """(B, L) `values[b, block[b, i]]` for values (B, n_blocks) drawn per (row, block); 0 on padding."""
    return torch.where(block >= 0, values.gather(1, block.clamp(min=0)), 0.0)


def full_completion(maskable: torch.Tensor, prompt: torch.Tensor, p_mask_prompt: float,
                    generator: torch.Generator) -> torch.Tensor:
    """d1 / diffu-GRPO: every completion token masked, each prompt token masked with probability
    `p_mask_prompt` (one-step mean-field estimate; d1 draws one uniform per position of the
    whole sequence, `forward_process`)."""
    u = _rand(maskable.shape, generator, maskable.device)
    return maskable | (prompt & (u < p_mask_prompt))


def iid(maskable: torch.Tensor, t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """LLaDA's forward process: each maskable token masked independently with probability t (B,)
    or (B, n) (then the mask is (B, n, L) for maskable (B, L))."""
    shape = (*t.shape, maskable.shape[-1])
    u = _rand(shape, generator, maskable.device)
    keep = maskable if t.dim() == 1 else maskable[:, None, :]
    return keep & (u < t.to(maskable.device)[..., None])


def exact_count(maskable: torch.Tensor, counts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Exactly counts[b] maskable positions of row b masked, uniformly at random."""
    scores = _rand(maskable.shape, generator, maskable.device)
    scores = torch.where(maskable, scores, torch.full_like(scores, 2.0))  # never pick non-maskable
    rank = scores.argsort(dim=1).argsort(dim=1)
    return maskable & (rank < counts[:, None].to(maskable.device))


def stratified_counts(lengths: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """(n, B) mask counts l in 1..L_b spread over the n draws: LLaDA's `get_log_likelihood`
    stratification, `linspace` over [1, L] offset by one random shift."""
    shift = torch.rand((), generator=generator).item()
    grid = (torch.arange(n, dtype=torch.float64) + shift) / n  # stratified in [0, 1)
    counts = 1 + (grid[:, None] * lengths.cpu()[None, :].double()).floor().long()
    return counts.clamp(max=lengths.cpu().clamp(min=1)[None, :])


def stratified_times(rows: int, n: int, generator: torch.Generator, eps: float = 1e-3) -> torch.Tensor:
    """(rows, n) diffusion times, one per stratum ((k + u) / n, u ~ U(0, 1) drawn per row and
    stratum), clamped below at eps: VRPO's stratified timesteps (LLaDA 1.5, §3.2)."""
    u = torch.rand(rows, n, generator=generator)
    return ((torch.arange(n) + u) / n).clamp(min=eps)


def complementary(maskable: torch.Tensor, t: torch.Tensor, generator: torch.Generator):
    """coupled-GRPO: a mask at ratio t (B,) and its complement within the maskable tokens, so every
    maskable token is masked in exactly one of the pair. -> (mask, complement)"""
    first = iid(maskable, t, generator)
    return first, maskable & ~first


def elbo_draws(maskable: torch.Tensor, n: int, generator: torch.Generator, weighting: str = "count",
               eps: float = 1e-3, stratified: bool = True) -> Draw:
    """n Monte Carlo draws per row for the ELBO of the maskable tokens (`estimators.elbo`):
    masked (B, n, L), t (B, n) the masked fraction, weight (B, n).

    weighting="count": l ~ stratified U{1..L}, exactly l positions masked, weight L / l (LLaDA's
                       lower-variance estimator, `get_log_likelihood`); `stratified=False`: each l drawn
                       on its own, uniform on {1..L} (ELBO-KTO's fixed-l estimator);
    weighting="time":  t ~ stratified U(0, 1] (`stratified_times`), i.i.d. masking at t, weight 1 / t
                       (the ELBO's definition; VRPO)."""
    if weighting == "count":
        lengths = maskable.sum(dim=1)
        if stratified:
            counts = stratified_counts(lengths, n, generator).to(maskable.device)  # (n, B)
        else:
            u = torch.rand((n, lengths.shape[0]), generator=generator, dtype=torch.float64)
            counts = (1 + (u * lengths.cpu()[None, :].double()).floor().long()).to(maskable.device)
        masked = torch.stack([exact_count(maskable, counts[k], generator) for k in range(n)], dim=1)
        t = (counts / lengths.clamp(min=1)[None, :]).T.float()
        return Draw(masked, t, (lengths[None, :].float() / counts.clamp(min=1).float()).T)
    if weighting != "time":
        raise ValueError(f"weighting={weighting!r}: expected 'count' or 'time'")
    t = stratified_times(maskable.shape[0], n, generator, eps).to(maskable.device)
    return Draw(iid(maskable, t, generator), t, 1.0 / t)


def complementary_pairs(maskable: torch.Tensor, n_pairs: int, generator: torch.Generator) -> Draw:
    """ESPO's coupled ELBO draws (`ML-GSAI/ESPO` `forward_process` + `_get_elbo(reduce_var=True)`), n_pairs
    pairs per row: a count x in {0..L} stratified over the rows (x_i = round(k + i (L + 1) / B) mod (L + 1),
    one k ~ U{0..L} per pair), exactly x of the L maskable positions masked uniformly, then the complement;
    weights (L + 1) / x and (L + 1) / (L - x) (0 for an empty mask). `estimators.elbo` on these draws (the mean
    over the 2 n_pairs draws of weight x the masked log-probs) is ESPO's mean over pairs of half the pair's sum.
    -> masked (B, 2 n_pairs, L), t (B, 2 n_pairs) the masked share, weight (B, 2 n_pairs)."""
    B = maskable.shape[0]
    lengths = maskable.sum(dim=1).cpu()
    masks, ts, weights = [], [], []
    for _ in range(n_pairs):
        k = torch.randint(0, 2**31 - 1, (), generator=generator)
        x = torch.round((k % (lengths + 1)).double() + torch.arange(B) * (lengths + 1) / B).long() % (lengths + 1)
        first = exact_count(maskable, x.to(maskable.device), generator)
        second = maskable & ~first
        for m, c in ((first, x), (second, lengths - x)):
            masks.append(m)
            ts.append(c.float() / lengths.clamp(min=1).float())
            weights.append(torch.where(c > 0, (lengths + 1).float() / c.clamp(min=1).float(), 0.0))
    return Draw(torch.stack(masks, dim=1), torch.stack(ts, dim=1).to(maskable.device),
                torch.stack(weights, dim=1).to(maskable.device))


GAUSS_LEGENDRE = {1: ([0.0], [2.0]), 2: ([-0.5773502691896257, 0.5773502691896257], [1.0, 1.0]),
                  3: ([-0.7745966692414834, 0.0, 0.7745966692414834], [5 / 9, 8 / 9, 5 / 9])}
"""Gauss-Legendre nodes and weights on [-1, 1] (GDPO's `gauss-1`..`gauss-3`)."""


def quadrature(maskable: torch.Tensor, nodes: int, generator: torch.Generator) -> Draw:
    """GDPO's semi-deterministic draws (`KevinRojas1499/GDPO` `NumericalIntegrationEstimator`): the time
    integral of the ELBO by Gauss-Legendre quadrature over t in (0, 1), one draw per node t_k = (xi_k + 1) / 2
    with exactly int(t_k L) maskable positions masked (a uniform subset; no minimum of 1, as the reference),
    weight = nodes x (w_k / 2) / t_k, so that `estimators.elbo` (the mean over draws of weight x the masked
    log-probs) is sum_k (w_k / 2) (1 / t_k) sum_masked log p, the reference's -1/2 sum_k w_k loss_k.
    -> masked (B, nodes, L), t (B, nodes), weight (B, nodes)."""
    if nodes not in GAUSS_LEGENDRE:
        raise ValueError(f"nodes={nodes}: Gauss-Legendre rules with {sorted(GAUSS_LEGENDRE)} nodes are available")
    xi, w = GAUSS_LEGENDRE[nodes]
    B = maskable.shape[0]
    lengths = maskable.sum(dim=1)
    masks, ts, weights = [], [], []
    for node, wk in zip(xi, w):
        t = (node + 1) / 2
        masks.append(exact_count(maskable, (t * lengths.float()).long(), generator))
        ts.append(torch.full((B,), t, device=maskable.device))
        weights.append(torch.full((B,), nodes * wk / 2 / t, device=maskable.device))
    return Draw(torch.stack(masks, dim=1), torch.stack(ts, dim=1), torch.stack(weights, dim=1))


def block_random(response: torch.Tensor, segment: torch.Tensor, prompt: torch.Tensor, n: int, generator: torch.Generator,
                 min_t: float = 0.0, max_t: float = 1.0, p_mask_prompt: float = 0.15) -> Draw:
    """SPG's block-wise masking (`facebookresearch/SPG` `forward_process`, "block_random"), n draws per row.

    response (B, G) bool: the scored completion tokens (up to and including the first EOS); segment (B, G)
    long: each completion position's block, 0 at the completion's first block; prompt (B, P) bool: the real
    prompt tokens. Per row, the n draws' blocks are the first n entries of one permutation of the row's
    blocks taken modulo the blocks that hold scored tokens (as the reference: distinct when the response
    fills every block; more draws than blocks, which the reference refuses, continue with new permutations). In a draw's block k: blocks before k clean, blocks after k masked, and in block k a
    uniform count in [max(1, int(len * min_t)), min(int(len * max_t), len)] of its `len` scored tokens
    masked, a uniform subset; positions after the response masked too; then every prompt token and every
    token of the blocks before k masked with probability p_mask_prompt (block k's other tokens stay clean).
    -> masked (B, n, P + G), t (B, n): the masked share of the scored tokens (SPG's empirical t)."""
    B, G = response.shape
    P = prompt.shape[1]
    device = response.device
    completion = torch.zeros((B, n, G), dtype=torch.bool)
    earlier = torch.zeros((B, n, G), dtype=torch.bool)  # the clean blocks before each draw's block
    resp, seg = response.cpu(), segment.cpu()
    for b in range(B):
        n_blocks = int(seg[b].max()) + 1
        used = int(seg[b][resp[b]].max()) + 1 if resp[b].any() else 1
        order = torch.cat([torch.randperm(n_blocks, generator=generator) for _ in range(-(-n // n_blocks))])
        chosen = order[:n] % used
        for j, k in enumerate(chosen.tolist()):
            real = (seg[b] == k) & resp[b]  # the scored tokens of block k (a prefix of the block)
            length = int(real.sum())
            completion[b, j] = (seg[b] > k) | ~resp[b]
            earlier[b, j] = seg[b] < k
            if length:
                lo = max(int(length * min_t), 1)
                hi = max(min(int(length * max_t), length), lo)  # at least one (the reference's randint fails there)
                count = int(torch.randint(lo, hi + 1, (1,), generator=generator))
                pick = torch.randperm(length, generator=generator)[:count]
                completion[b, j, real.nonzero()[pick, 0]] = True
    masked = torch.cat([torch.zeros((B, n, P), dtype=torch.bool), completion], dim=2).to(device)
    clean = torch.cat([prompt[:, None, :].expand(B, n, P).cpu(), earlier], dim=2).to(device)
    masked |= clean & (_rand(masked.shape, generator, device) < p_mask_prompt)
    scored = masked[:, :, P:] & response[:, None, :]
    t = scored.sum(dim=2).float() / response.sum(dim=1, keepdim=True).clamp(min=1).float()
    return Draw(masked, t)


def block_stratified(response: torch.Tensor, segment: torch.Tensor, prompt_length: int, n: int,
                     generator: torch.Generator) -> Draw:
    """EBPO's per-block draws (as DARE ports the LLaDA2.1 report's estimator, `_forward_process_ebpo`), n per
    row: every (draw, block) cell of a row gets a noise level t = (u + idx / #cells) mod 1 (one u ~ U(0, 1) per
    row: stratified over the row's cells), masks min(int(t L_b) + 1, L_b) of the block's L_b scored tokens
    (a uniform subset) and weighs them L_b / l_b. response (B, G) bool: the scored tokens; segment (B, G): each
    completion position's block. -> masked (B, n, P + G), t_at (B, n, P + G) the level of each scored token's
    cell (0 elsewhere), weight (B, n, P + G) per position (L_b / l_b on the block's masked tokens, 0 elsewhere)."""
    B, G = response.shape
    resp, seg = response.cpu(), segment.cpu()
    masked = torch.zeros((B, n, prompt_length + G), dtype=torch.bool)
    weight = torch.zeros((B, n, prompt_length + G))
    n_blocks = int(seg.max()) + 1
    levels = torch.zeros((B, n, n_blocks))
    for b in range(B):
        cells = n * n_blocks
        u = torch.rand((), generator=generator)
        levels[b] = ((u + torch.arange(cells) / cells) % 1.0).view(n, n_blocks)
        for j in range(n):
            for k in range(n_blocks):
                real = ((seg[b] == k) & resp[b]).nonzero()[:, 0]
                if len(real) == 0:
                    continue
                count = min(int(levels[b, j, k] * len(real)) + 1, len(real))
                pick = real[torch.randperm(len(real), generator=generator)[:count]] + prompt_length
                masked[b, j, pick] = True
                weight[b, j, pick] = len(real) / count
    cell = torch.where(resp, seg, 0)[:, None, :].expand(B, n, G)  # each completion position's block
    at = torch.where(resp[:, None, :], levels.gather(2, cell), 0.0)
    t_at = torch.cat([torch.zeros((B, n, prompt_length)), at], dim=2)
    return Draw(masked.to(response.device), weight=weight.to(response.device), t_at=t_at.to(response.device))


NEVER = 2**40
"""`trace_rounds` value of a completion position no decoding step committed: masked in every round."""


def trace_rounds(step_map: torch.Tensor, segment: torch.Tensor, shrink: int = 1) -> torch.Tensor:
    """TraceRL's trajectory slices (Gen-Verse/dLLM-RL `collapse_k_unique` + `one_round_vectorized`):
    (B, G) the round in which each completion position is scored.

    Within each segment (a block of a block-causal model, the whole completion otherwise: `segment`
    (B, G), the segment id of each position), the distinct decoding steps are ranked in order and
    every `shrink` consecutive ones form a group; the position's round is its group's rank. Round r
    scores the tokens of round r with every token of round >= r masked (earlier ones clean): in each
    segment, the state just before its r-th group of steps was decoded. Positions without a step
    (step_map < 0: never committed) get `NEVER`: masked in every round, scored in none."""
    committed = step_map >= 0
    B, G = step_map.shape
    steps = step_map.clamp(min=0)
    seg = segment.clamp(min=0)
    span = int(steps.max()) + 2 if committed.any() else 2
    n_seg = int(seg.max()) + 1
    key = (torch.arange(B, device=step_map.device)[:, None] * n_seg + seg) * span + steps
    key = torch.where(committed, key, -1)
    uniq, inverse = torch.unique(key, return_inverse=True)  # sorted: by row, then segment, then step
    group = uniq.div(span, rounding_mode="floor")  # (row, segment) of each distinct step
    rank = torch.arange(len(uniq), device=key.device) - torch.searchsorted(group, group, side="left")
    rounds = (rank // shrink)[inverse]
    return torch.where(committed, rounds, NEVER)


def transition_sizes(rounds: torch.Tensor, on: torch.Tensor, segment: torch.Tensor | None = None,
                     dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The transitions of a trajectory replay, a transition being one round of one segment of a row (a block of a
    block-causal model; the whole completion without `segment`), counted over the `on` tokens: ((B, G) the size of
    each token's transition, 1 where the token is not on; (B, 1) the number of a row's transitions with an on
    token). `rounds` (B, G): the completion's rounds (`trace_rounds`). CJ-GRPO's per-transition means, TraceRL's
    trace rows."""
    r = torch.where(on, rounds, 0)
    key = r if segment is None else torch.where(on, segment * ((int(r.max()) + 1) if r.numel() else 1) + r, 0)
    width = int(key.max()) + 1 if key.numel() else 1
    counts = torch.zeros(key.shape[0], width, dtype=dtype, device=key.device).scatter_add_(1, key, on.to(dtype))
    return counts.gather(1, key).clamp(min=1), (counts > 0).sum(dim=1, keepdim=True)


def rollout_segments(batch) -> torch.Tensor:
    """(B, G) the segment of each completion position of an RL batch: its block for a block-causal
    model (counted as the sampler counts them, `blocks`), 0 everywhere for a masked model; with dynamic
    blocks (`decoding.block.dynamic`) the block each row decoded it in (`batch.segments`, 0 = the first)."""
    if getattr(batch, "segments", None) is not None:
        return batch.segments
    if batch.block_size is None:
        return torch.zeros_like(batch.step_map)
    return blocks(batch.attention_mask, batch.block_size)[:, batch.prompt_length:]


def rollout_rounds(batch, shrink: int = 1) -> torch.Tensor:
    """(B, P + G) the trajectory round of every position of an RL batch (`trace_rounds` over
    `rollout_segments`): -1 on the prompt (never masked), `NEVER` where no step committed."""
    rounds = trace_rounds(batch.step_map, rollout_segments(batch), shrink)
    return torch.cat([torch.full_like(batch.sequences[:, :batch.prompt_length], -1), rounds], dim=1)


def left_to_right_rounds(batch) -> torch.Tensor:
    """(B, P + G) the rounds of an autoregressive order over an RL batch's completions (JustGRPO's
    AR-prefix likelihood): each completion token is its own round, in position order within its
    segment (`rollout_segments`: the whole completion of a masked model, so round t is position t;
    each block of a block-causal model, so the k-th completion tokens of all blocks share round k).
    -1 on the prompt. Every position is scored, after the first EOS too."""
    B, G = batch.step_map.shape
    order = torch.arange(G, device=batch.step_map.device).expand(B, G)
    rounds = trace_rounds(order, rollout_segments(batch))
    return torch.cat([torch.full_like(batch.sequences[:, :batch.prompt_length], -1), rounds], dim=1)


def trajectory_states(trajectory: torch.Tensor, steps: torch.Tensor, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's recorded states before the given steps: `trajectory` (B, S, G) the completion
    after every step, `steps` (B, K) -> (states (B, K, G), masked (B, K, G) bool): the canvas each
    step decoded from (all MASK before step 0) and its masked positions. Unlike `trace_rounds` (which
    rebuilds states from the step map) this reads the recorded states, so samplers that re-mask
    committed tokens (RCR) are replayed exactly."""
    before = torch.cat([torch.full_like(trajectory[:, :1], mask_id), trajectory[:, :-1]], dim=1)
    states = before.gather(1, steps[..., None].expand(-1, -1, trajectory.shape[-1]))
    return states, states == mask_id


UNIFORM_STEP_TEMPERATURE = 1e4
"""`weighted_steps`: at or above this temperature the steps are drawn uniformly (Drift's `UNIFORM_TEMP_THRESHOLD`)."""


def step_weights(step_map: torch.Tensor, on: torch.Tensor, scores: torch.Tensor | None = None):
    """The decoding steps that committed each row's `on` tokens, as (B, S) tables indexed by step id (S: the largest
    step id + 1, one host read): `valid` (B, S) bool, the row's distinct steps; `weights` (B, S), the mean of `scores`
    (B, G) over the `on` tokens each step committed (zeros without `scores`). `valid.sum(1)`: each row's step count."""
    on = on.bool() & (step_map >= 0)
    B, S = step_map.shape[0], int(step_map.max().clamp(min=0)) + 1
    idx = step_map.clamp(min=0)
    count = torch.zeros(B, S, device=step_map.device).scatter_add_(1, idx, on.float())
    if scores is None:
        return count > 0, torch.zeros_like(count)
    total = torch.zeros_like(count).scatter_add_(1, idx, torch.where(on, scores.float(), 0.0))
    return count > 0, total / count.clamp(min=1)


def weighted_steps(step_map: torch.Tensor, on: torch.Tensor, k: int, generator: torch.Generator,
                   scores: torch.Tensor | None = None, temperature: float = float("inf")) -> torch.Tensor:
    """(B, k) long: k of the decoding steps that committed each row's `on` tokens, -1 where a row has none (the law
    of Drift's `sequential_masking`, ant-research/Drift `trainer/masking_strategy.py`). A step's weight is the mean
    of `scores` over the tokens it committed (`step_weights`; Drift: their surprisal -log p at the commit). The
    steps are drawn without replacement with probabilities softmax(weight / temperature) (the Gumbel top-k, which
    has the law of drawing one at a time from the renormalised softmax); uniformly without `scores`, at
    temperature >= `UNIFORM_STEP_TEMPERATURE` or where a row's weights are all equal; the top k at temperature 0.
    A row with fewer than k steps takes each once, in step order, then: uniform, whole rounds of them and then a
    random subset; temperature 0, the top one again; else draws with replacement from the softmax (the reference's
    rules). Vectorised over rows and steps; the draws are not the reference's random stream (its law is; the top k
    at temperature 0 are its steps exactly). `step_states` gives the states they replay."""
    valid, w = step_weights(step_map, on, scores)
    B, S, dev = *valid.shape, step_map.device
    n = valid.sum(dim=1, keepdim=True)  # (B, 1) each row's step count
    if scores is None or temperature >= UNIFORM_STEP_TEMPERATURE:
        flat = torch.ones(B, 1, dtype=torch.bool, device=dev)
    else:  # equal weights (a sample std under 1e-8, as the reference's) are drawn uniformly
        mean = (w * valid).sum(1, keepdim=True) / n.clamp(min=1)
        flat = (n > 1) & ((((w - mean) * valid) ** 2).sum(1, keepdim=True) / (n - 1).clamp(min=1)).sqrt().lt(1e-8)
    greedy = ~flat & (temperature == 0)
    logits = torch.where(flat, 0.0, w if temperature == 0 else w / temperature).masked_fill(~valid, -torch.inf)
    gumbel = -torch.log(-torch.log(_rand((B, k + 1, S), generator, dev).clamp(1e-12, 1 - 1e-7)))
    order = torch.where(greedy, logits, logits + gumbel[:, 0]).argsort(dim=1, descending=True, stable=True)
    iid = (logits[:, None, :] + gumbel[:, 1:]).argmax(dim=2)  # (B, k): with replacement
    ascending = torch.where(valid, torch.arange(S, device=dev), S).sort(dim=1).values  # the row's steps first
    j = torch.arange(k, device=dev).expand(B, k)
    at = lambda x, i: x.gather(1, i.clamp(min=0, max=S - 1))  # noqa: E731
    rounds = k // n.clamp(min=1) * n
    short = torch.where(flat, torch.where(j < rounds, at(ascending, j % n.clamp(min=1)), at(order, j - rounds)),
                        torch.where(j < n, at(ascending, j), torch.where(greedy, order[:, :1], iid)))
    return torch.where(n >= k, at(order, j), short).masked_fill(n == 0, -1)


def step_states(step_map: torch.Tensor, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The trajectory's states just before the given decoding steps, rebuilt from the step map: `step_map` (B, G),
    `steps` (B, k) (-1: none) -> (masked (B, k, G): the positions that step or a later one committed, and those no
    step committed; current (B, k, G): the positions that step committed). Nothing is masked for a step of -1."""
    real = (steps >= 0)[..., None]
    s, at = step_map[:, None, :], steps[..., None]
    return ((s >= at) | (s < 0)) & real, (s == at) & real
