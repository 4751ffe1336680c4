"""Log-likelihood estimators of masked diffusion LMs, and a cross-entropy that never
materializes full-vocabulary logits.

- `masked_logps(model, x_masked, targets, where, chunk, pack)`: log p(target_i | x_masked) at the
  positions `where`, from the model's hidden states and its output head, `chunk` positions at a
  time (peak memory ~ chunk x vocab instead of B x L x vocab), optionally packing the rows
  without their padding. Shift-aligned for every family.
- `diffusion_logps(model, x_noisy, clean, where, ...)`: `masked_logps` or, for block-causal models,
  `block_diffusion_logps`: what every estimator below calls, so each works on every family.
- `diffusion_hidden(model, x_noisy, clean)`: the hidden states those log-probs are read from (a
  value head reads them too).
- `completion_logps(model, batch, masked)`: the same at every completion position of an RL batch.
- `trajectory_logps(model, batch, rounds)`: the same along the rollout's own decoding trajectory:
  each completion token scored in the state just before the round that committed it (`rounds` from
  `noise.trace_rounds`; one forward per round, all blocks of a round at once): TraceRL, CJ-GRPO.
  `per_round(score, batch, rounds)` runs any per-position score (a value head) the same way.
- `ar_prefix_logps(model, batch)`: the autoregressive-order likelihood, each completion token scored
  with the tokens before it clean and itself and every later token masked (JustGRPO): one forward per
  position for bidirectional models, one per in-block offset for block-causal ones (all blocks at once).
- `block_diffusion_logps(model, x_noisy, clean, where)`: the same for block-diffusion models
  (SDAR, LLaDA2.x) through their `[noisy ; clean]` training layout, in one forward.
- `elbo(model, ids, attention_mask, maskable, draws, normalize, compute)`: the Monte Carlo
  ELBO of the maskable tokens given the rest (LLaDA/MDLM, linear schedule) on draws from
  `noise.elbo_draws` (count weighting: l masked of L, weight L / l; time weighting: i.i.d. at
  t, weight 1 / t). Block-causal models: the same draws through the block layout, a bound on
  sum_b log p(block b | earlier blocks) (each block's term is an ELBO; sharing t across a row's
  blocks keeps each term's expectation). `normalize="none"` returns the sum over tokens (a log-likelihood bound), "valid" divides by
  the number of maskable tokens of each row, "padded" by the padded length; the choice is
  explicit because the reference repos normalize by the padded length by accident.
- `sequence_elbo(model, ids, start, n, generator)`: the ELBO of log p(ids[start:] | ids[:start]) for
  one sequence, its n masks in one batch (count weighting). Block models (SDAR, LLaDA2.x) factor
  over blocks: each block gets its own count and weight and sees the clean blocks before it.
  OpenCompass' likelihood scoring (`get_ppl`) uses it.
- `draw_logps(model, batch, masked)`: per-draw log-probs of the completion tokens an RL batch's n draws
  mask, in one forward over the B x n rows (SPG's m Monte Carlo samples).
- `token_mean_elbo(logps, scored)`, `eubo_terms(logps, scored, weight, beta)`, `renyi_eubo(...)`: SPG's
  bounds from those log-probs: the ELBO as its code averages it (each draw's mean over its masked tokens,
  i.e. 1/t weighting divided by the length), and the Renyi evidence upper bound of order beta,
  (1/beta) log E[w 1[masked] pi^beta] per token, computed in log space (logsumexp over the draws), so it
  never under- or overflows (the reference's fp32 p^beta does: `facebookresearch/SPG` issues #2, #5).
- `spread(estimate, draws)`: the mean and standard deviation of any per-sequence estimate over independent
  noise draws (its variance, which decides whether an ELBO method learns; `dare bench estimators`).
(A loss over several Monte Carlo draws is backpropagated one draw at a time, memory-bounded, by the
recipes' `replayed_loss`: `dare.train.batches.backward_by_parts`.)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from dare.models import facts, output_head, token_hidden, token_logits
from dare.rollout.core import max_rank, sharded
from dare.train import noise
from dare.train.packing import pack_padded, unpack_padded


@dataclass(frozen=True)
class Compute:
    """How a log-prob pass is computed, never what it computes (trainer options `train.packing`,
    `train.logit_chunk`): `pack` drops padding and packs the rows into one sequence list
    (`cu_seqlens`) when that removes at least `min_padding` of the positions (without flash-attn
    the packed path attends sequence by sequence, which costs more than a little padding); `chunk`
    positions go through the output head at a time (0: full logits); `fused` lets a plain linear head
    recompute its logits in backward (`head_logps`) instead of keeping them."""

    pack: bool = False
    chunk: int = 1024
    min_padding: float = 0.25
    fused: bool = True


def masked_logps(model, x_masked: torch.Tensor, targets: torch.Tensor, where: torch.Tensor,
                 attention_mask: torch.Tensor | None = None, chunk: int = 1024,
                 cu_seqlens: torch.Tensor | None = None, pack: bool = False, min_padding: float = 0.0,
                 compute: Compute | None = None, temperature: float = 1.0,
                 support: torch.Tensor | None = None, fused: bool = True) -> torch.Tensor:
    """(B, L) log p(targets | x_masked) at `where` (0 elsewhere), in float32, from the logits divided
    by `temperature` (MDPO scores its rollouts' tempered distribution) and, with `support` (N, V) bool,
    one row per scored position in row-major order (`where.nonzero()`), renormalized over the tokens it
    keeps: the top-k/top-p distribution a truncating sampler drew from (AGRPO).

    chunk > 0: the cross-entropy is taken from hidden states `chunk` positions at a time (`head_logps`;
    `fused`: recomputed in backward where the head allows), so the (B, L, V) logits never exist; chunk = 0:
    full logits (the naive path, for comparison).
    pack: padded rows (attention_mask 0) are packed without their pads into one row with
    `cu_seqlens` first (when at least `min_padding` of the positions are padding); a packed row
    (1, total) with `cu_seqlens` can also be given directly. `compute` (a batch's trainer options)
    sets chunk, pack, min_padding and fused at once."""
    if compute is not None:
        chunk, pack, min_padding, fused = compute.chunk, compute.pack, compute.min_padding, compute.fused
    if (pack and attention_mask is not None and cu_seqlens is None
            and 1 - attention_mask.float().mean().item() >= max(min_padding, 1e-9)):
        cu, x, y, scored = pack_padded(attention_mask, x_masked, targets, where)
        packed = masked_logps(model, x, y, scored, None, chunk, cu, temperature=temperature,
                              support=support, fused=fused)  # packing keeps the row-major order
        return unpack_padded(packed, attention_mask)
    if chunk == 0:
        logits = token_logits(model, x_masked, attention_mask, cu_seqlens=cu_seqlens).float() / temperature  # (B, L, V)
        if support is not None:
            kept = torch.ones_like(logits, dtype=torch.bool)
            kept[where] = support
            logits = logits.masked_fill(~kept, -torch.inf)
        logps = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return torch.where(where, logps, 0.0)
    hidden = token_hidden(model, x_masked, attention_mask, cu_seqlens=cu_seqlens)  # (B, L, H), aligned
    return scored_logps(model, hidden, targets, where, chunk, temperature, support, fused)


def scored_logps(model, hidden: torch.Tensor, targets: torch.Tensor, where: torch.Tensor, chunk: int,
                 temperature: float = 1.0, support: torch.Tensor | None = None, fused: bool = True) -> torch.Tensor:
    """(B, L) float32 log p(targets | hidden) at `where` (0 elsewhere) through the model's output head, from
    hidden (B, L, H): the scored positions in row-major order, `chunk` at a time (`head_logps`)."""
    out = torch.zeros(where.shape, dtype=torch.float32, device=where.device)
    rows, cols = where.nonzero(as_tuple=True)
    out[rows, cols] = head_logps(model, hidden[rows, cols], targets[rows, cols], chunk, temperature, support, fused)
    return out


def head_logps(model, hidden: torch.Tensor, targets: torch.Tensor, chunk: int, temperature: float = 1.0,
               support: torch.Tensor | None = None, fused: bool = True) -> torch.Tensor:
    """(N,) float32 log p(targets | hidden) of N hidden states (N, H) through the model's output head, `chunk`
    rows at a time (`head_chunks`), from the logits divided by `temperature` and, with `support` (N, V) bool,
    set to -inf outside it. Where the head is a plain linear map on one process (`linear_head`) and `fused`,
    `LinearLogps` keeps only the hidden states and one logsumexp per row for backward and recomputes each
    chunk's logits there: the loss's memory no longer grows with the vocabulary beyond one chunk (on CUDA with
    liger-kernel installed, no support and a temperature it can fold in exactly, liger's fused kernel instead:
    `liger_logps`, its own chunk size). Elsewhere
    (a sharded head under FSDP, whose forward hooks gather it and must pair up across processes; a LoRA-wrapped
    head; `fused=False`) each chunk goes through the head module and autograd keeps its float32 log-softmax."""
    spans = head_chunks(model, len(targets), chunk, hidden.device)
    linear = linear_head(model) if fused else None
    if linear is not None and support is None and hidden.is_cuda and liger_logps() and _power_of_two(temperature):
        return liger_logps()(hidden, targets, *linear, temperature)
    if linear is not None:
        return LinearLogps.apply(hidden, targets, *linear, temperature, support, spans)
    head = output_head(model)
    return torch.cat([tempered(head(hidden[s]), temperature, None if support is None else support[s])
                      .log_softmax(-1).gather(-1, targets[s, None])[:, 0] for s in spans])


def position_logits(model, ids: torch.Tensor, attention_mask: torch.Tensor | None, at: torch.Tensor) -> torch.Tensor:
    """(N, K, V) float32 logits at positions `at` (N, K) of N inputs `ids` (N, L): the output head runs on those
    positions' hidden states only (the (N, L, V) logits never exist). d-OPSD's distributions at a block."""
    hidden = token_hidden(model, ids, attention_mask)
    picked = hidden.gather(1, at[..., None].expand(-1, -1, hidden.shape[-1]))
    return output_head(model)(picked).float()


@torch.no_grad()
def head_entropies(model, hidden: torch.Tensor, chunk: int) -> torch.Tensor:
    """(N,) float32 entropies of the model's predicted distributions at N hidden states (N, H), through its output
    head `chunk` rows at a time (`head_chunks`), without a graph. IGPO's entropy filter."""
    head = output_head(model)
    parts = [head(hidden[s]).float().log_softmax(-1) for s in head_chunks(model, len(hidden), chunk, hidden.device)]
    return torch.cat([-(lp.exp() * lp).sum(-1) for lp in parts])


def tempered(logits: torch.Tensor, temperature: float, support: torch.Tensor | None) -> torch.Tensor:
    """float32 logits / temperature, -inf outside `support` (bool, the logits' shape) when given."""
    logits = logits.float() / temperature
    return logits if support is None else logits.masked_fill(~support, -torch.inf)


def linear_head(model) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight (V, H), bias (V,) or None) when the model's output head is exactly `F.linear(hidden, weight, bias)`
    on this process: an `nn.Linear` or a tied input embedding (`output_head` then casts at most to float32, which
    `LinearLogps` does anyway); None under FSDP (`sharded`: the head's weight is gathered by its module's hooks,
    which `LinearLogps` would bypass), for a head with forward hooks (they may change its logits) and for any
    other head (a LoRA-wrapped one)."""
    head = getattr(model, "module", model).get_output_embeddings()
    if (sharded(model) or type(head) not in (torch.nn.Linear, torch.nn.Embedding) or head._forward_hooks
            or head._forward_pre_hooks):
        return None
    return head.weight, getattr(head, "bias", None)


class LinearLogps(torch.autograd.Function):
    """log_softmax(tempered(hidden @ weight.T + bias))[targets] per row, chunk by chunk, with no (rows x V) tensor
    kept for backward: forward saves hidden, targets, the support and each row's logsumexp (O(rows)); backward
    recomputes each chunk's logits and forms d/dlogits = (onehot - softmax) x grad / temperature, then the
    gradients of hidden, weight and bias (weight and bias only when they require grad: a frozen head under LoRA).
    The matmuls run in autocast's dtype when autocast is on (as `head(hidden)` would), in the weight's otherwise;
    the softmax, the logsumexp and the weight's gradient are accumulated in float32."""

    @staticmethod
    def forward(ctx, hidden, targets, weight, bias, temperature, support, spans):
        dtype = _compute_dtype(hidden, weight)
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        out = torch.empty(len(targets), dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in spans:
                logits = tempered(F.linear(hidden[s].to(dtype), w, b), temperature,
                                  None if support is None else support[s])
                lse[s] = logits.logsumexp(-1)
                out[s] = logits.gather(-1, targets[s, None])[:, 0] - lse[s]
        ctx.save_for_backward(hidden, targets, weight, bias, support, lse)
        ctx.temperature, ctx.spans, ctx.dtype = temperature, spans, dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, targets, weight, bias, support, lse = ctx.saved_tensors
        dtype, temperature = ctx.dtype, ctx.temperature
        want_h, _, want_w, want_b = ctx.needs_input_grad[:4]
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        grad_h = torch.zeros_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None
        with torch.autocast(hidden.device.type, enabled=False):
            for s in ctx.spans:
                h = hidden[s].to(dtype)
                logits = tempered(F.linear(h, w, b), temperature, None if support is None else support[s])
                g = logits.sub_(lse[s, None]).exp_().neg_()  # -softmax, in place (0 outside the support)
                g[torch.arange(len(g), device=g.device), targets[s]] += 1
                g.mul_(grad[s, None] / temperature)  # d loss / d (hidden @ weight.T + bias), float32
                if want_h:
                    grad_h[s] = (g.to(dtype) @ w).to(hidden.dtype)
                if want_w:
                    grad_w += g.to(dtype).T @ h
                if want_b:
                    grad_b += g.sum(0)
        return (grad_h, None, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None)


@functools.cache
def liger_logps():
    """`f(hidden, targets, weight, bias, temperature) -> (N,) log-probs` through liger-kernel's fused linear
    cross-entropy (the optional `gpu` extra, CUDA), or None where it is not installed or is a version whose per-token
    (`reduction="none"`) backward scales the summed weight gradient instead of each token's (wrong for any loss that
    weights tokens unequally; 0.8.5 has the right one, detected by its `token_grad_output` argument). The temperature is
    folded into the hidden states and the bias, exact for powers of two only (the caller checks)."""
    try:
        import inspect

        from liger_kernel.ops import fused_linear_cross_entropy as ops
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except Exception:  # not installed, or no triton: the recompute path serves
        return None
    if "token_grad_output" not in inspect.signature(ops.fused_linear_cross_entropy_forward).parameters:
        return None

    def logps(hidden, targets, weight, bias, temperature):
        if temperature != 1.0:
            hidden, bias = hidden / temperature, None if bias is None else bias / temperature
        return -liger_fused_linear_cross_entropy(hidden, weight, targets, bias, reduction="none")
    return logps


def _power_of_two(x: float) -> bool:
    """x = 2^k: dividing by it is exact in floating point (barring underflow)."""
    return x > 0 and math.frexp(x)[0] == 0.5


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype `F.linear(hidden, weight)` computes in here: autocast's where it is on, the weight's otherwise."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def head_chunks(model, n: int, chunk: int, device) -> list[slice]:
    """The slices of a chunked output-head pass over n scored positions, `chunk` at a time (0: all at once),
    at least one: n = 0 makes one call over no position, so every path returns an empty (0,) result whose graph
    runs through the head (a zero gradient) instead of concatenating nothing. Under FSDP (a sharded model)
    every process makes as many head calls as the process with the most (one all-reduce), the extra calls over
    no position: the head's all-gathers and reduce-scatters then pair up across processes, and a process that
    scores nothing still has a loss whose graph runs through the whole model, so it backpropagates with the
    others."""
    step = chunk if chunk > 0 else max(1, n)
    count = max(1, -(-n // step))
    if sharded(model):
        count = max(1, max_rank(count, device, True))
    return [slice(i * step, (i + 1) * step) for i in range(count)]


def diffusion_logps(model, x_noisy: torch.Tensor, clean: torch.Tensor, where: torch.Tensor,
                    attention_mask: torch.Tensor | None = None, compute: Compute | None = None,
                    temperature: float = 1.0, support: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L) log p(clean_i | x_noisy) at `where`, as the model factorizes it: one forward on
    `x_noisy` for bidirectional models (`masked_logps`); for block-causal models (SDAR, LLaDA2.x)
    the block-diffusion layout `[x_noisy ; clean]` (`block_diffusion_logps`), where each block's
    noisy tokens are predicted from that block of `x_noisy` and the clean blocks before it, blocks
    counted from each row's first real token (as the block sampler counts them)."""
    if facts(model).attention == "block_causal":
        if temperature != 1.0 or support is not None:
            raise ValueError("tempered or truncated log-probs (temperature != 1, a support) are implemented for "
                             "bidirectional models only")
        compute = compute or Compute()
        return block_diffusion_logps(model, x_noisy, clean, where, attention_mask, compute.chunk, compute.fused)
    return masked_logps(model, x_noisy, clean, where, attention_mask, compute=compute, temperature=temperature,
                        support=support)


def diffusion_hidden(model, x_noisy: torch.Tensor, clean: torch.Tensor,
                     attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L, H) the final hidden states that predict each token of `x_noisy`, as `diffusion_logps`
    reads them: aligned like `token_logits` for bidirectional models; for block-causal models the
    noisy half of the `[x_noisy ; clean]` layout (each block sees itself and the clean blocks before
    it). A head on them (the output head, or a value head: `dare.train.critic`) scores each token."""
    if facts(model).attention == "block_causal":
        return model(input_ids=torch.cat([x_noisy, clean], dim=1), attention_mask=attention_mask,
                     block_diffusion=True, output_logits=False).last_hidden_state
    return token_hidden(model, x_noisy, attention_mask)


def completion_logps(model, batch, masked: torch.Tensor) -> torch.Tensor:
    """(B, G) log p(completion token | the sequence with the `masked` positions masked) at every
    completion position of an RL batch (`sequences`, `attention_mask`, `prompt_length`, `compute`):
    the one-step estimates of d1 and wd1 and the passes of coupled-GRPO's pair. Block-causal
    models score each block given the clean blocks before it (`diffusion_logps`)."""
    x = torch.where(masked, facts(model).mask_token_id, batch.sequences)
    scored = noise.completion(batch.attention_mask, batch.prompt_length)
    logps = diffusion_logps(model, x, batch.sequences, scored, batch.attention_mask, compute=batch.compute)
    return logps[:, batch.prompt_length:]


def per_round(score, batch, rounds: torch.Tensor, n_rounds: int | None = None, targets: torch.Tensor | None = None,
              collective: bool = False) -> torch.Tensor:
    """(B, G) `score(where, masked)` at the scored completion tokens (0 elsewhere), one call per round r:
    `masked` the positions of round >= r (the trajectory state before round r: earlier rounds clean),
    `where` the scored positions of round r. `rounds` (B, P + G): -1 on the prompt, `noise.NEVER` where
    nothing was committed. `targets` (B, G) bool: the positions scored (default: every committed one); a
    round with none is not run. `n_rounds` fixes the rounds to 0 .. n_rounds - 1 (a bound known from
    shapes). `collective` (a sharded model's forwards): every process makes as many calls as the process
    with the most (one all-reduce), the extra ones scoring nothing, so the forwards pair up under FSDP."""
    P = batch.prompt_length
    scored = rounds[:, P:]
    on = scored < noise.NEVER
    if targets is not None:
        on = on & targets
    out = torch.zeros(scored.shape, dtype=torch.float32, device=scored.device)
    order = list(range(n_rounds)) if n_rounds is not None else torch.unique(scored[on]).tolist()
    for i in range(max_rank(len(order), scored.device, collective)):
        r = order[i] if i < len(order) else noise.NEVER + 1  # past a process's own rounds: nothing scored
        where = rounds == r
        if targets is not None:
            where[:, P:] &= targets
        out = out + score(where, rounds >= r)[:, P:]
    return out


def check_replayable(decoding, who: str) -> None:
    """Raise ValueError when `decoding` (a `DecodingConfig`) breaks what `trajectory_logps` assumes of the step map,
    that each token is committed once: token editing rewrites committed tokens, and b1's dynamic blocks re-mask
    tokens the model had seen. `who` names the baseline that replays the rollout (its `check_config`)."""
    if decoding.block.editing_threshold > 0:
        raise ValueError("rl.decoding.block.editing_threshold > 0: token editing rewrites committed tokens, so the "
                         f"step map no longer gives the states the sampler saw; {who} needs each token committed once")
    if decoding.block.dynamic:
        raise ValueError("rl.decoding.block.dynamic: a dynamic block cut at its marker re-masks tokens the model had "
                         f"seen, which the step map does not keep: {who} replays those states (docs/training.md, b1)")


def check_masked_schedule(cfg, who: str, cache: bool = True) -> None:
    """Raise ValueError unless `cfg`'s rollout is the masked sampler (LLaDA, Dream) on its fixed even schedule: no
    threshold or factor, no ascending schedule, no tree, and, with `cache` False, no KV cache either. What an
    algorithm that inpaints (IGPO) or replays (EGSPO, d-OPSD) the sampler's steps assumes (its `check_config`)."""
    from dare.decoding import resolve

    d = cfg.rl.decoding
    if resolve(d.sampler, cfg.model.family) != "masked":
        raise ValueError(f"{who} works on the masked sampler's decoding; model.family={cfg.model.family} with "
                         f"rl.decoding.sampler={d.sampler} decodes with another")
    o = d.masked
    if o.threshold or o.factor or o.schedule == "ass" or d.tree or (not cache and o.cache in ("prefix", "dual")):
        raise ValueError(f"rl.decoding: {who} follows the masked sampler's fixed even schedule: no threshold or "
                         "factor, no ascending schedule, no tree" + ("" if cache else ", masked.cache none"))


def trajectory_logps(model, batch, rounds: torch.Tensor, temperature: float = 1.0,
                     n_rounds: int | None = None, targets: torch.Tensor | None = None,
                     canvas: bool = False, noised: torch.Tensor | None = None) -> torch.Tensor:
    """(B, G) log pi(o_k | the trajectory state before o_k's round): the rollout's own denoising
    transitions, replayed from its step map (each token is committed once, so the state before round
    r is the final completion with every token of round >= r masked), at `targets` (default: every
    committed token; `per_round`), 0 elsewhere. Collective under FSDP (`per_round`).
    `canvas`: each round's state in one plain forward with the model's own attention (`masked_logps`), not
    the block layout: the replay of a sampler whose windows cross the model's blocks (b1's dynamic blocks,
    with `rounds` over the row's steps, not per block), where a block sees the earlier ones as they were then.
    `noised` (B, P + G) bool: positions masked in every round as well (d2's prompt tokens, masked at random per
    update), never scored."""
    mask_id = facts(model).mask_token_id
    score = masked_logps if canvas else diffusion_logps
    return per_round(lambda where, masked: score(
        model, torch.where(masked if noised is None else masked | noised, mask_id, batch.sequences), batch.sequences,
        where, batch.attention_mask, compute=batch.compute, temperature=temperature),
        batch, rounds, n_rounds, targets, sharded(model))


def ar_prefix_logps(model, batch, temperature: float = 1.0) -> torch.Tensor:
    """(B, G) log pi(o_t | q, o_<t) at every completion position, after the first EOS too: the exact
    left-to-right factorization of the model's conditionals (JustGRPO). Bidirectional models: G forwards,
    the t-th on [q, o_<t, MASK ...]. Block-causal models: block-size forwards, the k-th scoring the k-th
    token of every block at once (each block sees its first k tokens and the clean blocks before it).
    `temperature` divides the logits (bidirectional models)."""
    return trajectory_logps(model, batch, noise.left_to_right_rounds(batch), temperature, ar_rounds(batch))


def ar_rounds(batch) -> int:
    """The number of AR-prefix rounds from shapes alone (the same on every process): the completion length on a
    masked model, at most a block's worth on a block model."""
    G = batch.sequences.shape[1] - batch.prompt_length
    return G if batch.block_size is None else min(G, batch.block_size)


def spread(estimate, draws: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """((B,) mean, (B,) standard deviation) of `estimate(generator) -> (B,)` over `draws` calls with independent
    generators (seeded seed, seed + 1, ...): an estimator's noise on a fixed batch (std 0 for one draw)."""
    values = torch.stack([estimate(torch.Generator().manual_seed(seed + k)) for k in range(draws)])
    return values.mean(dim=0), values.std(dim=0) if draws > 1 else torch.zeros_like(values[0])


def draw_logps(model, batch, masked: torch.Tensor) -> torch.Tensor:
    """(B, n, G) log p(completion token | the sequence with the n-th draw's positions masked) at the masked
    completion positions of an RL batch, 0 elsewhere; masked (B, n, P + G). One forward over B x n rows
    (block-causal models: through the `[x_t ; x_0]` layout, `diffusion_logps`)."""
    B, n, L = masked.shape
    P = batch.prompt_length
    ids = batch.sequences[:, None, :].expand(B, n, L).reshape(B * n, L)
    attention = batch.attention_mask[:, None, :].expand(B, n, L).reshape(B * n, L)
    flat = masked.reshape(B * n, L)
    where = flat & noise.completion(attention, P)
    x = torch.where(flat, facts(model).mask_token_id, ids)
    return diffusion_logps(model, x, ids, where, attention, compute=batch.compute).view(B, n, L)[:, :, P:]


def token_mean_elbo(logps: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """(B,) the mean over the n draws of each draw's mean log-prob over its scored tokens (SPG's ELBO as its
    code computes it; with t the draw's masked share of the L tokens this is (1/L) (1/t) sum log p).
    logps, scored: (B, n, G)."""
    per_draw = (logps * scored).sum(dim=2) / scored.sum(dim=2).clamp(min=1)
    return per_draw.mean(dim=1)


def eubo_terms(logps: torch.Tensor, scored: torch.Tensor, weight: torch.Tensor, beta: float) -> torch.Tensor:
    """(B, G) log of the Monte Carlo mean over the n draws of weight x 1[scored] x p^beta, per token, in log
    space: logsumexp_j(beta logp_ij + log weight_j) - log n; -inf where no draw scored the token.
    logps, scored: (B, n, G); weight (B, n): 1/t for i.i.d. masking at t (SPG: its empirical t)."""
    n = logps.shape[1]
    terms = torch.where(scored, beta * logps + weight.log()[..., None], -torch.inf)
    return torch.logsumexp(terms, dim=1) - math.log(n)


def renyi_eubo(logps: torch.Tensor, scored: torch.Tensor, weight: torch.Tensor, beta: float) -> torch.Tensor:
    """(B,) SPG's evidence upper bound per sequence: (1/beta) x the mean over the tokens scored by at least one
    draw of `eubo_terms` (its code averages over tokens rather than summing, as its ELBO)."""
    terms = eubo_terms(logps, scored, weight, beta)
    covered = scored.any(dim=1)
    total = torch.where(covered, terms, 0.0).sum(dim=1)
    return total / covered.sum(dim=1).clamp(min=1) / beta


def sandwiched_likelihood(logps: torch.Tensor, scored: torch.Tensor, t: torch.Tensor, advantages: torch.Tensor,
                          beta: float, omega: float, negative: str = "mix"
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SPG's sandwiched likelihood: ((B,) the score each completion is trained on, its ELBO, its EUBO): the ELBO
    (`token_mean_elbo`) where the advantage is positive, the negative bound elsewhere: `negative` = "mix",
    omega EUBO + (1 - omega) ELBO (`renyi_eubo` with the draws' 1/t weights), or "eubo", "elbo", "zero".
    logps, scored: (B, n, G); t: (B, n) each draw's masked share; advantages: (B,). SPG, StableDRL."""
    elbo = token_mean_elbo(logps, scored)
    eubo = renyi_eubo(logps, scored, 1.0 / t.clamp(min=1e-8), beta)
    bound = {"mix": lambda: omega * eubo + (1 - omega) * elbo, "eubo": lambda: eubo, "elbo": lambda: elbo,
             "zero": lambda: torch.zeros_like(elbo)}[negative]()
    return torch.where(advantages > 0, elbo, bound), elbo, eubo


def block_diffusion_logps(model, x_noisy: torch.Tensor, clean: torch.Tensor, where: torch.Tensor,
                          attention_mask: torch.Tensor | None = None, chunk: int = 1024,
                          fused: bool = True) -> torch.Tensor:
    """(B, L) log p(clean_i | ...) at `where` for block-diffusion models (SDAR, LLaDA2.x), through
    their training layout `[x_noisy ; clean]` in one forward: a noisy block attends to itself and
    to the clean blocks before it, clean tokens attend block-causally (`block_diffusion=True`
    in `dare.models`). Chunked over positions like `masked_logps` (`scored_logps`)."""
    return scored_logps(model, diffusion_hidden(model, x_noisy, clean, attention_mask), clean, where, chunk,
                        fused=fused)


def _normalizer(maskable, normalize):
    if normalize == "valid":
        return maskable.sum(dim=1).clamp(min=1).float()
    if normalize == "padded":
        return torch.full((maskable.shape[0],), float(maskable.shape[1]), device=maskable.device)
    if normalize != "none":
        raise ValueError(f"normalize={normalize!r}: expected 'none', 'valid' or 'padded'")
    return torch.ones(maskable.shape[0], device=maskable.device)


def _elbo_sample(model, ids, attention_mask, draws: noise.Draw, k: int, compute: Compute | None) -> torch.Tensor:
    """(B,) weight_k * sum over the k-th draw's masked positions of log p(ids_i | x_t)."""
    mask = draws.masked[:, k]
    x = torch.where(mask, torch.full_like(ids, facts(model).mask_token_id), ids)
    return draws.weight[:, k] * diffusion_logps(model, x, ids, mask, attention_mask, compute=compute).sum(dim=1)


def elbo_terms(model, ids: torch.Tensor, attention_mask: torch.Tensor | None, draws: noise.Draw,
               compute: Compute | None = None) -> torch.Tensor:
    """(B, n) each draw's weighted term, weight_k x sum of the masked tokens' log-probs (`elbo` is their mean
    over the draws); one forward per draw."""
    return torch.stack([_elbo_sample(model, ids, attention_mask, draws, k, compute)
                        for k in range(draws.masked.shape[1])], dim=1)


def elbo(model, ids: torch.Tensor, attention_mask: torch.Tensor | None, maskable: torch.Tensor,
         draws: noise.Draw, normalize: Literal["none", "valid", "padded"] = "none",
         compute: Compute | None = None) -> torch.Tensor:
    """(B,) the Monte Carlo ELBO of the maskable tokens on the given draws (`noise.elbo_draws`):
    the mean over the n draws of weight x the log-probs of the masked tokens, divided by the
    normalizer (module docstring). The same draws give the same estimate for any model, which
    is how a policy and its reference are compared on shared noise."""
    n = draws.masked.shape[1]
    total = sum(_elbo_sample(model, ids, attention_mask, draws, k, compute) for k in range(n))
    return total / n / _normalizer(maskable, normalize)


def sequence_elbo(model, ids: torch.Tensor, start: int, n: int, generator: torch.Generator) -> float:
    """ELBO of log p(ids[start:] | ids[:start]) for one unpadded sequence (module docstring). All
    blocks are drawn at once: per block a stratified count and a uniform subset of that size."""
    f, length = facts(model), ids.shape[0]
    blocked = f.attention == "block_causal"
    size = f.block_size if blocked else length  # masked models: the whole sequence is one region
    n_blocks = -(-length // size)
    pos = torch.arange(n_blocks * size).view(n_blocks, size)
    scored = (pos >= start) & (pos < length)  # (blocks, size)
    lengths = scored.sum(dim=1)  # (blocks,)
    counts = noise.stratified_counts(lengths, n, generator)  # (n, blocks); drawn on the CPU, the generator's
    scores = torch.rand((n, n_blocks, size), generator=generator)
    rank = torch.where(scored, scores, 2.0).argsort(dim=-1).argsort(dim=-1)
    mask = scored & (rank < counts[..., None])
    weight = mask * (lengths.float() / counts.float())[..., None]
    mask = mask.view(n, -1)[:, :length].to(ids.device)
    weight = weight.view(n, -1)[:, :length].to(ids.device)
    clean = ids.expand(n, length)
    x = torch.where(mask, torch.full_like(clean, f.mask_token_id), clean)
    if blocked:
        logps = block_diffusion_logps(model, x, clean, mask)
    else:
        logps = masked_logps(model, x, clean, mask)
    return float((logps * weight).sum(dim=1).mean())
