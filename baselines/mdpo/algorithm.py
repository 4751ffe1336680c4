"""MDPO (He et al., "MDPO: Overcoming the Training-Inference Divide of Masked Diffusion Language
Models", arXiv:2508.13148; reference code `autonomousvision/mdpo` @e6ae439,
`src/open_r1/mdpo/mdpo_trainer.py`, `src/mdlm_generation_utils.py`).

Denoising as an MDP with rewards on intermediate states: after every step s the sampler's full
prediction x0-hat^(s) (every masked position filled with its prediction) is scored with the task's
reward (`prepare` scores the maskgit sampler's `predictions` with `batch.score`). With r_s the reward of
step s of a completion (S steps; "adv-v4", as the code does it):

    A_s  = [r_0 if s = 0 else r_s - r_{s-1}] + 1 + [mean(r_{s+1..S-1}) if s < S-1 else r_{S-1}]
    A_s <- (A_s - mean_group A_s) / (std_group A_s + 1e-4)          (per step, unbiased std)

Each completion trains its K steps with the largest |A_s| (sample_train_steps). For a trained step s
the input is the sampler's state x_s before the step, the targets are x0-hat^(s) at every position
masked in x_s, log-probs come from the logits divided by T + eps (the rollout temperature), and
c_k is the rollout confidence of position k at step s:

    lambda_s = G / (|M_s| + 1e-4)                      (M_s: the masked positions of x_s; G: gen_length)
    l_k      = -min(rho_k A_s, clip(rho_k, 1 - eps, 1 + eps) A_s) lambda_s + beta (ref_k - logp_k)^2 / 2
    L        = mean over (completion, trained step) of  sum_{k in M_s} l_k c_k / (|M_s| + 1e-4)

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout (maskgit sampler: states, predictions, confidences) -> final rewards
    -> prepare: per-step rewards, the step advantages and the K trained steps -> ref token_logps
    -> [token_logps -> loss -> optimizer step]   (mu = 1, as the code requires)
"""

from dataclasses import replace

import torch

from dare.train import noise
from dare.train.estimators import diffusion_logps
from dare.train.objectives import clipped_token_objective, group_advantages

RECIPE = "rl"
SCORE = "draw_token"  # what token_logps returns: (B, D, G) (dare.train.hooks.SCORES)


def check_config(cfg) -> None:
    if cfg.rl.decoding.sampler != "maskgit":
        raise ValueError(f"rl.decoding.sampler={cfg.rl.decoding.sampler!r}: MDPO trains on the full predictions and "
                         "confidences of every step, which the maskgit sampler records: set rl.decoding.sampler=maskgit")
    if cfg.algo.train_steps > cfg.rl.decoding.steps:
        raise ValueError(f"algo.train_steps={cfg.algo.train_steps}: more than the {cfg.rl.decoding.steps} decoding steps")


def rollout_options(cfg) -> dict:
    return {"record": ("states", "predictions")}


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """The final answers' group z-scores (the hook contract's `batch.advantages`); MDPO's loss does not
    read them: it uses the step advantages of `sample_noise`."""
    return group_advantages(rewards, baseline="mean", std="sample")


def uses_reference(cfg) -> bool:
    return cfg.algo.beta > 0


def step_advantages(step_rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B, S) rewards of every step's prediction -> (B, S) adv-v4, normalized per step in each group."""
    r = step_rewards
    diff = torch.cat([r[:, :1], r[:, 1:] - r[:, :-1]], dim=1) + 1
    S = r.shape[1]
    future = r[:, 1:].flip(1).cumsum(1) / torch.arange(1, S, device=r.device)
    adv = diff + torch.cat([future.flip(1), r[:, -1:]], dim=1)
    grouped = adv.view(-1, group_size, S)
    normed = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-4)
    return normed.view(-1, S)


def prepare(batch, cfg):
    """No randomness: the reward of every step's prediction (extras "step_rewards", (B, S)), and each
    completion's K trained steps (those with the largest |A_s|) and their advantages ("steps", "advantages")."""
    step_rewards = torch.stack([batch.score(p) for p in batch.predictions.unbind(1)], dim=1)
    return replace(batch, extras={"step_rewards": step_rewards, **trained_steps(step_rewards, batch.group_size, cfg)})


def trained_steps(step_rewards: torch.Tensor, group_size: int, cfg) -> dict:
    """{"steps": (B, K) the steps with the largest |A_s|, "advantages": (B, K) their step advantages}."""
    adv = step_advantages(step_rewards, group_size)
    steps = adv.abs().topk(cfg.algo.train_steps, dim=1).indices
    return {"steps": steps, "advantages": adv.gather(1, steps)}


def step_inputs(batch, steps: torch.Tensor):
    """(inputs, targets, masked), each (B, K, G): the state before each trained step (all MASK before the
    first), that step's prediction x0-hat, and the positions masked in the state."""
    inputs, masked = noise.trajectory_states(batch.trajectory, steps, batch.mask_token_id)
    return inputs, batch.predictions.gather(1, steps[..., None].expand(-1, -1, inputs.shape[-1])), masked


def token_logps(model, batch, draw, cfg) -> torch.Tensor:
    """(B, K, G) log pi(x0-hat^(s)_k | x_s) at the positions masked in x_s (0 elsewhere), from the
    logits divided by T + eps, one forward per trained step."""
    P = batch.prompt_length
    inputs, targets, masked = step_inputs(batch, batch.extras["steps"])
    prompt = batch.sequences[:, :P]
    temperature = batch.decoding.temperature + torch.finfo(torch.float32).eps
    out = []
    for k in range(inputs.shape[1]):
        x = torch.cat([prompt, inputs[:, k]], dim=1)
        where = torch.cat([torch.zeros_like(prompt, dtype=torch.bool), masked[:, k]], dim=1)
        logps = diffusion_logps(model, x, torch.cat([prompt, targets[:, k]], dim=1), where, batch.attention_mask,
                                compute=batch.compute, temperature=temperature)
        out.append(logps[:, P:])
    return torch.stack(out, dim=1)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    eps, beta, G = cfg.algo.epsilon, cfg.algo.beta, batch.responses.shape[1]
    steps = batch.extras["steps"]
    _, _, masked = step_inputs(batch, steps)
    conf = batch.confidences.gather(1, steps[..., None].expand(-1, -1, G))
    n_masked = masked.sum(dim=-1, keepdim=True).float()
    lam = G / (n_masked + 1e-4)
    adv = batch.extras["advantages"][..., None]
    ratio = torch.exp(logps - old_logps)
    policy, _ = clipped_token_objective(ratio, adv, eps, eps)
    kl = (ref_logps - logps) ** 2 / 2 if ref_logps is not None else torch.zeros_like(logps)
    per_token = -policy * lam + beta * kl
    pairs = max(batch.num_sequences, 1) * steps.shape[1]
    weight = masked.float() * conf / (n_masked + 1e-4) / pairs
    return (per_token * weight).sum(), {"loss/policy": (-(policy * lam) * weight).sum().item(),
                                        "loss/kl": (kl * weight).sum().item()}
