"""Noise (mask) samplers for likelihood estimation, every one drawing from an explicit
`torch.Generator` so that old, reference and current log-probs can be computed on the SAME draws
(the reference repos reseed the global RNG inside the loss, or draw new masks per pass).

Every sampler returns a bool mask (B, L): True where the token is replaced by MASK. `maskable`
(B, L) bool marks the positions that may be masked (usually the valid completion tokens).
"""

from __future__ import annotations

import torch


def full_completion(maskable: torch.Tensor, prompt: torch.Tensor, p_mask_prompt: float,
                    generator: torch.Generator) -> torch.Tensor:
    """d1 / diffu-GRPO: every completion token masked, each prompt token masked with probability
    `p_mask_prompt` (one-step mean-field estimate)."""
    u = torch.rand(maskable.shape, generator=generator, device=maskable.device)
    return maskable | (prompt & (u < p_mask_prompt))


def iid(maskable: torch.Tensor, t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """LLaDA's forward process: each maskable token masked independently with probability t (B,)."""
    u = torch.rand(maskable.shape, generator=generator, device=maskable.device)
    return maskable & (u < t[:, None])


def exact_count(maskable: torch.Tensor, counts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Exactly counts[b] maskable positions of row b masked, uniformly at random."""
    scores = torch.rand(maskable.shape, generator=generator, device=maskable.device)
    scores = torch.where(maskable, scores, torch.full_like(scores, 2.0))  # never pick non-maskable
    rank = scores.argsort(dim=1).argsort(dim=1)
    return maskable & (rank < counts[:, None])


def stratified_counts(lengths: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """(n, B) mask counts l in 1..L_b spread over the n draws: LLaDA's `get_log_likelihood`
    stratification, `linspace` over [1, L] offset by one random shift (VRPO, BGPO reuse it)."""
    shift = torch.rand((), generator=generator).item()
    grid = (torch.arange(n, dtype=torch.float64) + shift) / n  # stratified in [0, 1)
    counts = 1 + (grid[:, None] * lengths[None, :].double()).floor().long()
    return counts.clamp(max=lengths.clamp(min=1)[None, :])


def complementary(maskable: torch.Tensor, t: torch.Tensor, generator: torch.Generator):
    """coupled-GRPO: a mask at ratio t and its complement within the maskable tokens, so every
    maskable token is masked in exactly one of the pair. -> (mask, complement)"""
    first = iid(maskable, t, generator)
    return first, maskable & ~first


def block_wise(maskable: torch.Tensor, block: int, generator: torch.Generator) -> torch.Tensor:
    """SPG-style: one block of the completion (chosen per row) is noised at a random ratio, the
    blocks before it are clean and the blocks after it fully masked."""
    B, L = maskable.shape
    out = torch.zeros_like(maskable)
    for b in range(B):
        idx = maskable[b].nonzero().squeeze(1)
        if len(idx) == 0:
            continue
        n_blocks = -(-len(idx) // block)
        k = int(torch.randint(n_blocks, (1,), generator=generator))
        t = float(torch.rand((), generator=generator))
        inside = idx[k * block:(k + 1) * block]
        after = idx[(k + 1) * block:]
        u = torch.rand(len(inside), generator=generator)
        out[b, inside[u < t]] = True
        out[b, after] = True
    return out


def block_grid(maskable: torch.Tensor, block: int, generator: torch.Generator) -> torch.Tensor:
    """Block-wise noise on one grid for the whole batch: blocks of `block` positions counted from
    the first maskable column (the completion start, shared by every row of a rollout batch); one
    block index k and one ratio t are drawn for the batch; columns before block k are clean,
    block k is masked i.i.d. at t (maskable positions only), everything maskable after it is
    masked. Every row then shares the clean prefix, so the batch can reuse one prefix computation."""
    B, L = maskable.shape
    cols = maskable.any(dim=0).nonzero().squeeze(1)
    out = torch.zeros_like(maskable)
    if len(cols) == 0:
        return out
    start, width = int(cols[0]), int(cols[-1]) + 1 - int(cols[0])
    n_blocks = -(-width // block)
    k = int(torch.randint(n_blocks, (1,), generator=generator))
    t = float(torch.rand((), generator=generator))
    lo, hi = start + k * block, min(start + (k + 1) * block, L)
    u = torch.rand((B, hi - lo), generator=generator).to(maskable.device)
    out[:, lo:hi] = u < t
    out[:, hi:] = True
    return out & maskable


def from_trajectory(step_map: torch.Tensor, step: int) -> torch.Tensor:
    """CJ-GRPO trajectory replay: the state before `step` of a recorded rollout masks every
    position committed at `step` or later (step maps from `dare.rollout`)."""
    return step_map >= step


def ar_prefix(maskable: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """JustGRPO-style autoregressive prefix: maskable positions from index cut[b] on are masked."""
    positions = maskable.long().cumsum(dim=1) - 1
    return maskable & (positions >= cut[:, None])
