"""LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B-Base/Instruct): a bidirectional OLMoE-style mask
predictor trained from scratch, implemented from the structure of its released modeling code
(as vendored by ZHZisZZ/dllm, `model_type` "lladamoe"), with the original parameter names
(`model.embed_tokens`, `model.layers.{i}.self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm`,
`mlp.gate`, `mlp.experts.{e}.{gate,up,down}_proj`, optional `mlp.expert_bias`,
`input_layernorm`, `post_attention_layernorm`, `model.norm`, `lm_head`).

    q, k = q_norm(q_proj(n1(x))), k_norm(k_proj(n1(x)))       # per head (weight of size head_dim), before RoPE
    h = x + o_proj(attention(rope(q), rope(k), v_proj(n1(x)), bidirectional))
    y = h + moe(n2(h))                                        # or a dense SwiGLU where moe_layer_freq[i] == 0
    logits = lm_head(norm(y))                                 # untied, no shift

Router: softmax in float32 over `gate(x)`, plus `expert_bias` when enabled (the bias changes the
weights too, as in the original), top-k, *no* renormalisation (the original hard-codes
`norm_topk_prob = False`), weights cast to the activation dtype.

What could not be established from public sources, and how it is handled:
- The released config.json (vocabulary size, eps, rope theta, special ids, whether the expert
  bias is enabled) was not readable; defaults follow the vendored config class and a tiny config
  is used in tests. The mask id (156895) is not in the released config; it is the default here.
- The released config.json says `model_type: "llada"` (dllm tells users to change it to
  "lladamoe"). `dare.models.load_pretrained` accepts either: a `llada` config whose architecture
  is `LLaDAMoEModelLM` is loaded with this class.
- The optional shared expert's parameter names are unverified and no released checkpoint is known
  to have one, so `shared_expert_intermediate_size` must be null; `clip_qkv` is refused likewise.
"""

from __future__ import annotations

from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PretrainedConfig

from dare.models.registry import ModelFacts
from dare.models.blocks import QwenAttention, QwenDecoderLayer, SoftmaxTopKMoE, SwiGLU
from dare.models.core import DLLMPreTrainedModel, RMSNorm, Rotary


class LLaDAMoEConfig(PretrainedConfig):
    model_type = "lladamoe"
    rope_scaling = None  # a plain attribute here (transformers 5 turns it into `rope_parameters`)

    def __init__(
        self,
        vocab_size: int = 157184,
        hidden_size: int = 2048,
        dense_intermediate_size: int = 8192,
        expert_intermediate_size: int = 1024,
        shared_expert_intermediate_size: int | None = None,
        num_hidden_layers: int = 16,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-05,
        use_cache: bool = False,
        pad_token_id: int | None = 156892,
        bos_token_id: int | None = None,
        eos_token_id: int | None = 156892,
        tie_word_embeddings: bool = False,
        rope_theta: float = 50000.0,
        partial_rotary_factor: float = 1.0,
        rope_scaling: dict | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        clip_qkv: float | None = None,
        num_experts_per_tok: int = 8,
        num_experts: int = 64,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.01,
        norm_topk_prob: bool | None = None,
        qk_layernorm: bool = True,
        moe_layer_freq: list[int] | None = None,
        moe_router_enable_expert_bias: bool | None = None,
        moe_router_score_function: str | None = None,
        routed_scaling_factor: float = 1,
        router_num_group: int = -2,
        router_topk_group: int = -2,
        mask_token_id: int = 156895,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.dense_intermediate_size = dense_intermediate_size
        self.expert_intermediate_size = expert_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        self.rope_scaling = rope_scaling
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.clip_qkv = clip_qkv
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.norm_topk_prob = norm_topk_prob
        self.qk_layernorm = qk_layernorm
        self.moe_layer_freq = [1] * num_hidden_layers if not moe_layer_freq else moe_layer_freq
        self.moe_router_enable_expert_bias = moe_router_enable_expert_bias
        self.moe_router_score_function = moe_router_score_function
        self.routed_scaling_factor = routed_scaling_factor
        self.router_num_group = router_num_group
        self.router_topk_group = router_topk_group
        self.mask_token_id = mask_token_id
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)


class LLaDAMoEModel(nn.Module):
    def __init__(self, c: LLaDAMoEConfig):
        super().__init__()
        head_dim = c.hidden_size // c.num_attention_heads
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.layers = nn.ModuleList(
            QwenDecoderLayer(
                c.hidden_size, c.rms_norm_eps,
                QwenAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, head_dim,
                              qkv_bias=c.attention_bias, o_bias=c.attention_bias,
                              qk_norm_eps=c.rms_norm_eps if c.qk_layernorm else None),
                SoftmaxTopKMoE(c.hidden_size, c.expert_intermediate_size, c.num_experts, c.num_experts_per_tok,
                               norm_topk_prob=False, expert_bias=bool(c.moe_router_enable_expert_bias))
                if c.moe_layer_freq[i] == 1 else SwiGLU(c.hidden_size, c.dense_intermediate_size))
            for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rope = Rotary(int(head_dim * c.partial_rotary_factor), c.rope_theta)


class LLaDAMoEModelLM(DLLMPreTrainedModel):
    config_class = LLaDAMoEConfig
    base_model_prefix = "model"
    _no_split_modules = ["QwenDecoderLayer"]

    def __init__(self, config: LLaDAMoEConfig):
        c = config
        if c.rope_scaling is not None or c.hidden_act != "silu" or c.clip_qkv is not None:
            raise NotImplementedError(f"lladamoe config with rope_scaling={c.rope_scaling!r}, hidden_act="
                                      f"{c.hidden_act!r}, clip_qkv={c.clip_qkv!r}: not implemented")
        if c.shared_expert_intermediate_size is not None:
            raise NotImplementedError("lladamoe config with a shared expert: its parameter names could not be "
                                      "established from public sources; set shared_expert_intermediate_size to null")
        if len(c.moe_layer_freq) != c.num_hidden_layers:
            raise ValueError(f"lladamoe config: moe_layer_freq has {len(c.moe_layer_freq)} entries for "
                             f"{c.num_hidden_layers} layers")
        super().__init__(config)
        self.model = LLaDAMoEModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def decoder_parts(self):
        m = self.model
        return m.embed_tokens, m.layers, m.norm, self.lm_head, m.rope

    def dllm_facts(self) -> ModelFacts:
        return ModelFacts.read(self.config, "lladamoe", LORA_TARGETS)


MODEL_CLASS = LLaDAMoEModelLM
# Attention projections and any dense MLP layer (a regex over module names, as peft's
# `target_modules`); the router and the routed experts stay frozen.
LORA_TARGETS = r".*\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))"

MASK_TOKEN = "<|mask|>"
END_OF_TURN = "<|role_end|>"  # the Ling tokenizer LLaDA-MoE shares with LLaDA2 (used only if the tokenizer has it)
SPECIAL_TOKENS = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}


# The released checkpoint with the dimensions reported publicly (unverified: see the docstring).
RELEASED = ("inclusionAI/LLaDA-MoE-7B-A1B-Instruct (dimensions unverified)", dict(
    vocab_size=157184, hidden_size=2048, dense_intermediate_size=8192, expert_intermediate_size=1024,
    num_hidden_layers=16, num_attention_heads=16, num_experts=64, num_experts_per_tok=8, rope_theta=50000.0))

def scratch_config(scratch, tokenizer) -> LLaDAMoEConfig:
    """A small LLaDA-MoE config: 8 experts, top-2, every layer sparse, QK-norm."""
    return LLaDAMoEConfig(
        vocab_size=len(tokenizer), hidden_size=scratch.d_model, dense_intermediate_size=scratch.mlp_hidden_size,
        expert_intermediate_size=max(8, scratch.mlp_hidden_size // 4), num_hidden_layers=scratch.n_layers,
        num_attention_heads=scratch.n_heads, max_position_embeddings=scratch.max_sequence_length,
        rope_theta=scratch.rope_theta, num_experts=8, num_experts_per_tok=2,
        mask_token_id=tokenizer.convert_tokens_to_ids(MASK_TOKEN), pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, architectures=["LLaDAMoEModelLM"],
    )


AutoConfig.register("lladamoe", LLaDAMoEConfig, exist_ok=True)
AutoModel.register(LLaDAMoEConfig, LLaDAMoEModelLM, exist_ok=True)
AutoModelForCausalLM.register(LLaDAMoEConfig, LLaDAMoEModelLM, exist_ok=True)
