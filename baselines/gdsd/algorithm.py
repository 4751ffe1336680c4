"""GDSD (Tang et al., "GDSD: Reinforcement Learning as Guided Denoiser Self-Distillation for Diffusion Language
Models", arXiv:2605.29398; reference code `GaryBall/GDSD@3fb6780`, `gdsd/trainers/gdsd_trainer_batchll.py` and
`gdsd/trainers/gdsd_trainer_tlc.py`).

Reverse-KL regularised RL, max_pi E_pi[psi A] - KL(pi || pi_old) - beta KL(pi || pi_ref), has a closed-form
optimum: pi_old tilted by exp(psi A) (the advantage-guided self-teacher). GDSD distils the denoiser towards it
without a likelihood ratio estimate: the student's denoising score of a rollout, relative to the old denoiser's
on the same masks, is regressed onto psi A (a normalisation-free matching of the two denoisers' logits):

    x ~ U{0..L} stratified over the rows, m = x of the L completion positions masked, m' = the complement
    s(theta)  = 1/2 [ w sum_{i in m} log p_theta(o_i | o_{-m}) + w' sum_{i in m'} log p_theta(o_i | o_{-m'}) ]
                (variant gdsd: w = w' = 1;  variant tlc: w = (L+1)/x, w' = (L+1)/(L-x), ESPO's coupled ELBO)
    A_i       = r_i - mean_{j != i} r_j                                               (leave-one-out, no std)
    d_i       = clip(s_i(theta) - s_i(theta_old), log(1 - eps), log(1 + eps))
    KL_i      = 1/2 (s_i(theta) - s_i(ref))^2                                          (k2)
    loss      = (1/N) sum_i sum_pairs (d_i / L - psi A_i)^2 + beta (1/(N n L)) sum_i sum_pairs KL_i

L is the generation length (every completion position, as the reference), N the step's completions, n = num_mc
pairs, each pair one term (summed, not averaged, over the pairs: the reference's loss). The draws are
`dare.train.noise.complementary_pairs` (the reference's `forward_process` + coupled pass), the sums
`dare.train.estimators.elbo_terms`, the regression `dare.train.objectives.clipped_log_ratio_regression`.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout -> rewards -> advantages(rewards, cfg) -> mu x sample_noise(batch, generator, cfg)
    -> old/ref token_logps(model, batch, draw, cfg) on those draws -> mu x [token_logps -> loss(..., draw, cfg)
    -> optimizer step]

Deviations (README.md): the TLC variant's logit centring is not applied (cross-entropy is shift-invariant: the
same value and gradient); the count's stratification runs over a step's rows on a process (the reference: over
each micro-batch); draws from the run's generator (the reference reseeds the global RNG).
"""

import torch

from dare.train import noise
from dare.train.estimators import elbo_terms
from dare.train.objectives import clipped_log_ratio_regression, group_advantages

RECIPE = "rl"
SCORE = "draw"  # what token_logps returns: (B, D) (dare.train.hooks.SCORES)


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G) leave-one-out advantages (the reference's `leave_one_out = True`), std-scaled with scale_rewards."""
    return group_advantages(rewards, baseline="loo", std="sample" if cfg.algo.scale_rewards else "none")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """num_mc coupled pairs over every completion position: masked (B, 2 num_mc, P + G), the pair's two draws
    next to each other, weights (L+1)/x and (L+1)/(L-x)."""
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    return noise.complementary_pairs(completion, cfg.algo.num_mc, generator)


def pair_scores(sums: torch.Tensor, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, 2 n) each draw's sum of masked log-probs -> (B, n) each pair's score: the mean of its two halves,
    weighted by the ELBO's (L+1)/x, (L+1)/(L-x) in the tlc variant (a half that masks nothing sums to 0)."""
    if cfg.algo.variant == "tlc":
        sums = sums * draw.weight
    return sums.view(sums.shape[0], -1, 2).mean(dim=2)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, num_mc) the pairs' denoising scores s(theta): one forward per draw."""
    unweighted = noise.Draw(draw.masked, draw.t, torch.ones_like(draw.weight))
    sums = elbo_terms(model, batch.sequences, batch.attention_mask, unweighted, compute=batch.compute)
    return pair_scores(sums, draw, cfg)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    a = cfg.algo
    L = batch.sequences.shape[1] - batch.prompt_length  # the generation length (the reference's logits_to_keep)
    n, pairs = batch.num_sequences, logps.shape[1]
    target = a.psi * batch.advantages[:, None].to(logps.dtype)
    sq, clipped = clipped_log_ratio_regression(logps - old_logps, target, a.epsilon, a.epsilon, scale=1.0 / L)
    distill = sq.sum() / n
    kl = 0.5 * (logps - ref_logps) ** 2 if ref_logps is not None else torch.zeros_like(logps)
    kl = kl.sum() / (n * pairs * L)
    loss = distill + a.beta * kl
    log_ratio = (logps - old_logps).detach()
    return loss, {"loss/distill": distill.item(), "loss/kl": kl.item(),
                  "stats/score_per_token": logps.detach().sum().item() / (n * pairs * L),
                  "stats/log_ratio": log_ratio.sum().item() / (n * pairs),
                  "stats/clip_ratio": clipped.float().sum().item() / (n * pairs)}
