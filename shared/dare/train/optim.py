"""The optimizer (AdamW with the run's settings) and the learning-rate schedule (warmup, then constant,
linear or cosine).

Memory per trained parameter (bytes; activations apart), by `train.optimizer` and precision, P processes:

| mode | on the device | on the CPU |
|---|---|---|
| `adamw`, float32 | 4 weight + 4 gradient + 8 moments = 16 | 0 |
| `adamw`, `model.dtype=bfloat16` | 16 (float32 master weights; autocast's bf16 copies of the weights are made per forward, FSDP2's per gathered unit) | 0 |
| `adamw` under FSDP2 | 16 / P, + one gathered unit (all of it during a rollout, `rl.gather_rollout`) | 0 |
| `adamw`, LoRA in bfloat16 | 2 per frozen base parameter (no gradient, no state); 16 per adapter parameter | 0 |
| `adamw_offload` (bfloat16, one process) | 2 weight + 2 gradient = 4 | 4 master weight + 8 moments = 12, + 4 (the float32 gradient) during the step |

The reference model adds, per policy parameter: a frozen copy in the model's storage dtype, 4 (float32) or 2
(`adamw_offload`: a copy of the bfloat16 model), on the CPU instead with `train.reference_offload`; none under
LoRA (the adapter-disabled base). `adamw_offload` moves 2 bytes per parameter each way per optimizer step (the
gradients down, the new bfloat16 weights up) and steps AdamW on the CPU (`Trainer.step`); the rollouts and
log-prob passes run on the device's bfloat16 weights with nothing moved."""

from __future__ import annotations

import math

import torch


def make_optimizer(model: torch.nn.Module, train) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms, biases or other vectors)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train.lr, betas=tuple(train.betas))


def lr_factor(step: int, total: int, train) -> float:
    """Multiplier of `train.lr` for optimizer step `step` (0-based) out of `total`.

    Warmup: (step + 1) / warmup, so the first step already moves (HF's ramp starts at 0); warmup is
    `warmup_steps` or ceil(`warmup_ratio` x total).
    Decay, as transformers' `get_linear_schedule_with_warmup` / `get_cosine_with_min_lr_schedule_with_warmup`
    (what the TRL/HF references use): progress = (step - warmup) / (total - warmup), so the last step
    runs at floor + (1 - floor) / (total - warmup) (linear) and the floor would be reached one step later."""
    warmup = train.warmup_steps or math.ceil(train.warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    if train.schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    floor = train.min_lr_ratio
    if train.schedule == "linear":
        return floor + (1 - floor) * max(0.0, 1 - progress)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))  # cosine
