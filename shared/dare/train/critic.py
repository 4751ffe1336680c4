"""A value model (critic) for RL methods with token-level advantages.

TraceRL's diffusion value model (Gen-Verse/dLLM-RL @10b4fd1, `train/init_sdar_value_model.py`):
a copy of a checkpoint's model with a scalar head on its final hidden states,
`value_head = Linear(hidden, 1, bias=False)`, zero at the start (so the first advantages are the
returns). The value of a completion token is read from the hidden state that predicts that token
on a given noised input (`estimators.diffusion_hidden`): the same input, layout and alignment as
the policy's log-prob of the token, on every family.

The RL loop (`dare.train.rl`) builds one when the algorithm's `value_model(cfg)` hook asks for it,
trains it with its own optimizer and learning rate, checkpoints it beside the policy
(`checkpoints/step_N/value/`, restored on resume) and exports it to `<run>/value/` at the end; the
algorithm's hooks say what it predicts (`token_values`; the values before the update are in
`batch.old_values`, from which `value_targets` derives token advantages and returns) and how it is trained
(`value_loss`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dare.train.loop import build_model
from dare.train.estimators import diffusion_hidden
from dare.train.trainer import Trainer


def attach_value_head(model):
    """Give `model` a zero-initialised `value_head` (hidden -> 1, no bias) in its own dtype; returns it."""
    weight = model.get_output_embeddings().weight
    head = torch.nn.Linear(weight.shape[1], 1, bias=False, dtype=weight.dtype, device=weight.device)
    torch.nn.init.zeros_(head.weight)
    model.value_head = head
    return model


def value_head(model):
    return getattr(model, "module", model).value_head


def diffusion_values(model, x_noisy: torch.Tensor, clean: torch.Tensor, where: torch.Tensor,
                     attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L) float32 values of the tokens at `where` (0 elsewhere) on the noised input `x_noisy`:
    the value head on the hidden state that predicts each token (`diffusion_hidden`)."""
    hidden = diffusion_hidden(model, x_noisy, clean, attention_mask)
    values = value_head(model)(hidden).squeeze(-1).float()
    return torch.where(where, values, 0.0)


def build_critic(cfg, task, dist, spec: dict, total_steps: int) -> Trainer:
    """The value model as its own `Trainer`: the checkpoint `spec["path"]` (default: the policy's
    `model.path`) with a zero value head, trained in full (never LoRA: the head must train; the LM
    head, which no value reads, is frozen) with the run's optimizer settings at `spec["lr"]`."""
    model_cfg = replace(cfg.model, path=spec.get("path") or cfg.model.path, lora=replace(cfg.model.lora, rank=0))
    model, _, _, _ = build_model(model_cfg, task, cfg.run.seed)
    attach_value_head(model)
    head = model.get_output_embeddings().weight
    if head is not model.get_input_embeddings().weight:  # never read by the values (a tied one is the embedding)
        head.requires_grad_(False)
    return Trainer(model, model_cfg, replace(cfg.train, lr=spec["lr"]), dist, total_steps, seed=cfg.run.seed)
