"""What the code knows about model families without importing torch or a family: the names,
their modules and original `model_type`s, their attention kind, and the `ModelFacts` record each
family's model declares (`dllm_facts()`). Family modules import `ModelFacts` from here, and
`dare.models.api` reads the registry, so the families and the adapter never import each other
in a loop."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal

# family -> (module, original `model_type`)
FAMILIES: dict[str, tuple[str, str]] = {
    "llada": ("dare.models.llada", "llada"),
    "dream": ("dare.models.dream", "Dream"),
    "sdar": ("dare.models.sdar", "sdar"),
    "sdar_moe": ("dare.models.sdar_moe", "sdar_moe"),
    "llada2": ("dare.models.llada2", "llada2_moe"),
    "lladamoe": ("dare.models.lladamoe", "lladamoe"),
}


# family -> attention kind, torch-free (config validation reads it; each family's `dllm_facts()`
# declares the same, which a test checks): "auto" decodes block-causal families with the block sampler
ATTENTION: dict[str, str] = {"llada": "bidirectional", "dream": "bidirectional", "sdar": "block_causal",
                             "sdar_moe": "block_causal", "llada2": "block_causal", "lladamoe": "bidirectional"}


def family_module(family: str):
    if family not in FAMILIES:
        raise KeyError(f"unknown model family {family!r}; known: {sorted(FAMILIES)}")
    return importlib.import_module(FAMILIES[family][0])


def register_all() -> None:
    """Import every family so that `AutoConfig`/`AutoModel` know their `model_type`s."""
    for family in FAMILIES:
        family_module(family)




@dataclass(frozen=True)
class ModelFacts:
    family: str
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    logits_shift: bool
    """True when the logit at position i-1 predicts token i (Dream); `token_logits` re-aligns."""
    attention: Literal["bidirectional", "block_causal"]
    block_size: int | None = None
    """Block size of block-causal attention (SDAR, LLaDA2); None for bidirectional models."""
    lora_targets: str = ""
    """peft `target_modules` for LoRA: a regex over module names (attention and MLP projections)."""
    eot_token_id: int | None = None
    """End-of-turn token when the chat format has one: config `eot_token_id`, else the family's
    end-of-turn string (`END_OF_TURN`) found in the checkpoint's tokenizer when it is loaded
    (LLaDA-Instruct `<|eot_id|>` 126348, Dream/SDAR `<|im_end|>`, LLaDA2 `<|role_end|>`)."""

    @classmethod
    def read(cls, config, family: str, lora_targets: str, logits_shift: bool = False) -> "ModelFacts":
        """The facts as a checkpoint's config states them, for every family alike: its mask, EOS and end-of-turn
        ids (`eot_token_id` where the config has one), the pad id (EOS where the config has none), the family's
        attention kind (`ATTENTION`) and, for block-causal attention, the config's `block_size`."""
        pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
        block_causal = ATTENTION[family] == "block_causal"
        return cls(family=family, mask_token_id=config.mask_token_id, eos_token_id=config.eos_token_id,
                   pad_token_id=pad, logits_shift=logits_shift, attention=ATTENTION[family],
                   block_size=config.block_size if block_causal else None, lora_targets=lora_targets,
                   eot_token_id=getattr(config, "eot_token_id", None))

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The tokens that end a response: EOS and, when there is one, the end-of-turn token."""
        return (self.eos_token_id,) if self.eot_token_id is None else (self.eos_token_id, self.eot_token_id)
