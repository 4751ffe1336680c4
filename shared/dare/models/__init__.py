"""Model families. Facts about a family (mask id, logit shift, attention kind, block size) live
only here, read from the checkpoint's config; nothing outside `dare.models` hard-codes them.

`FAMILIES` maps our family name to its module and the `model_type` of the original checkpoints.
Importing this package does not import torch; the helpers below import the family on demand,
which registers its classes with transformers' Auto classes.
"""

from __future__ import annotations

import importlib

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


from dare.models.api import (  # noqa: E402  (torch is imported inside the functions)
    align, encode_chat, facts, load_pretrained, load_tokenizer, new_model, output_head, token_hidden, token_logits,
)

__all__ = ["ATTENTION", "FAMILIES", "family_module", "register_all", "align", "encode_chat", "facts", "load_pretrained",
           "load_tokenizer", "new_model", "output_head", "token_hidden", "token_logits"]
