"""UniGRPO (LLaDA-style, after MMaDA's "UniGRPO"): one uniform mask ratio per completion, the
policy log-probability of a completion = the MEAN log-prob over its masked answer positions,
a PPO clip + k3 KL on those sequence-level values, fresh masks every inner iteration.

The objective needs to know which positions were masked: `loss` reads them from the draw it
receives (`draw.masked`), which is the point of this test algorithm (issue 28, item 1).
"""

from dataclasses import dataclass

import torch

from dare.config import DecodingConfig, RLConfig, recipe
from dare.models import facts
from dare.train import noise
from dare.train.estimators import masked_logps
from dare.train.objectives import group_advantages

RECIPE = "rl"
SCORE = "token"  # what token_logps returns: (B, G) (dare.train.hooks.SCORES)


@dataclass
class UniGRPO:
    epsilon: float = 0.2
    beta: float = 0.04
    t_min: float = 0.1


Config = recipe(
    UniGRPO,
    rl=RLConfig(decoding=DecodingConfig(temperature=0.9)))


def advantages(rewards, cfg):
    return group_advantages(rewards, baseline="mean", std="none")


def uses_reference(cfg):
    return cfg.algo.beta > 0


def sample_noise(batch, generator, cfg) -> noise.Draw:
    """t ~ U(t_min, 1) per completion; its valid answer tokens masked i.i.d. at t."""
    t = cfg.algo.t_min + (1 - cfg.algo.t_min) * torch.rand(batch.sequences.shape[0], generator=generator)
    answer = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
    answer[:, batch.prompt_length:] = batch.response_mask
    return noise.Draw(noise.iid(answer, t.to(answer.device), generator), t=t.to(answer.device))


def token_logps(model, batch, draw, cfg):
    x = torch.where(draw.masked, facts(model).mask_token_id, batch.sequences)
    logps = masked_logps(model, x, batch.sequences, draw.masked, batch.attention_mask, compute=batch.compute)
    return logps[:, batch.prompt_length:]  # 0 where not masked


def sequence_logps(logps, draw, batch):
    """Mean log-prob over each completion's masked positions. (B,)"""
    masked = draw.masked[:, batch.prompt_length:].float()
    return (logps * masked).sum(1) / masked.sum(1).clamp(min=1)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    eps, beta = cfg.algo.epsilon, cfg.algo.beta
    seq, old = sequence_logps(logps, draw, batch), sequence_logps(old_logps, draw, batch)
    ratio = torch.exp(seq - old)
    policy = torch.min(ratio * batch.advantages, ratio.clamp(1 - eps, 1 + eps) * batch.advantages)
    kl = torch.zeros_like(seq)
    if ref_logps is not None:
        delta = sequence_logps(ref_logps, draw, batch) - seq
        kl = torch.exp(delta) - delta - 1
    total = -(policy - beta * kl).sum() / batch.num_sequences
    return total, {"loss/policy": -policy.sum().item() / batch.num_sequences,
                   "stats/masked_fraction": draw.masked[:, batch.prompt_length:].float().mean().item()}
