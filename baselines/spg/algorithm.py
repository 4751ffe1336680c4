"""SPG (Wang et al., "SPG: Sandwiched Policy Gradient for Masked Diffusion Language Models",
arXiv:2510.09541, ICLR 2026; reference code `facebookresearch/SPG` `spg/spg_trainer.py` at a1c7120).

A REINFORCE-style policy gradient that sandwiches the intractable log-likelihood: a lower bound (the
ELBO) for completions it should raise, an upper bound (the Renyi EUBO of order beta, or a mixture with
the ELBO) for those it should lower, so the objective is a lower bound of the true one:

    A_i    = r_i - mean(r_group)                                             (no std scaling)
    ELBO_i = mean_j [ sum_{k masked in draw j} log pi(o_k | z_j) / #masked_j ]   (m = num_t draws)
    EUBO_i = (1/beta) mean_{k masked in some draw} log( mean_j 1[k masked in j] pi^beta(o_k | z_j) / t_j )
    NEG_i  = omega EUBO_i + (1 - omega) ELBO_i        (negative = "mix"; "eubo": EUBO_i; "elbo": ELBO_i)
    L      = -sum_i A_i |o_i| (1[A_i > 0] ELBO_i + 1[A_i <= 0] NEG_i) / sum_i |o_i|

with t_j the draw's masked share of the |o_i| scored tokens (up to and including the first EOS). The draws
are SPG's block-wise masks (`dare.train.noise.block_random`): per draw one block of the rollout, earlier
blocks clean, later ones masked, a uniform count of the block masked, then the prompt and the clean blocks
masked at p_mask_prompt; a fresh set per inner update. No importance ratio, clipping, old or reference
log-probs: each of the mu updates is a plain gradient of the current policy on the same rollouts.

The EUBO is computed in log space (`dare.train.estimators.eubo_terms`: logsumexp over the draws), so its
gradient stays bounded where the reference's fp32 p^beta reaches the subnormal range (1/a overflows to inf,
then NaN weights and "!!!!" outputs: its issues #2 and #5).

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> mu x [sample_noise(batch, generator, cfg)
    -> token_logps(model, batch, draw, cfg) -> loss(..., draw, cfg) -> optimizer step]

Deviations (README.md): the log-space EUBO; the length weighting over the whole step (the reference
normalizes each micro-batch of 6); a fresh draw per inner update (the reference's seed indexing reuses 2 of
its 4 masks with 2 accumulation steps, and 1 with 4; `rl.noise_draws=once` reuses one for all).
"""

import torch

from dare.train import noise
from dare.train.estimators import draw_logps, sandwiched_likelihood
from dare.train.objectives import group_advantages

RECIPE = "rl"
SCORE = "draw_token"  # what token_logps returns: (B, D, G) (dare.train.hooks.SCORES)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    return group_advantages(rewards, baseline="mean", std="none")


def uses_old_logps(cfg) -> bool:
    return False  # no importance ratio (and no reference: no KL, the default of uses_reference)


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """num_t draws per completion: masked (B, num_t, P + G), t (B, num_t) the masked share of |o|."""
    a, P = cfg.algo, batch.prompt_length
    prompt = batch.attention_mask[:, :P].bool()
    if a.masking == "random":
        return random_draws(batch.response_mask, prompt, a.num_t, generator, a)
    if batch.block_size is None:  # the rollout's semi-autoregressive blocks
        G = batch.response_mask.shape[1]
        segment = (torch.arange(G, device=prompt.device) // batch.decoding.block_length).expand_as(batch.response_mask)
    else:  # the model's blocks, counted as the sampler counts them, the completion's first block = 0
        segment = noise.rollout_segments(batch)
        segment = segment - segment[:, :1]
    return noise.block_random(batch.response_mask, segment, prompt, a.num_t, generator, a.min_t, a.max_t,
                              a.p_mask_prompt)


def random_draws(response, prompt, n, generator, a) -> noise.Draw:
    """The paper's ablation ("random"): per draw a uniform count in [max(1, int(L min_t)), int(L max_t)] of
    the L scored tokens masked, everything after them masked, the prompt masked at p_mask_prompt."""
    lengths = response.sum(dim=1)
    lo = (lengths * a.min_t).long().clamp(min=1)
    hi = torch.minimum((lengths * a.max_t).long(), lengths).clamp(min=1)
    draws = []
    for _ in range(n):
        counts = lo + (torch.rand(lo.shape, generator=generator).to(lo.device) * (hi - lo + 1)).long()
        draws.append(noise.exact_count(response, counts, generator) | ~response)
    completion = torch.stack(draws, dim=1)
    u = torch.rand((*completion.shape[:2], prompt.shape[1]), generator=generator).to(prompt.device)
    masked = torch.cat([prompt[:, None, :] & (u < a.p_mask_prompt), completion], dim=2)
    t = (completion & response[:, None, :]).sum(dim=2).float() / lengths.clamp(min=1)[:, None].float()
    return noise.Draw(masked, t)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, num_t, G) log-probs of the completion tokens each draw masks (0 elsewhere)."""
    return draw_logps(model, batch, draw.masked)


def sequence_scores(logps, batch, draw, cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B,) the likelihood each completion is trained on (ELBO for A > 0, the negative bound otherwise),
    and its ELBO and EUBO (B,) for the metrics."""
    a, P = cfg.algo, batch.prompt_length
    scored = draw.masked[:, :, P:] & batch.response_mask[:, None, :]
    return sandwiched_likelihood(logps, scored, draw.t, batch.advantages, a.beta, a.omega, a.negative)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    score, elbo, eubo = sequence_scores(logps, batch, draw, cfg)
    lengths = batch.response_mask.sum(dim=1).float()  # |o_i|: up to and including the first EOS
    n = max(batch.num_tokens, 1.0)  # sum of |o_i| over the whole step
    loss = -(batch.advantages * score * lengths).sum() / n
    n_seq = batch.num_sequences
    return loss, {"loss/policy": loss.item(), "stats/elbo": elbo.detach().sum().item() / n_seq,
                  "stats/eubo": eubo.detach().sum().item() / n_seq,
                  "stats/positive_share": (batch.advantages > 0).float().sum().item() / n_seq}
