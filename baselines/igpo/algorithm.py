"""IGPO, Inpainting-Guided Policy Optimization (Zhao, Liang, Tang, Yao, Kallus, "Inpainting-Guided Policy
Optimization for Diffusion Large Language Models", arXiv:2509.10396; reference code `facebookresearch/igpo`
@e85eaea, `trainer_igpo.py`, `utils/generate.py`, `run_igpo.sh`).

GRPO learns nothing from a group whose completions all fail (every advantage is 0). IGPO then decodes the group
again with hints: chunks of the reference solution placed in the canvas as given tokens that the sampler never
masks (inpainting), each row revealing a share r ~ U[0.2, 0.6] of the chunks (sorted within the group; the last
chunk always), stretched over the completion. Up to 4 correct hinted completions replace the group's first slots,
so the group has a reward signal again. Training is d1's one-step estimate with the whole completion masked and
the prompt clean, under GSPO's sequence ratio; of the hint tokens only the 20% with the highest entropy under the
old policy are trained on (the model did not write them; the uncertain ones carry the signal), every other
token is.

    A_i   = r_i - mean_j r_j                                       (no std scaling)
    s_i   = exp(mean_k [log pi(o_i^k | q, M..M) - log pi_old(o_i^k | q, M..M)])   (all G positions)
    L     = sum_{i,k kept} [-min(s_i A_i, clip(s_i, 1 - eps, 1 + eps) A_i) + beta k3_ik] / #kept

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> hints (failed groups) -> hinted rollout (`dare.train.hints`) -> hinted -> advantages
    -> old/ref token_logps (one forward, no noise drawn) -> mu x [token_logps -> loss -> optimizer step]

Deviations (README.md): d1's (full fine-tuning with a frozen reference, float64 Gumbel noise, padding hidden);
the loss normalised by the kept tokens of the whole step (the reference: per micro-batch of one group); the hint
layout's random draws from the step's generator; the entropy without the reference's 1e-8.
"""

import math

import torch

from dare.models import token_hidden
from dare.train import noise
from dare.train.estimators import check_masked_schedule, head_entropies, scored_logps
from dare.train.objectives import clipped_sequence_objective, group_advantages, k3

RECIPE = "rl"
SCORE = "draw_token"  # (B, 2, G): per position, the log-prob and (no graph) the entropy of the predicted distribution
MAX_STRETCH = 1.5  # the hints' gaps stretch by at most this much to fill the completion (the reference's constant)


def check_config(cfg) -> None:
    check_masked_schedule(cfg, "IGPO's hinted rollout", cache=False)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages: the group mean is the baseline, no std division."""
    return group_advantages(rewards, baseline="mean", std="none")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


# --- hints: which groups get them, where the reference's chunks go, which hinted completions stay


def chunks(n: int, sizes: list[int], min_chunk: int) -> list[tuple[int, int]]:
    """Consecutive chunks of n tokens, of the drawn sizes; a tail shorter than min_chunk is left out."""
    out, i = [], 0
    for size in sizes:
        if i >= n:
            break
        size = min(size, n - i)
        if size < min_chunk:
            break
        out.append((i, i + size))
        i += size
    return out


def stretched(spans: list[tuple[int, int]], width: int, stretch: float, max_spacing: int) -> list[tuple[int, int]]:
    """The revealed chunks' places in a canvas of `width`: the first at start x stretch, each next one after its
    predecessor by its gap x stretch (at most max_spacing); a chunk that overruns is cut, one that starts past the
    end and all after it dropped (the reference's `scale_chunk_positions`)."""
    out = []
    for i, (start, end) in enumerate(spans):
        at = int(start * stretch) if i == 0 else out[-1][1] + min(int((start - spans[i - 1][1]) * stretch), max_spacing)
        if at >= width:
            break
        out.append((at, min(at + end - start, width)))
    return out


def layout(reference: list[int], share: float, gen_length: int, sizes: list[int], hidden: list[int], cfg) -> list[int]:
    """One row's given tokens (gen_length, -1 where decoded): the reference cut into chunks (`chunks`, of `sizes`),
    the chunks numbered in `hidden` (int(#chunks x (1 - share)) of them, drawn) kept back, the last always shown,
    and the rest placed by `stretched` in all but the last free_tail positions."""
    a = cfg.algo
    width = max(0, gen_length - a.free_tail)
    row = [-1] * gen_length
    if not reference or width == 0:
        return row
    stretch = min(MAX_STRETCH, max(1.0, width / len(reference)))
    tokens = reference[:width]
    spans = chunks(len(tokens), sizes, a.min_chunk)
    shown = [c for i, c in enumerate(spans) if i not in hidden or i == len(spans) - 1]
    for (s, e), (at, end) in zip(shown, stretched(shown, width, stretch, a.max_spacing)):
        row[at:end] = tokens[s:s + end - at]
    return row


def hints(rewards: torch.Tensor, references: list, gen_length: int, generator: torch.Generator, cfg):
    """(P x G, gen_length) given tokens for the rows of every group with no correct completion (-1 elsewhere), or
    None when every group has one. Row j of a failed group shows a share r_j of its chunks, r ~ U[share_low,
    share_high] sorted within the group. Host work: a few chunks a hinted row."""
    a = cfg.algo
    P, G = rewards.shape
    failed = (rewards < a.solved_at).all(dim=1).tolist()  # one read of P flags a step
    if not any(failed):
        return None
    fixed = torch.full((P * G, gen_length), -1, dtype=torch.long)
    for p in (p for p in range(P) if failed[p]):
        shares = (torch.rand(G, generator=generator, dtype=torch.float64) * (a.share_high - a.share_low)
                  + a.share_low).sort().values.tolist()
        n = min(len(references[p]), max(0, gen_length - a.free_tail))
        for j, share in enumerate(shares):
            sizes = torch.randint(a.min_chunk, a.max_chunk + 1, (max(n, 1),), generator=generator).tolist()
            count = len(chunks(n, sizes, a.min_chunk))
            hidden = set(torch.randperm(count, generator=generator)[:int(count * (1 - share))].tolist())
            fixed[p * G + j] = torch.tensor(layout(references[p], share, gen_length, sizes, hidden, cfg))
    return fixed


def hinted(rewards: torch.Tensor, hinted_rewards: torch.Tensor, generator: torch.Generator, cfg) -> torch.Tensor:
    """(P x G,) the hinted row that replaces each row, -1 where the row stays: in a group that was decoded again,
    its correct hinted completions (at most max_replacements, drawn when there are more) take the first slots."""
    a = cfg.algo
    P, G = rewards.shape
    source = torch.full((P * G,), -1, dtype=torch.long)
    correct = (hinted_rewards >= a.solved_at).cpu()  # NaN (not decoded again) is never correct
    for p in correct.any(dim=1).nonzero()[:, 0].tolist():
        rows = correct[p].nonzero()[:, 0]
        if len(rows) > a.max_replacements:
            rows = rows[torch.randperm(len(rows), generator=generator)[:a.max_replacements]]
        source[p * G:p * G + len(rows)] = p * G + rows
    return source


# --- the loss


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, 2, G): [0] log pi(o^k | q, M..M) at every completion position (the whole completion masked, the prompt
    clean: one forward, no noise drawn), [1] the entropy of the distribution predicted there (no graph)."""
    P, mask_id = batch.prompt_length, batch.mask_token_id
    completion = noise.completion(batch.attention_mask, P)
    x = torch.where(completion, mask_id, batch.sequences)
    hidden = token_hidden(model, x, batch.attention_mask)
    chunk = batch.compute.chunk
    logps = scored_logps(model, hidden, batch.sequences, completion, chunk, fused=batch.compute.fused)[:, P:]
    entropy = torch.zeros_like(logps)
    rows, cols = completion[:, P:].nonzero(as_tuple=True)
    entropy[rows, cols] = head_entropies(model, hidden[:, P:][rows, cols], chunk)
    return torch.stack([logps, entropy.detach()], dim=1)


def kept_tokens(given: torch.Tensor, entropy: torch.Tensor, share: float) -> torch.Tensor:
    """(B, G) bool: every position that was decoded, and of each row's given (hint) positions the
    max(1, int(n x share)) with the highest entropy."""
    n = given.sum(dim=1)
    k = torch.where(n > 0, (n.double() * share).floor().long().clamp(min=1), 0)
    order = entropy.masked_fill(~given, -math.inf).argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(given.shape[1], device=given.device).expand_as(order))
    return ~given | (rank < k[:, None])


def hint_positions(batch) -> torch.Tensor:
    """(B, G) bool: the hint tokens of the batch's completions (none on a step that gave no hints)."""
    return batch.given if batch.given is not None else torch.zeros_like(batch.response_mask, dtype=torch.bool)


def loss_units(batch, draw, cfg) -> float:
    """This process's kept tokens (`kept_tokens`: the count needs no entropy), the loss's normalizer."""
    given = hint_positions(batch)
    n = given.sum(dim=1)
    k = torch.where(n > 0, (n.double() * cfg.algo.hint_keep).floor().long().clamp(min=1), 0)
    return float((given.shape[1] - n + k).sum())


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    a = cfg.algo
    logp, old, entropy = logps[:, 0], old_logps[:, 0], old_logps[:, 1]
    given = hint_positions(batch)
    keep = kept_tokens(given, entropy, a.hint_keep).float()
    policy, clipped = clipped_sequence_objective((logp - old).mean(dim=1), batch.advantages, a.epsilon, a.epsilon)
    kl = k3(ref_logps[:, 0] - logp) if ref_logps is not None else torch.zeros_like(logp)
    n = max(batch.num_units, 1.0)
    loss = ((-policy[:, None] + a.beta * kl) * keep).sum() / n
    hint = given.float() * keep
    return loss, {"loss/policy": (-policy[:, None] * keep).sum().item() / n, "loss/kl": (kl * keep).sum().item() / n,
                  "stats/clip_ratio": (clipped.float()[:, None] * keep).sum().item() / n,
                  "stats/hint_tokens": hint.sum().item() / n}
