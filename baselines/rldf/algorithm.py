"""RLDF, Reinforcement Learning from Denoising Feedback (He et al., arXiv:2605.25638), as its reference code, the
Drift framework, runs it (`ant-research/Drift@7abd99b`, `trainer/main_rl.py` and `trainer/masking_strategy.py`).

A dLLM's sequence likelihood is intractable; RLDF trains instead on the policy's own denoising trajectory. From
each rollout it replays a few of the noisy states the sampler actually passed through (the state just before a
decoding step: that step's tokens and every later one masked) and pushes the model's prediction of the clean
completion from that state up or down with the completion's advantage, only where the prediction is already
confident (a "clipped" clean state: the masked tokens predicted with p >= 0.6, plus the tokens the step itself
decoded). The states are drawn by weighted timestep sampling: a step is chosen with probability
softmax(surprisal / T), the surprisal being the mean -log p the sampler gave the tokens that step committed, so
the hesitant steps of the trajectory are replayed more often (`sequential_masking`).

    A_i       = (r_i - mean_group r) / max(std_group r + 1e-8, 1e-2)                  (main_rl.py compute_loss)
    w_s       = -mean_{k committed at step s} log p_rollout(o_k)          (masking_strategy.py, step weights)
    s_1..s_K  ~ softmax(w / T) over the row's steps, without replacement     (K = num_states = 4, T = 1)
    z_j       = o with every token committed at step >= s_j masked                      (the state before s_j)
    M_j       = {k masked in z_j : p_old(o_k | z_j) >= tau} + {k committed at s_j}     (tau = 0.6; mu = 1: p_theta)
    l_jk      = -A_i log p(o_k | z_j)                        (mu = 1, REINFORCE)
              | -min(rho A_i, clip(rho, 1 - eps, 1 + eps) A_i), rho = p / p_old          (mu > 1, PPO-clip)
              + beta (exp(q) - 1 - q), q = log p_ref(o_k | z_j) - log p(o_k | z_j)           (k3 KL, beta 0.01)
    L         = (1 / (K |kept rows|)) sum_i sum_j mean_{k in M_ij} l_ijk      (`loss_norm: sample`)

The step sampler is the shared block `dare.train.noise.weighted_steps` (its states: `noise.step_states`). Only
some groups train (`keep_groups`, the reference's `filter_rollout_samples`): groups whose rewards differ first.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout (step map, commit log-probs) -> rewards -> advantages(rewards, cfg) -> prepare (kept groups)
    -> mu x sample_noise(batch, generator, cfg) (K replayed states per completion) -> old (mu > 1) and reference
    log-probs on those states (token_logps) -> mu x [token_logps(model, batch, draw, cfg)
    -> loss(logps, old, ref, batch, draw, cfg) -> optimizer step]

Deviations (README.md): a fresh draw of states per inner update when mu > 1 (the reference draws one schedule per
rollout; its configs use mu = 1); the kept groups are the first ones of each kind (the reference picks them at
random); the response is the completion up to its first EOS, and the EOS tail keeps its recorded state (the
reference remaps it to step 0); `loss_norm: token` and the entropy terms (coefficient 0 in every config) are not
implemented; block-diffusion models are not covered (the reference runs LLaDA and Dream); the step draws have
the reference's law, not its random stream.
"""

import math
from dataclasses import replace

import torch

from dare.train import noise
from dare.train.estimators import draw_logps
from dare.train.objectives import clipped_token_objective, group_advantages

RECIPE = "rl"
SCORE = "draw_token"  # what token_logps returns: (B, D, G) (dare.train.hooks.SCORES)
STD_EPS, STD_FLOOR = 1e-8, 1e-2  # main_rl.py compute_loss: (r - mean) / (std + 1e-8).clamp(min=1e-2)
MIN_PROB = 1e-10  # masking_strategy.py: token probabilities are clamped before the log


def weighted(cfg) -> bool:
    return cfg.algo.step_temperature < noise.UNIFORM_STEP_TEMPERATURE


def check_config(cfg) -> None:
    if weighted(cfg) and cfg.rl.decoding.sampler not in ("auto", "masked"):
        raise ValueError(f"rl.decoding.sampler={cfg.rl.decoding.sampler}: the weighted step sampler needs the "
                         "commit log-probs only the masked sampler records; set algo.step_temperature >= 1e4 "
                         "(uniform steps) or decode with the masked sampler")


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G): (r - mean) / max(std + 1e-8, 1e-2), the sample std (the reference's)."""
    return group_advantages(rewards, "mean", "none") / (rewards.std(dim=1, keepdim=True) + STD_EPS).clamp(min=STD_FLOOR)


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def groups_kept(rewards: torch.Tensor, steps: torch.Tensor, share: float) -> torch.Tensor:
    """(P, 1) bool, the groups trained on (`filter_rollout_samples`): round(share P) of them (at least one), those
    whose rewards differ first, then all-correct ones, then all-wrong ones with the most decoding steps (the mean
    over the group of `steps` (P, G)); within each kind the first ones (the reference: chosen at random)."""
    n = max(1, round(share * rewards.shape[0]))
    varied = rewards.std(dim=1) > 1e-8
    kind = torch.where(varied, 0, torch.where(rewards.mean(dim=1) > 0, 1, 2))
    most_steps = torch.where(kind == 2, -steps.float().mean(dim=1), 0.0).argsort(stable=True)  # ties keep their order
    order = most_steps[kind[most_steps].argsort(stable=True)]
    return torch.zeros(rewards.shape[0], 1, dtype=torch.bool, device=rewards.device).index_fill_(0, order[:n], True)


def prepare(batch, cfg):
    """`kept_groups` and extras "kept" (B,) float, 1 on the rows of kept groups."""
    G = batch.group_size
    steps = noise.step_weights(batch.step_map, batch.response_mask)[0].sum(dim=1).clamp(min=1)  # distinct steps
    keep = groups_kept(batch.rewards.view(-1, G), steps.view(-1, G), cfg.algo.keep_groups)
    return replace(batch, kept_groups=keep, extras={**batch.extras, "kept": keep.float().repeat_interleave(G, 0).view(-1)})


def loss_units(batch, draw, cfg) -> float:
    return float(batch.extras["kept"].sum())  # the kept completions: the loss's normalizer over processes


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """K states of each completion's own trajectory: masked (B, K, P + G), steps (B, K) the replayed steps."""
    if batch.block_size is not None:
        raise ValueError("rldf replays a masked model's trajectory (LLaDA, Dream); block-diffusion models are not covered")
    a, P = cfg.algo, batch.prompt_length
    scores = -batch.commit_logps.clamp(min=math.log(MIN_PROB)) if weighted(cfg) else None
    steps = noise.weighted_steps(batch.step_map, batch.response_mask, a.num_states, generator, scores,
                                 a.step_temperature)
    masked, _ = noise.step_states(batch.step_map, steps)
    prompt = torch.zeros_like(masked[:, :, :1]).expand(-1, -1, P)
    return noise.Draw(masked=torch.cat([prompt, masked], dim=2), steps=steps)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """(B, K, G) log p(o_k | z_j) at the masked completion positions of each state, 0 elsewhere."""
    return draw_logps(model, batch, draw.masked)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    a, P, K = cfg.algo, batch.prompt_length, draw.steps.shape[1]
    response = batch.response_mask[:, None, :]
    scored = draw.masked[:, :, P:] & response
    current = noise.step_states(batch.step_map, draw.steps)[1] & response
    adv = batch.advantages[:, None, None]
    reinforce = cfg.rl.num_iterations == 1

    # the clipped clean state: masked tokens already predicted with p >= tau (by theta_old; mu = 1: by theta), and
    # the tokens the replayed step decoded, whatever their probability
    kept = scored
    if a.low_prob_threshold > 0:
        judge = (logps if reinforce else old_logps).detach()
        kept = (scored & (judge >= math.log(a.low_prob_threshold))) | current

    if reinforce:
        per_token, clipped = -logps * adv, torch.zeros_like(logps, dtype=torch.bool)
    else:
        ratio = torch.exp(logps - old_logps)
        objective, clipped_ratio = clipped_token_objective(ratio, adv, a.eps_low, a.eps_high)
        per_token, clipped = -objective, ratio * adv < clipped_ratio * adv  # the reference's is_clipped
    kl = torch.zeros_like(logps)
    if a.beta > 0:
        q = ref_logps - logps
        kl = torch.exp(q) - 1 - q
        per_token = per_token + a.beta * kl

    rows = batch.extras["kept"].to(logps.dtype)[:, None]  # (B, 1)
    count = kept.sum(dim=2).clamp(min=1)  # (B, K): a state with no kept token adds 0 (and still counts in K)
    mean = lambda x: ((x * kept).sum(dim=2) / count * rows).sum() / (K * max(batch.num_units, 1.0))
    loss = mean(per_token)
    with torch.no_grad():
        return loss, {"loss/policy": loss.item(), "stats/kl": mean(kl).item(), "stats/clipped": mean(clipped.float()).item(),
                      "stats/kept_share": ((kept.sum(dim=2) / scored.sum(dim=2).clamp(min=1)) * rows).sum().item()
                      / (K * max(batch.num_units, 1.0))}
