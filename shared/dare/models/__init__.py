"""Model families. Facts about a family (mask id, logit shift, attention kind, block size) live
only here, read from the checkpoint's config; nothing outside `dare.models` hard-codes them.

`FAMILIES` maps our family name to its module and the `model_type` of the original checkpoints.
Importing this package does not import torch; the helpers below import the family on demand,
which registers its classes with transformers' Auto classes.
"""

from __future__ import annotations

from dare.models.registry import ATTENTION, FAMILIES, ModelFacts, family_module, register_all
from dare.models.api import (  # torch is imported inside the functions
    align, encode_chat, facts, load_pretrained, load_tokenizer, new_model, output_head, read_at, token_hidden,
    token_logits,
)

__all__ = ["ATTENTION", "FAMILIES", "ModelFacts", "family_module", "register_all", "align", "encode_chat", "facts",
           "load_pretrained", "load_tokenizer", "new_model", "output_head", "read_at", "token_hidden", "token_logits"]
