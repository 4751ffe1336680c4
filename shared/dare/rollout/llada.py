"""The masked-diffusion sampler: LLaDA's reference `generate` (`ML-GSAI/LLaDA:generate.py`) with
Fast-dLLM's KV caches and parallel decoding (`NVlabs/Fast-dLLM:llada/generate.py`), batched and
pad-aware, for every bidirectional family (LLaDA, LLaDA-MoE; Dream through its aligned logits).

    x = [prompt | MASK * gen_length]; blocks of `block_length` are decoded left to right; each
    block gets steps / n_blocks steps and its masked tokens are committed in an even split over
    them (the remainder to the first steps). Each step: x0 = Gumbel-max sample of the logits
    (argmax at temperature 0); confidence = softmax probability of x0 ("low_confidence") or
    U(0,1) ("random"), -inf outside the current block and on committed positions; commit the
    quota's most confident positions per row.

Fast-dLLM options (this sampler's options are `decoding.masked`, defined and checked by `dare.decoding.masked`):
- `cache="prefix"`: one full forward per block fills the KV cache (and makes the block's first
  commit); the cache is cut to the prefix and every later step runs the block and everything
  after it on top of it. `cache="dual"`: the full cache is kept and each step runs only the
  block, replacing its keys in the cache (the masked suffix's keys are reused, stale).
  `further_horizon=h` (prefix cache only; TraceRL's LLaDA rollout, `Gen-Verse/dLLM-RL @10b4fd1,
  sample/llada_rl_rollout.py`): those later steps run only the block and the h positions after it
  (h = 0: the block alone, as the original's window; unset: everything after the block), so the rest of
  the canvas is not seen; their commit ranks over that window.
- `threshold=t`: commit every masked token with confidence >= t, at least the most confident
  one, until the block is clean (steps become nominal). `factor=f`: the factor rule.
  Both apply with or without a cache.

CJ-GRPO's decoding companions (yjyddq/EOSER-ASS-RL @5affb4e, `eval/generate.py`; any method and
evaluation can use them):
- `schedule="ass"` (ascending step size): step i commits 2^i tokens, the last step the rest, in
  steps = floor(log2 gen_length); with `ass_blocks` = k > 1 the last block holds 2^(S-1) + 1 + the
  remainder and is decoded in the last step, the k - 2 before it 2^(S-2), ..., one step each, and
  the first block the small steps 0..S-k (`ass_plan`).
- `eos_gamma_min/max` (EOSER): a position whose prediction is EOS has its confidence multiplied by
  gamma_s (`eos_gamma`): with the even schedule gamma rises linearly with the step index INSIDE the
  block over the TOTAL step count, so in semi-AR decoding it restarts every block and never reaches
  eos_gamma_max (as the code does it); with ASS it follows (2^(s+1) - 1) / 2^S of the global step s.
  Only EOS is damped (not the end-of-turn token), as in the code.

Differences from the references, none of which change their greedy outputs:
1. Gumbel-max is computed in log space, `argmax(logits - T * log(-log u))`, in float64; the
   reference's `exp(logits) / (-log u)^T` has the same argmax but can overflow.
2. Sampling and confidences are computed for the current block only (elsewhere the confidence is
   -inf in the references, so nothing there is ever committed); the positions are then ranked
   over the same span as the reference's `topk` (the whole row without a cache and at a cached
   block's first step, from the block on with the prefix cache, the block with the dual cache),
   so equal confidences are broken the same way.
3. Randomness comes from an explicit `torch.Generator`, so sampled outputs match the references
   in distribution, not draw for draw.
4. Left padding is hidden from attention and positions start at each prompt's first token.
5. Shifted models (Dream) with a cache run the step from position s-1 so that the block's first
   position gets its real (shifted) logit; Fast-dLLM's Dream instead commits that position from
   the block's full forward.
6. With a cache or parallel decoding (loops that run until the block is clean) the mask token is
   never chosen as x0, as in dInfer (its confidence stays the probability among all tokens, as in
   the references); the reference path (no cache, fixed quota) is untouched. A model that never
   predicts MASK (trained checkpoints) decodes as the references do.
"""

from __future__ import annotations

import math

import torch

from dare.models import facts, read_at, token_logits
import dare.rollout.core as rollout_core
from dare.rollout.core import (RolloutOutput, StepForward, any_left, any_rank, canvas, commit_rule,
                               compiles, num_transfer_tokens, predict, response_mask, sharded)
from dare.utils import UserError


def _guided_logits(model, x, attention_mask, prompt_positions, mask_id: int, cfg_scale: float, at: slice):
    """The logits of positions `at` (the block being decoded): the head runs on those positions only."""
    if cfg_scale <= 0:
        return token_logits(model, x, attention_mask, at=at)
    # Unsupervised classifier-free guidance: the unconditional pass sees the prompt masked.
    uncond = torch.where(prompt_positions, torch.full_like(x, mask_id), x)
    both = token_logits(model, torch.cat([x, uncond]), torch.cat([attention_mask, attention_mask]), at=at)
    cond, un = both.chunk(2)
    return un + (cfg_scale + 1) * (cond - un)


def ass_plan(gen_length: int, steps: int, n_blocks: int) -> list[tuple[int, list[int], list[int]]]:
    """CJ-GRPO's ascending schedule: [(block size, its global step indices, tokens each commits)].
    One block of 10 in 3 steps: [(10, [0, 1, 2], [1, 2, 7])]; 19 in 4 steps and 3 blocks:
    [(3, [0, 1], [1, 2]), (4, [2], [4]), (12, [3], [12])]."""
    S = gen_length.bit_length() - 1  # floor(log2 gen_length) = steps (checked by DecodingConfig)
    if n_blocks == 1:
        return [(gen_length, list(range(S)), [2 ** i for i in range(S - 1)] + [gen_length - 2 ** (S - 1) + 1])]
    last = 2 ** (S - 1) + 1 + gen_length - 2 ** S
    middle = [(2 ** p, [p], [2 ** p]) for p in range(S - n_blocks + 1, S - 1)]
    first = 2 ** (S - n_blocks + 1) - 1
    return [(first, list(range(S - n_blocks + 1)), [2 ** i for i in range(S - n_blocks + 1)]), *middle,
            (last, [S - 1], [last])]


def eos_gamma(decoding, local_step: int, global_step: int) -> float:
    """EOSER's factor on an EOS prediction's confidence at a step (1 when off): linear in the step
    index inside the block over the total step count (even schedule), (2^(s+1) - 1) / 2^S of the
    global step s (ascending schedule); the maximum when there is one step."""
    o = decoding.masked
    lo, hi, S = o.eos_gamma_min, o.eos_gamma_max, decoding.steps
    if (lo, hi) == (1.0, 1.0) or S <= 1:
        return hi
    if o.schedule == "ass":
        return lo + (hi - lo) * (2 ** (global_step + 1) - 1) / 2 ** S
    return lo + (hi - lo) * min(max(local_step, 0), S - 1) / (S - 1)


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor | None, prompt_mask: torch.Tensor | None, decoding,
             generator: torch.Generator | None = None, start: RolloutOutput | None = None,
             until: int | None = None, fixed: torch.Tensor | None = None) -> RolloutOutput:
    """Decode [prompt | MASK * gen_length]; or, with `start` (a partial output of this sampler with the
    same decoding settings, `steps_done` steps in), continue its canvas from the next step: the
    rollout engine's branching (`dare.rollout.tree`). `until` stops after that many steps in all
    (the output's `steps_done`); None: no cap, every block is decoded until it is clean (with a parallel
    rule the step count is not `decoding.steps`). Continuing follows the fixed schedule: no cache, no
    parallel rule.

    `fixed` (B, gen_length) long, inpainting (IGPO's hints): a token id where the completion is given, -1 where
    it is decoded. Given tokens stand in the canvas from the start, are never masked, scored or committed
    (step map -1), and each block's quota is split over the positions still masked in that row (LLaDA's
    `get_num_transfer_tokens` on the block's masked count, per row, as facebookresearch/igpo
    `generate_inpainting` counts it). The fixed schedule only: no cache, no parallel rule, no tree."""
    f, o = facts(model), decoding.masked  # o: this sampler's options (`dare.decoding.masked`)
    if (start is not None or until is not None) and (o.cache in ("prefix", "dual") or o.threshold > 0
                                                     or o.factor > 0):
        raise UserError("decoding: a rollout that stops or continues mid-way (tree rollouts) follows the fixed "
                        "schedule: cache none, no threshold or factor")
    if fixed is not None and (o.cache in ("prefix", "dual") or o.threshold > 0 or o.factor > 0 or start is not None
                              or o.schedule == "ass"):
        raise UserError("decoding: inpainting (given tokens) follows the fixed even schedule: cache none, no "
                        "threshold or factor, no ascending schedule, no continued canvas")
    G = decoding.gen_length
    if o.schedule == "ass":
        plan = ass_plan(G, decoding.steps, o.ass_blocks)
    else:
        BL = decoding.block_length
        n_blocks = G // BL
        if G % BL or decoding.steps % n_blocks:
            raise UserError(f"decoding: gen_length ({G}) must be a multiple of block_length ({BL}) and steps "
                            f"({decoding.steps}) a multiple of the number of blocks ({n_blocks}) for the masked "
                            "sampler")
        spb = decoding.steps // n_blocks
        even = num_transfer_tokens(torch.tensor([BL]), spb)[0].tolist()
        plan = [(BL, list(range(b * spb, (b + 1) * spb)), even) for b in range(n_blocks)]
    mask_id, shift = f.mask_token_id, f.logits_shift
    collective = sharded(model)  # FSDP: every rank makes the same forwards
    # The host looks at the canvas (a sync) every step only for rollouts that stop or continue mid-way (tree
    # rollouts count their steps); otherwise once per block with the fixed schedule, every LOOK_EVERY steps
    # with a rule that runs until the block is clean. Counters of the steps that had work stay on the device.
    per_step = start is not None or until is not None

    if start is None:
        x, attention_mask, prompt_ids, prompt_mask = canvas(model, prompt_ids, prompt_mask, G, mask_id)
        (B, P), device = prompt_ids.shape, x.device
        if fixed is not None:
            if tuple(fixed.shape) != (B, G):
                raise UserError(f"inpainting: the given tokens have shape {tuple(fixed.shape)}; the rollout is "
                                f"({B}, {G}): one row a prompt, one column a generated position (-1 where decoded)")
            fixed = fixed.to(device)
            x[:, P:] = torch.where(fixed >= 0, fixed, x[:, P:])
        step_map = torch.full((B, G), -1, dtype=torch.long, device=device)
        commit_logps = torch.zeros((B, G), dtype=torch.float32, device=device)
        trajectory, nfe, made = [], 0, 0
    else:
        x, attention_mask, step_map = start.sequences.clone(), start.attention_mask, start.step_map.clone()
        commit_logps = (start.commit_logps.clone() if start.commit_logps is not None
                        else torch.zeros((x.shape[0], G), dtype=torch.float32, device=x.device))
        (B, P), device = (x.shape[0], start.prompt_length), x.device
        trajectory = list(start.trajectory.unbind(1)) if start.trajectory is not None else []
        nfe, made = start.nfe, start.steps_done
    entropies = torch.zeros((B, G), dtype=torch.float32, device=device) if "entropies" in decoding.record else None
    greedy, greedy_kept = [], []  # with record greedy: the argmax completion before every step, and which counted
    first, until = made, math.inf if until is None else until
    step = torch.tensor(made, device=device)  # the steps that had work (the step map's numbers)
    idle = torch.zeros((), dtype=torch.long, device=device)  # step forwards run after their block was clean
    kept = [torch.ones((), dtype=torch.bool, device=device)] * len(trajectory)  # which trajectory entries count
    prompt_positions = torch.zeros_like(x, dtype=torch.bool)
    prompt_positions[:, :P] = True
    until_clean = o.cache in ("prefix", "dual") or o.threshold > 0 or o.factor > 0

    def commit(lo: int, hi: int, logits: torch.Tensor, quota: torch.Tensor, kmax: int, span: tuple[int, int],
               gamma: float, live: torch.Tensor) -> None:
        """Commit in x[:, lo:hi] from the block's logits; the positions are ranked over x[:, span]
        with -inf outside the block, the row the reference ranks (its choice among ties). `live`: whether
        any row had a masked position in the block before the step (else the step commits nothing and is
        not counted). No host sync."""
        block = x[:, lo:hi]
        masked = block == mask_id
        x0, conf = predict(logits, masked, decoding, generator, f.eos_token_id, f.eot_token_id,
                           forbid=mask_id if until_clean else None)
        if gamma != 1.0:  # EOSER
            conf = torch.where(masked & (x0 == f.eos_token_id), conf * gamma, conf)
        row = torch.full((B, span[1] - span[0]), -torch.inf, dtype=conf.dtype, device=device)
        row[:, lo - span[0]:hi - span[0]] = conf
        chosen = commit_rule(row, decoding, quota, kmax)[:, lo - span[0]:hi - span[0]]
        x[:, lo:hi] = torch.where(chosen, x0, block)
        steps_here = step_map[:, lo - P:hi - P]
        steps_here.copy_(torch.where(chosen, step, steps_here))
        logps = logits.float().gather(-1, x0[..., None]).squeeze(-1) - logits.float().logsumexp(dim=-1)
        logps_here = commit_logps[:, lo - P:hi - P]
        logps_here.copy_(torch.where(chosen, logps, logps_here))
        if entropies is not None:
            lp = logits.float().log_softmax(dim=-1)
            ent_here = entropies[:, lo - P:hi - P]
            ent_here.copy_(torch.where(chosen, -(lp.exp() * lp).sum(dim=-1), ent_here))
        step.add_(live.long())
        if "states" in decoding.record:
            trajectory.append(x[:, P:].clone())
            kept.append(live)

    def left(lo: int, hi: int) -> torch.Tensor:
        return any_left((x[:, lo:hi] == mask_id).any(), collective)

    run = StepForward(model, compiles(decoding, device, static=o.cache == "dual"))  # the cached step, captured or eager
    cache = where = None
    lo = P
    for size, steps, counts in plan:
        hi, n = lo + size, len(counts)
        quota = torch.tensor(counts, device=device).expand(B, n)
        if fixed is not None:  # per row: the block's positions not given, split over its steps
            quota = num_transfer_tokens((x[:, lo:hi] == mask_id).sum(dim=1), n)
            counts = quota.max(dim=0).values.tolist()  # the per-step bound on the host (one read per block)
        gamma = [eos_gamma(decoding, i, steps[i]) for i in range(n)]
        parallel = o.threshold > 0 or o.factor > 0
        i = sum(g < first for g in steps)  # steps of this block a continued canvas has already made
        if o.cache not in ("prefix", "dual"):  # "auto" / "none": the reference, no cache
            while (parallel or i < n) and made < until:
                if (per_step or parallel) and not any_rank((x[:, lo:hi] == mask_id).any(), device, collective):
                    break
                burst = 1 if per_step else rollout_core.LOOK_EVERY if parallel else n - i
                for _ in range(burst):
                    live = left(lo, hi)
                    wide = "greedy" in decoding.record  # the whole completion's logits: its argmax completion
                    logits = _guided_logits(model, x, attention_mask, prompt_positions, mask_id, o.cfg_scale,
                                            slice(P, P + G) if wide else slice(lo, hi))
                    if wide:
                        greedy.append(torch.where(x[:, P:] == mask_id, logits.argmax(dim=-1), x[:, P:]))
                        greedy_kept.append(live)
                        logits = logits[:, lo - P:hi - P]
                    nfe += 1
                    idle += (~live).long()
                    j = min(i, n - 1)
                    commit(lo, hi, logits, quota[:, j], counts[j], (0, P + G), gamma[j], live)
                    i += 1
                    made += 1  # exact where the host looks every step (per_step), which is where `until` applies
            lo = hi
            continue
        # Fast-dLLM: a full forward fills the cache and makes the block's first commit
        if cache is None:
            cache, where = run.cache(P + G, B), torch.zeros((), dtype=torch.long, device=device)
        cache.truncate(0)
        live = left(lo, hi)
        out = model(x, attention_mask, past_key_values=cache, use_cache=True, logits_at=read_at(model, slice(lo, hi)))
        nfe += 1
        commit(lo, hi, out.logits, quota[:, 0], counts[0], (0, P + G), gamma[0], live)
        del out
        i = 1
        start = lo - 1 if shift else lo  # a shifted model reads position s's logit at s - 1
        if o.cache == "prefix":
            cache.truncate(start)
        else:
            where.fill_(start)  # the dual cache's window, a device scalar: one captured step for every block
        end = P + G if o.further_horizon is None else min(hi + o.further_horizon, P + G)  # the prefix window
        todo = 0 if parallel else n - 1  # the fixed schedule cleans the block in its n steps
        while True:
            if todo <= 0:
                if not any_rank((x[:, lo:hi] == mask_id).any(), device, collective):
                    break
                todo = rollout_core.LOOK_EVERY
            live = left(lo, hi)
            if o.cache == "prefix":
                raw = run(x[:, start:end], attention_mask[:, start:end], cache)
            else:
                raw = run(x[:, start:hi], attention_mask[:, start:hi], cache, where)
            nfe += 1
            idle += (~live).long()
            j = min(i, n - 1)
            commit(lo, hi, raw[:, :size], quota[:, j], counts[j],
                   (lo, end) if o.cache == "prefix" else (lo, hi), gamma[j], live)
            del raw
            i += 1
            todo -= 1
        lo = hi

    steps_done, unused = torch.stack([step, idle]).tolist()  # the one look at the counters
    if "states" in decoding.record and trajectory:
        trajectory = [t for t, k in zip(trajectory, torch.stack(kept).tolist()) if k]
    if greedy:
        greedy = [g for g, k in zip(greedy, torch.stack(greedy_kept).tolist()) if k]
    responses = x[:, P:]
    return RolloutOutput(sequences=x, attention_mask=attention_mask, prompt_length=P,
                         response_mask=response_mask(responses, f.stop_ids), step_map=step_map, nfe=nfe - unused,
                         sampler="masked", trajectory=torch.stack(trajectory, dim=1) if trajectory else None,
                         commit_logps=commit_logps, steps_done=steps_done,
                         given=None if fixed is None else fixed >= 0, entropies=entropies,
                         greedy=torch.stack(greedy, dim=1) if greedy else None)
