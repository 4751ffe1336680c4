"""LoRA through peft on the family's declared target modules: adding adapters, saving them, and merging
them into the base weights for export."""

from __future__ import annotations

from pathlib import Path

import torch

from dare.models import facts
from dare.utils import UserError, derive_seed


LORA_PREFIX = "base_model.model."


def add_lora(model, lora_cfg, seed: int = 0):
    """Wrap `model` in a peft LoRA model on the family's declared targets (or `lora.targets`). The
    adapters' random initialisation draws from the global RNG, forked and seeded from the run seed
    (the same run starts from the same adapters; the caller's RNG is left as it was)."""
    from peft import LoraConfig, get_peft_model

    targets = lora_cfg.targets or facts(model).lora_targets
    if not targets:
        raise UserError(f"{model.config.model_type}: the family declares no LoRA target modules; "
                        "set model.lora.targets")
    config = LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                        target_modules=targets, bias="none")
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(derive_seed(seed, "lora-init"))
        peft_model = get_peft_model(model, config)
    if not any(p.requires_grad for p in peft_model.parameters()):
        raise UserError(f"model.lora.targets={targets!r} matched no module of {model.config.model_type}")
    return peft_model


def adapter_to_module_names(model, adapter: dict) -> dict:
    """peft's saved adapter names (`...lora_A.weight`) -> the live module names (`...lora_A.default.weight`)."""
    live = {n.replace(".default", ""): n for n, p in model.named_parameters() if p.requires_grad}
    unknown = sorted(set(adapter) - set(live))
    if unknown:
        raise RuntimeError(f"adapter weights not in the model: {unknown[:5]}")
    return {live[k]: v for k, v in adapter.items()}


def save_adapter(model, state: dict, folder: Path) -> None:
    """A peft adapter folder (adapter_config.json + adapter_model.safetensors) from full tensors;
    `PeftModel.from_pretrained(base, folder)` loads it."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    adapter = get_peft_model_state_dict(model, state_dict=state)
    save_file({k: v.contiguous() for k, v in adapter.items()}, str(folder / "adapter_model.safetensors"))
    model.peft_config["default"].save_pretrained(str(folder))


def merge_lora(state: dict, lora_config) -> dict:
    """A peft model's full state dict -> the base model's, with W + (alpha / r) B A merged in
    (what `merge_and_unload` computes, on plain tensors so it also works on gathered FSDP shards), in
    float32: a bfloat16 base (`dare.train.trainer.bf16_base`) would round small adapter updates away."""
    if lora_config.use_rslora or lora_config.use_dora:
        raise NotImplementedError("merging rsLoRA/DoRA adapters")
    scale = lora_config.lora_alpha / lora_config.r
    merged = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        name = key.removeprefix(LORA_PREFIX)
        value = value.float() if value.is_floating_point() else value
        if ".base_layer." in name:
            prefix, _, leaf = key.rpartition(".base_layer.")
            name = name.replace(".base_layer.", ".")
            if leaf == "weight":
                a, b = state[f"{prefix}.lora_A.default.weight"], state[f"{prefix}.lora_B.default.weight"]
                value = value + scale * (b.float() @ a.float())
        merged[name] = value
    return merged
