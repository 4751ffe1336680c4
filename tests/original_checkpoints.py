"""Folders shaped like the released checkpoints, at tiny sizes: config.json with the released key
set (values from the published config.json files, dimensions shrunk) and safetensors whose keys
are written here from the published weight indexes, not taken from our modules.

Sources of the key sets: LLaDA-8B-Instruct, Dream-v0-Instruct-7B, SDAR-1.7B-Chat,
SDAR-30B-A3B-Chat and LLaDA2.1-mini config.json / model.safetensors.index.json
(../shared/reference/peers.md section 1 and the modeling files named there).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

H, LAYERS, HEADS, KV, HEAD_DIM, FFN, VOCAB, EXPERTS, EXPERT_FFN = 32, 2, 4, 2, 8, 48, 40, 8, 16

CONFIGS = {
    "llada": {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM", "AutoModel": "modeling_llada.LLaDAModelLM"},
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": H,
        "embedding_dropout": 0.0, "embedding_size": VOCAB, "eos_token_id": 38, "flash_attention": False,
        "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
        "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
        "layer_norm_with_affine": True, "mask_token_id": 39, "max_sequence_length": 64, "mlp_hidden_size": FFN,
        "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": HEADS, "n_kv_heads": HEADS,
        "n_layers": LAYERS, "pad_token_id": 38, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
        "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
        "transformers_version": "4.46.3", "use_cache": False, "vocab_size": VOCAB, "weight_tying": False,
    },
    "dream": {
        "architectures": ["DreamModel"], "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "bos_token_id": 37, "eos_token_id": 37, "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02,
        "intermediate_size": FFN, "mask_token_id": 39, "max_position_embeddings": 131072, "max_window_layers": 28,
        "model_type": "Dream", "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "num_key_value_heads": KV,
        "pad_token_id": 37, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.46.2", "use_cache": False, "use_sliding_window": False, "vocab_size": VOCAB,
    },
    "sdar": {  # SDAR-1.7B-Chat: no block_size or mask_token_id in the released file
        "architectures": ["SDARForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                     "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
        "bos_token_id": 37, "eos_token_id": 37, "fuse_cross_entropy": False, "head_dim": HEAD_DIM,
        "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02, "intermediate_size": FFN,
        "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "sdar",
        "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "num_key_value_heads": KV, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.52.4", "use_cache": True, "use_sliding_window": False,
        "vocab_size": VOCAB,
    },
    "sdar_moe": {  # SDAR-30B-A3B-Chat
        "architectures": ["SDARMoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_sdar_moe.SDARMoeConfig",
                     "AutoModel": "modeling_sdar_moe.SDARMoeModel",
                     "AutoModelForCausalLM": "modeling_sdar_moe.SDARMoeForCausalLM"},
        "bos_token_id": 37, "decoder_sparse_step": 1, "eos_token_id": 37, "head_dim": HEAD_DIM, "hidden_act": "silu",
        "hidden_size": H, "initializer_range": 0.02, "intermediate_size": FFN, "max_position_embeddings": 32768,
        "max_window_layers": 48, "mlp_only_layers": [], "model_type": "sdar_moe", "moe_intermediate_size": EXPERT_FFN,
        "norm_topk_prob": True, "num_attention_heads": HEADS, "num_experts": EXPERTS, "num_experts_per_tok": 2,
        "num_hidden_layers": LAYERS, "num_key_value_heads": KV, "output_router_logits": False, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": VOCAB,
    },
    "llada2": {  # LLaDA2.1-mini (the same keys as LLaDA2.0-mini)
        "architectures": ["LLaDA2MoeModelLM"], "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                     "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                     "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
        "dtype": "bfloat16", "embedding_dropout": 0.0, "first_k_dense_replace": 1, "head_dim": HEAD_DIM,
        "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02, "intermediate_size": FFN,
        "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "llada2_moe",
        "moe_intermediate_size": EXPERT_FFN, "moe_router_enable_expert_bias": True, "n_group": 4, "norm_head": False,
        "norm_softmax": False, "norm_topk_prob": True, "num_attention_heads": HEADS, "num_experts": EXPERTS,
        "num_experts_per_tok": 2, "num_hidden_layers": LAYERS, "num_key_value_heads": KV, "num_shared_experts": 1,
        "output_dropout": 0.0, "output_router_logits": False, "pad_token_id": 37, "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 600000, "rotary_dim": HEAD_DIM // 2,
        "routed_scaling_factor": 2.5, "router_dtype": "fp32", "score_function": "sigmoid", "sliding_window": 4096,
        "tie_word_embeddings": False, "topk_group": 2, "transformers_version": "4.57.1", "use_bias": False,
        "use_cache": False, "use_qk_norm": True, "use_qkv_bias": False, "use_rmsnorm": True,
        "use_sliding_window": False, "using_split_qkv_in_self_attention": False, "vocab_size": VOCAB,
    },
    # LLaDA-MoE: the released file says model_type "llada" (dllm renames it "lladamoe"); key set
    # from the vendored configuration_lladamoe.py, values partly unverified (see lladamoe.py)
    "lladamoe": {
        "architectures": ["LLaDAMoEModelLM"], "attention_bias": False, "attention_dropout": 0.0, "clip_qkv": None,
        "dense_intermediate_size": FFN, "eos_token_id": 38, "expert_intermediate_size": EXPERT_FFN,
        "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02, "max_position_embeddings": 8192,
        "model_type": "llada", "moe_layer_freq": [1] * LAYERS, "moe_router_enable_expert_bias": True,
        "norm_topk_prob": False, "num_attention_heads": HEADS, "num_experts": EXPERTS, "num_experts_per_tok": 2,
        "num_hidden_layers": LAYERS, "num_key_value_heads": HEADS, "output_router_logits": False,
        "pad_token_id": 38, "partial_rotary_factor": 1.0, "qk_layernorm": True, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 50000, "router_aux_loss_coef": 0.01,
        "shared_expert_intermediate_size": None,
        "tie_word_embeddings": False, "use_cache": False, "vocab_size": VOCAB,
    },
}


def _swiglu(prefix: str, width: int) -> dict:
    return {f"{prefix}.gate_proj.weight": (width, H), f"{prefix}.up_proj.weight": (width, H),
            f"{prefix}.down_proj.weight": (H, width)}


def weight_shapes(family: str) -> dict[str, tuple]:
    """Every tensor of the released checkpoint layout, by original name, at the tiny sizes above."""
    q, kv = HEADS * HEAD_DIM, KV * HEAD_DIM
    w: dict[str, tuple] = {}
    if family == "llada":
        w = {"model.transformer.wte.weight": (VOCAB, H), "model.transformer.ln_f.weight": (H,),
             "model.transformer.ff_out.weight": (VOCAB, H)}
        for i in range(LAYERS):
            p = f"model.transformer.blocks.{i}"
            w |= {f"{p}.attn_norm.weight": (H,), f"{p}.ff_norm.weight": (H,), f"{p}.q_proj.weight": (H, H),
                  f"{p}.k_proj.weight": (H, H), f"{p}.v_proj.weight": (H, H), f"{p}.attn_out.weight": (H, H),
                  f"{p}.ff_proj.weight": (FFN, H), f"{p}.up_proj.weight": (FFN, H), f"{p}.ff_out.weight": (H, FFN)}
        return w
    if family == "llada2":
        w = {"model.word_embeddings.weight": (VOCAB, H), "model.norm.weight": (H,), "lm_head.weight": (VOCAB, H)}
        for i in range(LAYERS):
            p = f"model.layers.{i}"
            w |= {f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,),
                  f"{p}.attention.query_key_value.weight": (q + 2 * kv, H), f"{p}.attention.dense.weight": (H, q),
                  f"{p}.attention.query_layernorm.weight": (HEAD_DIM,),
                  f"{p}.attention.key_layernorm.weight": (HEAD_DIM,)}
            if i == 0:  # first_k_dense_replace = 1
                w |= _swiglu(f"{p}.mlp", FFN)
            else:
                w |= {f"{p}.mlp.gate.weight": (EXPERTS, H), f"{p}.mlp.gate.expert_bias": (EXPERTS,)}
                for e in range(EXPERTS):
                    w |= _swiglu(f"{p}.mlp.experts.{e}", EXPERT_FFN)
                w |= _swiglu(f"{p}.mlp.shared_experts", EXPERT_FFN)
        return w
    # Qwen2 (Dream) / Qwen3 (SDAR) / Qwen3-MoE (SDAR-MoE) / OLMoE (LLaDA-MoE) names
    heads_dim = q
    kv_dim = H if family == "lladamoe" else kv
    w = {"model.embed_tokens.weight": (VOCAB, H), "model.norm.weight": (H,), "lm_head.weight": (VOCAB, H)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        w |= {f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,),
              f"{p}.self_attn.q_proj.weight": (heads_dim, H), f"{p}.self_attn.k_proj.weight": (kv_dim, H),
              f"{p}.self_attn.v_proj.weight": (kv_dim, H), f"{p}.self_attn.o_proj.weight": (H, heads_dim)}
        if family == "dream":
            w |= {f"{p}.self_attn.q_proj.bias": (heads_dim,), f"{p}.self_attn.k_proj.bias": (kv_dim,),
                  f"{p}.self_attn.v_proj.bias": (kv_dim,)}
        else:
            w |= {f"{p}.self_attn.q_norm.weight": (HEAD_DIM,), f"{p}.self_attn.k_norm.weight": (HEAD_DIM,)}
        if family == "lladamoe":
            w[f"{p}.mlp.expert_bias"] = (EXPERTS,)
        if family in ("sdar_moe", "lladamoe"):
            w[f"{p}.mlp.gate.weight"] = (EXPERTS, H)
            for e in range(EXPERTS):
                w |= _swiglu(f"{p}.mlp.experts.{e}", EXPERT_FFN)
        else:
            w |= _swiglu(f"{p}.mlp", FFN)
    return w


def write_original_folder(family: str, folder: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """A checkpoint folder in the released format with random weights; returns the tensors written."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in weight_shapes(family).items():
        if name.endswith("norm.weight") or "layernorm" in name:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("expert_bias"):
            t = 0.05 * torch.randn(shape, generator=g)
        else:
            t = 0.2 * torch.randn(shape, generator=g)
        tensors[name] = t.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(CONFIGS[family], indent=2))
    return tensors
