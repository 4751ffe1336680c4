"""Dream (Dream-org/Dream-v0-Base-7B, Dream-v0-Instruct-7B, DiffuCoder): a Qwen2-layout mask
predictor initialised from Qwen2.5, implemented natively with the original config and parameter
names (`model.embed_tokens`, `model.layers.{i}.self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`,
`input_layernorm`, `post_attention_layernorm`, `model.norm`, `lm_head`).

    h = x + o_proj(sdpa(rope(q_proj(n1(x))), rope(k_proj(.)), v_proj(.), bidirectional))   # q/k/v biased
    y = h + down_proj(silu(gate_proj(n2(h))) * up_proj(n2(h)))
    logits = lm_head(norm(y))                                              # untied

RMSNorm eps `rms_norm_eps` (normalised in float32, cast back, then weighted); default RoPE with
cos/sin computed in float32 and cast to the activation dtype; SDPA with the default scale.

**Shifted logits**: the output at position i-1 predicts token i (the AR head of Qwen2.5 kept).
`forward` returns the raw logits, exactly as the original; `dare.models.token_logits` re-aligns
them (the first position of every sequence, and of every packed sequence, keeps its own logit).

Deliberate differences from the original code:
1. A 2-D `attention_mask` is honoured (pads are never attended, positions follow
   `cumsum(mask) - 1`); the original expects the caller to build a 4-D mask. A 4-D bool mask is
   used as given, as in the original.
2. Only default RoPE (`rope_scaling: null`) and no sliding window, as every Dream checkpoint uses;
   other values are refused instead of half-implemented.
3. No `diffusion_generate` on the model class: generation is `dare.rollout`'s.
"""

from __future__ import annotations

from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from dare.models.registry import ModelFacts
from dare.models.blocks import QwenAttention, QwenConfig, QwenDecoderLayer, SwiGLU
from dare.models.core import DLLMPreTrainedModel, RMSNorm, Rotary


class DreamConfig(QwenConfig):
    model_type = "Dream"

    def __init__(self, mask_token_id: int = 151666, pad_token_id: int | None = 151643, use_cache: bool = False,
                 **kwargs):
        super().__init__(mask_token_id, pad_token_id, use_cache, **kwargs)


class DreamBaseModel(nn.Module):
    def __init__(self, config: DreamConfig):
        super().__init__()
        c = config
        head_dim = c.hidden_size // c.num_attention_heads
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.layers = nn.ModuleList(
            QwenDecoderLayer(c.hidden_size, c.rms_norm_eps,
                             QwenAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, head_dim,
                                           qkv_bias=True),
                             SwiGLU(c.hidden_size, c.intermediate_size))
            for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rope = Rotary(head_dim, c.rope_theta)


class DreamModel(DLLMPreTrainedModel):
    config_class = DreamConfig
    base_model_prefix = "model"
    _no_split_modules = ["QwenDecoderLayer"]

    def __init__(self, config: DreamConfig):
        if config.rope_scaling is not None or config.use_sliding_window or config.hidden_act != "silu":
            raise NotImplementedError(
                f"Dream config with rope_scaling={config.rope_scaling!r}, use_sliding_window="
                f"{config.use_sliding_window!r}, hidden_act={config.hidden_act!r}: only default RoPE, no sliding "
                "window and silu (as in the released checkpoints) are implemented")
        super().__init__(config)
        self.model = DreamBaseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()

    def decoder_parts(self):
        m = self.model
        return m.embed_tokens, m.layers, m.norm, self.lm_head, m.rope

    def dllm_facts(self) -> ModelFacts:
        return ModelFacts.read(self.config, "dream", LORA_TARGETS, logits_shift=True)


MODEL_CLASS = DreamModel
# Attention and MLP projections (a regex over module names, as peft's `target_modules`).
LORA_TARGETS = r".*\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))"

# The released Dream tokenizer's special tokens (Qwen2 vocabulary plus `<|mask|>`).
MASK_TOKEN = "<|mask|>"
END_OF_TURN = "<|im_end|>"  # Qwen2 chat template (DiffuCoder ends completions here)
SPECIAL_TOKENS = {"bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}


# The headline released checkpoint and its config, for `dare models`.
RELEASED = ("Dream-org/Dream-v0-Instruct-7B", dict(
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4, max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
    mask_token_id=151666, pad_token_id=151643, bos_token_id=151643, eos_token_id=151643))

def scratch_config(scratch, tokenizer) -> DreamConfig:
    """A small Dream config (grouped-query attention, 2 query heads per KV head) for `tokenizer`."""
    kv = scratch.n_heads // 2 if scratch.n_heads % 2 == 0 else scratch.n_heads
    return DreamConfig(
        vocab_size=len(tokenizer), hidden_size=scratch.d_model, intermediate_size=scratch.mlp_hidden_size,
        num_hidden_layers=scratch.n_layers, num_attention_heads=scratch.n_heads, num_key_value_heads=kv,
        max_position_embeddings=scratch.max_sequence_length, rope_theta=scratch.rope_theta,
        mask_token_id=tokenizer.convert_tokens_to_ids(MASK_TOKEN), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id, architectures=["DreamModel"],
    )


AutoConfig.register("Dream", DreamConfig, exist_ok=True)
AutoModel.register(DreamConfig, DreamModel, exist_ok=True)
AutoModelForCausalLM.register(DreamConfig, DreamModel, exist_ok=True)
