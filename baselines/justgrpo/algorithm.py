"""JustGRPO (Ni et al., "The Flexibility Trap: Why Arbitrary Order Limits Reasoning Potential in
Diffusion Language Models", arXiv:2601.15165; reference code `LeapLabTHU/JustGRPO` `grpo.py`,
`train.py` at eebe50e).

Plain GRPO on the diffusion model read as an autoregressive one: rollouts decode strictly left to
right (block 1, one token per step), and each completion token is scored with the tokens before it
observed and itself and every later token masked, so the sequence likelihood is the exact
left-to-right factorization of the model's conditionals (no ELBO, no mean-field guess):

    log pi(o_t | q, o_<t) = log softmax(f([q, o_<t, MASK ... MASK]) / T)_{P+t}[o_t]
    A_i   = (r_i - mean(r_group)) / (std(r_group) + 1e-4)          (unbiased std)
    rho   = exp(logp - logp_old)                                   (= 1: one update per rollout batch)
    L     = -sum_i sum_{t < gen_length} min(rho A_i, clip(rho, 1 - eps, 1 + eps) A_i)
            / (gen_length * #{i : A_i != 0})

Every one of the gen_length positions counts, after the first EOS too, and the normalizer counts the
completions that carry a gradient (nonzero advantage) in the whole step. No KL, no reference model.
The likelihood is `dare.train.estimators.ar_prefix_logps` (the trajectory log-probs of the left-to-right
rounds, `noise.left_to_right_rounds`): one forward per position on a masked model; on a block model one
per in-block offset, every block at once.

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout (AR order) -> rewards -> advantages(rewards, cfg) -> prepare (the rounds, once)
    -> token_logps(model, batch, draw, cfg) -> loss(logps, logps.detach(), None, batch, draw, cfg)
    -> optimizer step

Deviations (README.md): the normalizer counts valid completions over the whole step (the reference
divides each accumulation step's sum by that step's per-rank mean and sums 8 of them, 8x our loss);
non-finite gradients are not zeroed before clipping; families beyond LLaDA.
"""

from dataclasses import replace

import torch

from dare.train import noise
from dare.train.estimators import ar_rounds, trajectory_logps
from dare.train.objectives import clipped_token_objective, group_advantages

RECIPE = "rl"
SCORE = "token"  # what token_logps returns: (B, G) (dare.train.hooks.SCORES)


def check_config(cfg) -> None:
    d = cfg.rl.decoding
    if d.sampler not in ("auto", "masked", "block") or d.masked.threshold or d.masked.factor or d.block.threshold:
        raise ValueError(f"rl.decoding: JustGRPO rolls out in AR order (its likelihood's order), one token per step "
                         f"with the masked or block sampler and no threshold/factor rule (got sampler={d.sampler}, "
                         f"masked.threshold={d.masked.threshold}, masked.factor={d.masked.factor}, "
                         f"block.threshold={d.block.threshold})")


def check_ar_order(batch) -> None:
    """The rollout committed each row's tokens one per step from left to right (else its policy is not
    the one the AR-prefix likelihood scores): masked sampler with block_length=1 (or remasking=
    left_to_right) and steps=gen_length; block sampler with remasking=left_to_right and steps=block size."""
    if (batch.step_map < 0).any():
        raise ValueError("rl.decoding.block.eos_early_stop: the rollout filled positions it never sampled with EOS, which "
                         "JustGRPO would train as sampled tokens (it scores every position): set eos_early_stop=false")
    if not (batch.step_map[:, 1:] > batch.step_map[:, :-1]).all():
        raise ValueError("rl.decoding: the rollout did not commit one token per step from left to right, which "
                         "JustGRPO's likelihood assumes; masked models: block_length=1 (or remasking=left_to_right) "
                         "and steps=gen_length; block models: remasking=left_to_right and steps=the block size")


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G) -> (P, G): (r - group mean) / (unbiased group std + 1e-4), `compute_group_advantages`."""
    return group_advantages(rewards, baseline="mean", std="sample", eps=1e-4)


def uses_old_logps(cfg) -> bool:
    return cfg.rl.num_iterations > 1  # one update per batch (the reference): old = current, ratio 1


def prepare(batch, cfg):
    """Nothing is drawn, the masks are fixed by the positions: extras "rounds", (B, P + G) the round of each
    position in left-to-right order (each token its own round; block models: the k-th token of every block in
    round k): the t-th state masks o_t and everything after it."""
    return replace(batch, extras={"rounds": noise.left_to_right_rounds(batch)})


def token_logps(model, batch, draw, cfg) -> torch.Tensor:
    """(B, G) log pi(o_t | q, o_<t) at every completion position (the logits divided by algo.temperature):
    `estimators.ar_prefix_logps`, the trajectory log-probs of the left-to-right rounds."""
    check_ar_order(batch)
    return trajectory_logps(model, batch, batch.extras["rounds"], cfg.algo.temperature, ar_rounds(batch))


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    eps = cfg.algo.epsilon
    adv = batch.advantages[:, None]  # (B, 1)
    ratio = torch.exp(logps - old_logps)
    policy, _ = clipped_token_objective(ratio, adv, eps, eps)  # (B, G), every position
    n = logps.shape[1] * max(batch.num_active, 1)  # gen_length x completions with a gradient, whole step
    loss = -policy.sum() / n
    return loss, {"loss/policy": loss.item(),
                  "stats/seq_logp": logps.detach().sum().item() / batch.num_sequences}
