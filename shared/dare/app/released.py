"""Models at a released checkpoint's shape with random weights, for the benchmarks (`dare bench rollout
--released`, `dare bench experts`, `dare bench gpu`): the family's released config (`RELEASED` in its module),
optionally narrowed (`SHRUNK`: the released layouts, heads, routing and block rule with tiny widths and depth, and
a small vocabulary, for `--device cpu`)."""

from __future__ import annotations

_QWEN_TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                  intermediate_size=128)
SHRUNK = {
    "llada": dict(d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=128),
    "dream": dict(_QWEN_TINY, head_dim=None),
    "sdar": dict(_QWEN_TINY, block_size=8),  # the block families: blocks of 8 (the configs' own field)
    "llada2": dict(_QWEN_TINY, moe_intermediate_size=32, block_size=8),
    "sdar_moe": dict(_QWEN_TINY, moe_intermediate_size=32, block_size=8),
    "lladamoe": dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, dense_intermediate_size=128,
                     expert_intermediate_size=32),
}
SHRUNK_VOCAB = 512


def released_config(family: str, **overrides):
    """(released name, model class, config): the family's released config (`RELEASED` in its module) with
    `overrides` on top (a value None drops the key)."""
    from dare.models import family_module

    module = family_module(family)
    name, kwargs = module.RELEASED
    kw = {k: v for k, v in {**kwargs, **overrides}.items() if v is not None}
    return name, module.MODEL_CLASS, module.MODEL_CLASS.config_class(**kw)


def build_released(family: str, device: str, dtype: str, shrink: bool):
    """(released name, model with random weights in `dtype` on `device`): the released shape, or SHRUNK."""
    import torch

    name, model_class, config = released_config(family, **(SHRUNK[family] if shrink else {}))
    if shrink:  # a small vocabulary, the special ids moved to its top (their order kept)
        vocab = SHRUNK_VOCAB
        ids = sorted({v for k, v in config.to_dict().items() if k.endswith("_token_id") and isinstance(v, int)})
        moved = {old: vocab - len(ids) + i for i, old in enumerate(ids)}
        for key, value in config.to_dict().items():
            if key.endswith("_token_id") and isinstance(value, int):
                setattr(config, key, moved[value])
        config.vocab_size = vocab
        if hasattr(config, "embedding_size"):
            config.embedding_size = vocab
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = model_class(config).eval()
    finally:
        torch.set_default_dtype(default)
    return name, model
