"""coupled-GRPO (Gong et al., "DiffuCoder: Understanding and Improving Masked Diffusion Models
for Code Generation", arXiv:2506.20639, §5 and App. A.3-A.4; reference code `apple/ml-diffucoder`
`src/open_r1/coupled_grpo.py`).

Per-token log-probs from a coupled (antithetic) pair of partial maskings plus the fully masked
completion (lambda = 1 pair, so 3 forward passes per estimate). With a ratio t drawn for the
batch and a mask M over the completion at ratio t:

    pass 1: completion tokens in M masked            -> log p_1(o^k)   (scored where M)
    pass 2: completion tokens in the complement      -> log p_2(o^k)   (scored where not M)
    pass 3: every completion token masked            -> log p_T(o^k)
    pi(o^k) = 1/2 [ M_k / t * log p_1 + (1 - M_k) / (1 - t) * log p_2 + log p_T ]     (Eq. 13)

so every token is scored exactly once by the pair. The prompt is never masked. t ~ U(t_min, t_max)
(0.2, 0.8 in the code) is drawn once per estimate for the whole batch; each inner iteration
draws a fresh (t, M), shared by the policy, old and reference log-probs.

    A_i  = r_i - mean(r)  or  r_i - mean_{j != i} r_j            (`baseline`: mean | loo)
    rho  = exp(pi_theta - pi_old);  KL = k3(pi_ref, pi_theta)
    L    = -sum_{i,k} [min(rho A, clip(rho, 1 - eps, 1 + eps) A) - beta KL] / sum_i |o_i|

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> mu x sample_noise(batch, generator, cfg)
    -> old/ref token_logps(model, batch, draw, cfg) (3 passes each) -> mu x [token_logps
    -> loss(..., draw, cfg) -> optimizer step]

Deviations (README.md): the paper's headline row uses the group-mean baseline, the code hard-codes
leave-one-out; both are options (default: mean, the paper's). The token normalisation runs over
the whole step (the code: per micro-batch); each inner iteration draws its own (t, M) (the code
reuses one per accumulation chunk). The reference model follows the policy TR-DPO style every 64
optimizer steps (`train.reference_sync_every`, the engine's option), as the code's config.
"""

import torch

from dare.train import noise
from dare.train.estimators import completion_logps
from dare.train.objectives import clipped_token_loss, group_advantages

RECIPE = "rl"
SCORE = "token"  # what token_logps returns: (B, G) (dare.train.hooks.SCORES)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    return group_advantages(rewards, baseline=cfg.algo.baseline, std="none")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """One ratio t for the batch and the mask M at ratio t over the completion (B, P + G); the
    pair's second mask is its complement within the completion. Block models: one t per (row,
    block), as TraceRL's `coupled` mode draws it: draw.t_at (B, P + G), each position's t."""
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    span = cfg.algo.t_max - cfg.algo.t_min
    if batch.block_size is None:
        t = cfg.algo.t_min + span * torch.rand((), generator=generator)
        first, _ = noise.complementary(completion, t.expand(completion.shape[0]), generator)
        return noise.Draw(first, t.expand(completion.shape[0]).to(batch.sequences.device))
    block = noise.blocks(batch.attention_mask, batch.block_size)
    t_block = cfg.algo.t_min + span * torch.rand(block.shape[0], int(block.max()) + 1, generator=generator)
    t = noise.per_block(t_block.to(block.device), block)
    u = torch.rand(completion.shape, generator=generator).to(completion.device)
    return noise.Draw(completion & (u < t), t_at=t)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """Eq. 13 with lambda = 1: the coupled pair's importance-weighted log-probs averaged with the
    fully masked pass. (B, G)"""
    P = batch.prompt_length
    t = draw.t_at[:, P:] if draw.t_at is not None else draw.t[:, None]  # per position (block models) or per row
    completion = noise.completion(batch.attention_mask, P)
    first = completion_logps(model, batch, draw.masked)
    second = completion_logps(model, batch, completion & ~draw.masked)
    full = completion_logps(model, batch, completion)
    pair = torch.where(draw.masked[:, P:], first / t, second / (1 - t))
    return 0.5 * (pair + full)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    return clipped_token_loss(logps, old_logps, ref_logps, batch, cfg.algo.epsilon, cfg.algo.beta)
