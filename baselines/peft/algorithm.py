"""LoRA SFT of a diffusion LM through peft, as in d1's SFT stage (Zhao et al., arXiv:2504.12216,
Algorithm 2 and App.; reference code `dllm-reasoning/d1` `SFT/sft_trainer.py`, `sft_train.py`).

The trainable parameters are LoRA adapters (peft) on the family's declared target modules
(`dare models show`, or `model.lora.targets`); the engine saves the adapter in checkpoints and
exports the merged model, adapter beside it, at the end (`final/`, `final/adapter/`).

The objective is d1's masked SFT loss: t = (1 - eps) u + eps with u ~ U(0, 1) per sequence
(`dLLMDataCollator.forward_process`), every response token (answer and EOS padding) masked with
probability t, the prompt never masked:

    L = sum_b sum_{i masked} -log p_theta(x_i | x_t) / t_b  /  sum_b |r_b|

normalized by the response tokens of the whole step (d1's collator divides by all tokens minus
prompt tokens of the batch), unlike LLaDA's per-sequence normalization (`baselines/sft`).
Prompt + response are cut to `max_length` (4096) tokens first, as d1's tokenizer call does.
Block-diffusion models (SDAR, LLaDA2.x) take the same loss through their [noisy ; clean] layout.
"""

import torch

from dare.models import facts
from dare.train import noise
from dare.train.estimators import diffusion_logps

RECIPE = "sft"


def check_config(cfg) -> None:
    if cfg.model.lora.rank <= 0:
        raise ValueError("model.lora.rank must be > 0 for the peft baseline (use baselines/sft for full fine-tuning)")


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """t = (1 - eps) u + eps per row, response tokens masked i.i.d. at t (d1's forward_process)."""
    ids = batch.input_ids
    t = ((1 - cfg.algo.eps) * torch.rand(ids.shape[0], generator=generator) + cfg.algo.eps).to(ids.device)
    return noise.Draw(noise.iid(batch.response_mask, t, generator), t=t)


def loss(model, batch, draw: noise.Draw, cfg):
    ids, masked, t = batch.input_ids, draw.masked, draw.t
    noisy = torch.where(masked, facts(model).mask_token_id, ids)
    logps = diffusion_logps(model, noisy, ids, masked, batch.attention_mask, compute=batch.compute)
    loss = -(logps.sum(1) / t).sum() / batch.num_tokens  # the step's response tokens
    return loss, {"stats/mask_ratio": (masked.sum(1) / batch.response_mask.sum(1).clamp(min=1)).sum().item()
                  / batch.num_sequences}
