"""SDAR (JetLM/SDAR-1.7B/4B/8B-Chat, TraDo): block diffusion on the Qwen3 layout, implemented
natively with the original config and parameter names (exactly Qwen3's: `model.embed_tokens`,
`model.layers.{i}.self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm`, `mlp.{gate,up,down}_proj`,
`input_layernorm`, `post_attention_layernorm`, `model.norm`, `lm_head`).

    q, k = q_norm(q_proj(n1(x)) per head), k_norm(k_proj(n1(x)) per head)    # before RoPE
    h = x + o_proj(attention(rope(q), rope(k), v_proj(n1(x)), block-causal))
    y = h + down_proj(silu(gate_proj(n2(h))) * up_proj(n2(h)))
    logits = lm_head(norm(y))                                              # untied, no shift

**Block-causal attention**: a token sees every token of its own block and of earlier blocks
(block = position // `block_size`, blocks counted from the sequence's first token), as the
original's `tril(ones(nb, nb)).repeat_interleave(block_size)` mask. RMSNorm applies its weight
in float32 and casts once (the original calls flash-attn's `rms_norm_fn`); eps `rms_norm_eps`.
Default RoPE with cos/sin computed in float32 and cast to the activation dtype.

`block_size` and `mask_token_id` are not in the released config.json files; they default to the
released checkpoints' values (4 and 151669, `<|MASK|>`); the `-b8/-b16/-b32` checkpoints need
`block_size` set in their config.json.

Deliberate differences from the original code:
1. The attention mask is built here from `block_size` and a 2-D padding mask (the original
   expects the caller's 3-D bool mask and crashes without one; a 4-D bool mask is still accepted).
2. Training-mode forward does not compute a loss: `forward(block_diffusion=True)` takes
   `[x_t ; x_0]` and returns the x_t half's logits (or hidden states); losses live in the baselines.
3. flash-attn's RMSNorm kernel is replaced by the same arithmetic in torch (float32 throughout).
4. Only default RoPE and no sliding window (as released); other values are refused.
"""

from __future__ import annotations

from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from dare.models.registry import ModelFacts
from dare.models.blocks import QwenAttention, QwenConfig, QwenDecoderLayer, SwiGLU
from dare.models.core import DLLMPreTrainedModel, RMSNorm, Rotary


class SDARConfig(QwenConfig):
    model_type = "sdar"

    def __init__(self, head_dim: int | None = 128, attention_bias: bool = False, block_size: int = 4,
                 mask_token_id: int = 151669, pad_token_id: int | None = None, use_cache: bool = True, **kwargs):
        self.head_dim = head_dim if head_dim is not None else (kwargs.get("hidden_size", 4096)
                                                               // kwargs.get("num_attention_heads", 32))
        self.attention_bias = attention_bias
        self.block_size = block_size
        super().__init__(mask_token_id, pad_token_id, use_cache, **kwargs)


def check_supported(config) -> None:
    if config.rope_scaling is not None or config.use_sliding_window or config.hidden_act != "silu":
        raise NotImplementedError(
            f"{config.model_type} config with rope_scaling={config.rope_scaling!r}, use_sliding_window="
            f"{config.use_sliding_window!r}, hidden_act={config.hidden_act!r}: only default RoPE, no sliding window "
            "and silu (as in the released checkpoints) are implemented")
    if not isinstance(config.block_size, int) or config.block_size < 1:
        raise ValueError(f"{config.model_type} config: block_size must be a positive integer, "
                         f"got {config.block_size!r}")


def qwen3_attention(c) -> QwenAttention:
    return QwenAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                         qkv_bias=c.attention_bias, o_bias=c.attention_bias, qk_norm_eps=c.rms_norm_eps,
                         norm_weight_in_fp32=True)


class SDARModel(nn.Module):
    """Embedding, layers and final norm (`model.*`); `mlp_for(layer_idx)` builds each layer's MLP."""

    def __init__(self, c, mlp_for):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.layers = nn.ModuleList(
            QwenDecoderLayer(c.hidden_size, c.rms_norm_eps, qwen3_attention(c), mlp_for(i), norm_weight_in_fp32=True)
            for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, weight_in_fp32=True)
        self.rope = Rotary(c.head_dim, c.rope_theta)


class SDARForCausalLM(DLLMPreTrainedModel):
    config_class = SDARConfig
    base_model_prefix = "model"
    _no_split_modules = ["QwenDecoderLayer"]
    family = "sdar"

    def __init__(self, config):
        check_supported(config)
        super().__init__(config)
        self.model = SDARModel(config, self.mlp_for)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def mlp_for(self, layer_idx: int) -> nn.Module:
        return SwiGLU(self.config.hidden_size, self.config.intermediate_size)

    def dllm_block_size(self) -> int:
        return self.config.block_size

    def decoder_parts(self):
        m = self.model
        return m.embed_tokens, m.layers, m.norm, self.lm_head, m.rope

    def dllm_facts(self) -> ModelFacts:
        return ModelFacts.read(self.config, self.family, LORA_TARGETS)


MODEL_CLASS = SDARForCausalLM
# Attention and MLP projections (a regex over module names, as peft's `target_modules`).
LORA_TARGETS = r".*\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))"

# The released SDAR tokenizer's special tokens (Qwen3 vocabulary plus `<|MASK|>`).
MASK_TOKEN = "<|MASK|>"
END_OF_TURN = "<|im_end|>"  # Qwen3 chat template (SDAR-Chat stops on it: generation_config eos ids)
SPECIAL_TOKENS = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}


def tiny_common(scratch, tokenizer, block_size: int = 4) -> dict:
    kv = scratch.n_heads // 2 if scratch.n_heads % 2 == 0 else scratch.n_heads
    return dict(vocab_size=len(tokenizer), hidden_size=scratch.d_model, intermediate_size=scratch.mlp_hidden_size,
                num_hidden_layers=scratch.n_layers, num_attention_heads=scratch.n_heads, num_key_value_heads=kv,
                head_dim=scratch.d_model // scratch.n_heads, max_position_embeddings=scratch.max_sequence_length,
                rope_theta=scratch.rope_theta, block_size=block_size,
                mask_token_id=tokenizer.convert_tokens_to_ids(MASK_TOKEN), pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)


# The headline released checkpoint and its config, for `dare models`.
RELEASED = ("JetLM/SDAR-8B-Chat", dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, rope_theta=1000000, rms_norm_eps=1e-6, bos_token_id=151643,
    eos_token_id=151643))

def scratch_config(scratch, tokenizer) -> SDARConfig:
    """A small SDAR config (block size 4, grouped-query attention) for `tokenizer`."""
    return SDARConfig(**tiny_common(scratch, tokenizer), architectures=["SDARForCausalLM"])


AutoConfig.register("sdar", SDARConfig, exist_ok=True)
AutoModel.register(SDARConfig, SDARForCausalLM, exist_ok=True)
AutoModelForCausalLM.register(SDARConfig, SDARForCausalLM, exist_ok=True)
