"""LLaDA (GSAI-ML/LLaDA-8B-Base/Instruct, LLaDA-1.5, iLLaDA): a bidirectional Llama-style
mask predictor, implemented natively with the original parameter and config names so that
`from_pretrained(<downloaded folder>)` loads the released safetensors without remote code.

Architecture (the `llama` block type of the original `modeling_llada.py`):
    h = x + attn_out(attention(rope(q_proj(attn_norm(x))), rope(k_proj(.)), v_proj(.)))   # no causal mask
    y = h + ff_out(silu(ff_proj(ff_norm(h))) * up_proj(ff_norm(h)))
    logits = transformer.ff_out(ln_f(y))              # untied unless `weight_tying`
RMSNorm (eps `rms_norm_eps`, computed in float32), NeoX-style RoPE computed in float32
(`rope_full_precision`), no biases unless `include_bias`/`include_qkv_bias`, no logit shift:
`logits[:, i]` predicts token i.

Deliberate differences from the original code:
1. A 2-D `attention_mask` hides padded keys and positions follow `cumsum(mask) - 1`, so a
   left-padded row computes what the same row computes unpadded (the original numbers positions
   0..L-1 regardless of padding; with padded keys hidden, RoPE's relative form makes the two agree).
2. Only what the released LLaDA checkpoints use is implemented (the `llama` block, RMS norm with
   affine weights, RoPE, no input-embedding norm, no logit scaling, no QKV clipping, no attention
   layer norm); a config asking for another OLMo option raises a clear error instead of being
   silently ignored (`UNSUPPORTED` below).
3. The KV cache (`past_key_values`, Fast-dLLM's prefix and dual cache) holds keys after RoPE
   rather than before; every key keeps its own position, so the attention is the same.
4. `flash_attention: true` in a config (DARE's copies) selects the flash-attn backend when it is
   installed and falls back to SDPA with a notice otherwise.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PretrainedConfig

from dare.models.registry import ModelFacts
from dare.models.core import (
    DLLMPreTrainedModel, Layout, RMSNorm, apply_rope, attend, resolve_backend,
    Rotary,
)


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"

    def __init__(
        self,
        d_model: int = 4096,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        n_layers: int = 32,
        mlp_hidden_size: int | None = None,
        mlp_ratio: int = 4,
        vocab_size: int = 126464,
        embedding_size: int | None = 126464,
        max_sequence_length: int = 4096,
        rope: bool = True,
        rope_theta: float = 10000.0,
        rope_full_precision: bool = True,
        rms_norm_eps: float = 1e-5,
        layer_norm_type: str = "rms",
        block_type: str = "llama",
        activation_type: str = "silu",
        include_bias: bool = False,
        include_qkv_bias: bool = False,
        weight_tying: bool = False,
        init_std: float = 0.02,
        mask_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        **kwargs,
    ):
        if "num_experts" in kwargs or "hidden_size" in kwargs:
            # LLaDA-MoE's released config.json also says model_type "llada", so AutoConfig sends it here
            raise ValueError(
                "this config.json is LLaDA-MoE's (architectures LLaDAMoEModelLM: hidden_size/num_experts, "
                "model_type 'llada'), not LLaDA's (d_model/n_layers); load the folder with "
                "dare.models.load_pretrained(path) (or `dare models show`), which reads it as LLaDAMoEConfig, "
                "or set model_type to 'lladamoe' in config.json for AutoConfig/AutoModel")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.n_layers = n_layers
        self.mlp_hidden_size = mlp_hidden_size
        self.mlp_ratio = mlp_ratio
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.max_sequence_length = max_sequence_length
        self.rope = rope
        self.rope_theta = rope_theta
        self.rope_full_precision = rope_full_precision
        self.rms_norm_eps = rms_norm_eps
        self.layer_norm_type = layer_norm_type
        self.block_type = block_type
        self.activation_type = activation_type
        self.include_bias = include_bias
        self.include_qkv_bias = include_qkv_bias
        self.weight_tying = weight_tying
        self.init_std = init_std
        self.mask_token_id = mask_token_id
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         **kwargs)

    # transformers-generic names, for tools that read them
    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers

    @property
    def num_attention_heads(self) -> int:
        return self.n_heads


class LLaDALlamaBlock(nn.Module):
    def __init__(self, config: LLaDAConfig):
        super().__init__()
        d, h = config.d_model, config.n_heads
        kv = config.n_kv_heads or h
        self.n_heads, self.n_kv_heads, self.head_dim = h, kv, d // h
        hidden = config.mlp_hidden_size or config.mlp_ratio * d
        qkv_bias = config.include_bias or config.include_qkv_bias
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.ff_norm = RMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, h * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(d, kv * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d, kv * self.head_dim, bias=qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=config.include_bias)
        self.ff_proj = nn.Linear(d, hidden, bias=config.include_bias)  # gate, SiLU applied
        self.up_proj = nn.Linear(d, hidden, bias=config.include_bias)
        self.ff_out = nn.Linear(hidden, d, bias=config.include_bias)  # down

    def forward(self, x, cos_sin, layout: Layout, layer_idx: int):
        B, L, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(B, L, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        qf, kf = apply_rope(q.float(), k.float(), *cos_sin)  # rope_full_precision: float32, then cast back
        k, v = layout.cached(layer_idx, kf.to(k.dtype), v)
        x = x + self.attn_out(attend(qf.to(q.dtype), k, v, layout).reshape(B, L, -1))
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h)), None


class LLaDAModel(nn.Module):
    """Holds `transformer.{wte, blocks, ln_f, ff_out}` as in the original checkpoints."""

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.embedding_size or config.vocab_size, config.d_model),
            blocks=nn.ModuleList(LLaDALlamaBlock(config) for _ in range(config.n_layers)),
            ln_f=RMSNorm(config.d_model, config.rms_norm_eps),
        ))
        if not config.weight_tying:
            self.transformer["ff_out"] = nn.Linear(config.d_model, config.embedding_size or config.vocab_size,
                                                   bias=config.include_bias)
        self.weight_tying = config.weight_tying
        self.rope = Rotary(config.d_model // config.n_heads, config.rope_theta, full_precision=True)

    def head(self, x):
        t = self.transformer
        return F.linear(x, t.wte.weight) if self.weight_tying else t.ff_out(x)


# OLMo options of the original config class that this implementation does not support:
# name -> the only accepted value (a config omitting the key gets that value).
UNSUPPORTED = {"block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu", "rope": True,
               "alibi": False, "input_emb_norm": False, "scale_logits": False, "attention_layer_norm": False,
               "clip_qkv": None, "layer_norm_with_affine": True, "block_group_size": 1, "include_bias": False,
               "rope_full_precision": True, "multi_query_attention": None}


class LLaDAModelLM(DLLMPreTrainedModel):
    config_class = LLaDAConfig
    base_model_prefix = "model"
    _no_split_modules = ["LLaDALlamaBlock"]

    def __init__(self, config: LLaDAConfig):
        if getattr(config, "bias_for_layer_norm", None):
            raise NotImplementedError("LLaDA config bias_for_layer_norm=true: only norms without bias are implemented")
        for name, want in UNSUPPORTED.items():
            if getattr(config, name, want) != want:
                raise NotImplementedError(f"LLaDA config {name}={getattr(config, name)!r}: "
                                          f"only {want!r} is implemented")
        super().__init__(config)
        self.model = LLaDAModel(config)
        if getattr(config, "flash_attention", False):
            self.attn_backend = resolve_backend("flash_attention_2", explicit=False)
        self.post_init()

    def get_output_embeddings(self):
        t = self.model.transformer
        return t.wte if self.config.weight_tying else t.ff_out

    def logits_from_hidden(self, hidden):
        return self.model.head(hidden)  # a tied head is the embedding's weight as a linear map, not the embedding

    def decoder_parts(self):
        m, t = self.model, self.model.transformer
        return t.wte, t.blocks, t.ln_f, m.head, m.rope

    def dllm_facts(self) -> ModelFacts:
        c = self.config
        if c.mask_token_id is None:
            raise ValueError("LLaDA config has no mask_token_id; set it in config.json "
                             "(126336 for LLaDA-8B, 5 for iLLaDA)")
        return ModelFacts.read(c, "llada", LORA_TARGETS)


MODEL_CLASS = LLaDAModelLM
# The blocks' attention and MLP projections (a regex over module names, as peft's
# `target_modules`; plain suffixes would also catch the output head `transformer.ff_out`).
LORA_TARGETS = r".*\.blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)"


# The headline released checkpoint and its config (config.json of GSAI-ML/LLaDA-8B-Instruct),
# for `dare models` (parameter counts are taken on the meta device, nothing is allocated).
RELEASED = ("GSAI-ML/LLaDA-8B-Instruct", dict(
    d_model=4096, n_heads=32, n_kv_heads=32, n_layers=32, mlp_hidden_size=12288, vocab_size=126464,
    embedding_size=126464, max_sequence_length=4096, rope_theta=500000.0, rms_norm_eps=1e-5, mask_token_id=126336,
    eos_token_id=126081, pad_token_id=126081))

def scratch_config(scratch, tokenizer) -> LLaDAConfig:
    """A small LLaDA config whose vocabulary and special tokens come from `tokenizer`."""
    vocab = len(tokenizer)
    return LLaDAConfig(
        d_model=scratch.d_model, n_heads=scratch.n_heads, n_kv_heads=scratch.n_heads, n_layers=scratch.n_layers,
        mlp_hidden_size=scratch.mlp_hidden_size, vocab_size=vocab, embedding_size=vocab,
        max_sequence_length=scratch.max_sequence_length, rope_theta=scratch.rope_theta,
        init_std=0.02, mask_token_id=tokenizer.convert_tokens_to_ids(MASK_TOKEN),
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, architectures=["LLaDAModelLM"],
    )


# The special tokens of the released LLaDA tokenizer; tiny tokenizers reuse the same strings
# (EOS doubles as padding, as in LLaDA's SFT recipe).
MASK_TOKEN = "<|mdm_mask|>"
END_OF_TURN = "<|eot_id|>"  # LLaDA-8B-Instruct: 126348 ends a turn, <|endoftext|> (126081) pads after it
SPECIAL_TOKENS = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}

AutoConfig.register("llada", LLaDAConfig, exist_ok=True)
AutoModel.register(LLaDAConfig, LLaDAModelLM, exist_ok=True)
AutoModelForCausalLM.register(LLaDAConfig, LLaDAModelLM, exist_ok=True)
