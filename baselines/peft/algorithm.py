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
from dare.train.estimators import block_diffusion_logps, masked_logps

RECIPE = "sft"


def check_config(cfg) -> None:
    if cfg.model.lora.rank <= 0:
        raise ValueError("model.lora.rank must be > 0 for the peft baseline (use baselines/sft for full fine-tuning)")


def sample_noise(batch, cfg, generator: torch.Generator) -> dict:
    ids, response = batch.input_ids, batch.response_mask
    B, L = ids.shape
    t = ((1 - cfg.eps) * torch.rand(B, generator=generator) + cfg.eps).to(ids.device)
    u = torch.rand(B, L, generator=generator).to(ids.device)
    return {"t": t, "masked": (u < t[:, None]) & response}


def loss(model, batch, noise, cfg):
    ids, masked, t = batch.input_ids, noise["masked"], noise["t"]
    noisy = torch.where(masked, facts(model).mask_token_id, ids)
    if facts(model).attention == "block_causal":
        logps = block_diffusion_logps(model, noisy, ids, masked, batch.attention_mask, chunk=batch.compute.chunk)
    else:
        logps = masked_logps(model, noisy, ids, masked, batch.attention_mask, compute=batch.compute)
    loss = -(logps.sum(1) / t).sum() / batch.num_tokens  # the step's response tokens
    return loss, {"stats/mask_ratio": (masked.sum(1) / batch.response_mask.sum(1).clamp(min=1)).sum().item()
                  / batch.num_sequences}
