"""LLaDA2.0 / LLaDA2.1 (inclusionAI/LLaDA2.0-mini, LLaDA2.1-mini; the Ling-2.0 MoE layout):
block-diffusion MoE, implemented natively with the original config and parameter names
(`model.word_embeddings`, `model.layers.{i}.attention.{query_key_value,dense,query_layernorm,
key_layernorm}`, `mlp.{gate_proj,up_proj,down_proj}` for the first dense layers, `mlp.gate.weight`,
`mlp.gate.expert_bias`, `mlp.experts.{e}.*`, `mlp.shared_experts.*`, `model.norm`, `lm_head`).

    q, k, v = split(query_key_value(n1(x)) viewed as heads, [H, H_kv, H_kv])   # fused, no bias
    q, k = query_layernorm(q), key_layernorm(k)                               # per head, before RoPE
    h = x + dense(attention(partial_rope(q), partial_rope(k), v, block-causal))
    y = h + mlp(n2(h))            # layer < first_k_dense_replace: SwiGLU; else routed experts + shared expert
    logits = lm_head(norm(y)).float()

Router (`gate`): float32 linear, sigmoid scores; `expert_bias` is added for *selection only*;
group-limited top-k (each group scored by the sum of its top-2 experts, keep `topk_group` of
`n_group` groups, then the top `num_experts_per_tok` experts among them); the weights are the
unbiased scores of the chosen experts, divided by (their sum + 1e-20) and multiplied by
`routed_scaling_factor`. The weighted sum of the experts is taken in float32 in top-k order,
cast back, and the shared expert (width `moe_intermediate_size * num_shared_experts`) is added.
Partial RoPE: the first `head_dim * partial_rotary_factor` dims of each head are rotated (NeoX
style inside that slice), the rest pass through; cos/sin in float32 cast to the activation dtype.
RMSNorm eps `rms_norm_eps` (cast back before the weight).

Block-causal attention with `block_size` tokens per block (32, the block length the models were
trained and are decoded with; not in the released config.json, so it defaults to 32 here).

Deliberate differences from the original code:
1. The mask is strictly block-causal (0 / -inf). LLaDA2.1's reference `generate` passes a 0/1
   mask that the model *adds* to the scores, so future blocks are not hidden there; we follow
   the paper (and LLaDA2.0's 0/-inf mask).
2. The attention mask is built here from `block_size` and a 2-D padding mask; a 4-D bool mask
   is accepted as given. Keys the original code never reads (`norm_topk_prob`,
   `score_function`, `rotary_dim`, ...) are kept in the config but have no effect, as there.
3. No `generate` on the model class (generation is `dare.rollout`'s); no loss in `forward`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PretrainedConfig

from dare.models.registry import ModelFacts
from dare.models.blocks import Experts, SwiGLU
from dare.models.core import (
    DLLMPreTrainedModel, Layout, RMSNorm, Rotary, apply_rope, attend,
)


class LLaDA2MoeConfig(PretrainedConfig):
    model_type = "llada2_moe"
    rope_scaling = None  # a plain attribute here (transformers 5 turns it into `rope_parameters`)

    def __init__(
        self,
        vocab_size: int = 30592,
        hidden_size: int = 1024,
        intermediate_size: int | None = None,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 0,
        hidden_act: str = "silu",
        use_qkv_bias: bool = False,
        use_qk_norm: bool = False,
        use_bias: bool = True,
        rms_norm_eps: float = 1e-05,
        norm_head: bool = False,
        tie_word_embeddings: bool = False,
        embedding_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        output_dropout: float = 0.1,
        initializer_range: float = 0.02,
        max_position_embeddings: int = 16384,
        rope_theta: float = 10000.0,
        use_cache: bool = True,
        use_sliding_window: bool = False,
        sliding_window: int = 4096,
        max_window_layers: int = 28,
        rope_scaling: dict | None = None,
        pad_token_id: int = 126081,
        num_experts: int = 16,
        num_shared_experts: int = 0,
        num_experts_per_tok: int = 2,
        n_group: int = 8,
        topk_group: int = 4,
        routed_scaling_factor: float = 2.5,
        moe_intermediate_size: int | None = None,
        first_k_dense_replace: int = 0,
        head_dim: int | None = None,
        output_router_logits: bool = False,
        partial_rotary_factor: float = 0.5,
        block_size: int = 32,
        mask_token_id: int = 156895,
        eos_token_id: int | None = 156892,
        bos_token_id: int | None = None,
        **kwargs,
    ):
        self.num_hidden_layers = num_hidden_layers
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.use_qkv_bias = use_qkv_bias
        self.use_qk_norm = use_qk_norm
        self.use_bias = use_bias
        self.norm_head = norm_head
        self.rms_norm_eps = rms_norm_eps
        self.embedding_dropout = embedding_dropout
        self.attention_dropout = attention_dropout
        self.output_dropout = output_dropout
        self.initializer_range = initializer_range
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.use_cache = use_cache
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.max_window_layers = max_window_layers
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.rope_scaling = rope_scaling
        self.num_experts = num_experts
        self.num_shared_experts = num_shared_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.n_group = n_group
        self.topk_group = topk_group
        self.moe_intermediate_size = moe_intermediate_size
        self.first_k_dense_replace = first_k_dense_replace
        self.output_router_logits = output_router_logits
        self.routed_scaling_factor = routed_scaling_factor
        self.partial_rotary_factor = partial_rotary_factor
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)


class LLaDA2MoeAttention(nn.Module):
    def __init__(self, c: LLaDA2MoeConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.query_key_value = nn.Linear(c.hidden_size, (self.n_heads + 2 * self.n_kv_heads) * self.head_dim,
                                         bias=c.use_qkv_bias)
        self.query_layernorm = RMSNorm(self.head_dim, c.rms_norm_eps)
        self.key_layernorm = RMSNorm(self.head_dim, c.rms_norm_eps)
        self.dense = nn.Linear(self.n_heads * self.head_dim, c.hidden_size, bias=c.use_bias)

    def forward(self, x, cos_sin, layout: Layout, layer_idx: int):
        B, L, _ = x.shape
        qkv = self.query_key_value(x).view(B, L, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=-2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(self.query_layernorm(q), self.key_layernorm(k), *cos_sin)
        k, v = layout.cached(layer_idx, k, v)
        return self.dense(attend(q, k, v, layout).reshape(B, L, -1))


class LLaDA2MoeGate(nn.Module):
    def __init__(self, c: LLaDA2MoeConfig):
        super().__init__()
        self.top_k, self.n_group, self.topk_group = c.num_experts_per_tok, c.n_group, c.topk_group
        self.routed_scaling_factor = c.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(c.num_experts, c.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(c.num_experts))

    def forward(self, x: torch.Tensor):
        logits = F.linear(x.float(), self.weight.float())  # (T, E), float32 router
        scores = torch.sigmoid(logits)
        chosen = self.group_limited_topk(scores + self.expert_bias)  # the bias only steers selection
        weights = scores.gather(1, chosen)
        if self.top_k > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return chosen, weights * self.routed_scaling_factor, logits

    def group_limited_topk(self, scores: torch.Tensor) -> torch.Tensor:
        T, E = scores.shape
        group_scores = scores.view(T, self.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)  # (T, n_group)
        keep = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
        expert_mask = group_mask[:, :, None].expand(T, self.n_group, E // self.n_group).reshape(T, E)
        return torch.topk(scores.masked_fill(~expert_mask, float("-inf")), k=self.top_k, dim=-1)[1]


class LLaDA2MoeSparseMoeBlock(nn.Module):
    def __init__(self, c: LLaDA2MoeConfig):
        super().__init__()
        self.gate = LLaDA2MoeGate(c)
        self.experts = Experts(SwiGLU(c.hidden_size, c.moe_intermediate_size) for _ in range(c.num_experts))
        if c.num_shared_experts is not None:
            self.shared_experts = SwiGLU(c.hidden_size, c.moe_intermediate_size * c.num_shared_experts)

    def forward(self, x: torch.Tensor):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        chosen, weights, router_logits = self.gate(flat)
        per_slot = self.experts(flat, chosen)  # (T, k, H): each chosen expert's output
        y = (per_slot.float() * weights[..., None]).sum(dim=1).to(x.dtype).reshape(shape)
        if hasattr(self, "shared_experts"):
            y = y + self.shared_experts(x)
        return y, router_logits


class LLaDA2MoeDecoderLayer(nn.Module):
    def __init__(self, c: LLaDA2MoeConfig, layer_idx: int):
        super().__init__()
        self.attention = LLaDA2MoeAttention(c)
        sparse = c.num_experts is not None and layer_idx >= c.first_k_dense_replace
        self.mlp = LLaDA2MoeSparseMoeBlock(c) if sparse else SwiGLU(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos_sin, layout: Layout, layer_idx: int):
        x = x + self.attention(self.input_layernorm(x), cos_sin, layout, layer_idx)
        h = self.mlp(self.post_attention_layernorm(x))
        router_logits = None
        if isinstance(h, tuple):
            h, router_logits = h
        return x + h, router_logits


class LLaDA2MoeModel(nn.Module):
    def __init__(self, c: LLaDA2MoeConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.layers = nn.ModuleList(LLaDA2MoeDecoderLayer(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rope = Rotary(int(c.head_dim * c.partial_rotary_factor), c.rope_theta)


class LLaDA2MoeModelLM(DLLMPreTrainedModel):
    config_class = LLaDA2MoeConfig
    base_model_prefix = "model"
    _no_split_modules = ["LLaDA2MoeDecoderLayer"]

    def __init__(self, config: LLaDA2MoeConfig):
        if config.rope_scaling is not None or config.hidden_act != "silu":
            raise NotImplementedError(f"llada2_moe config with rope_scaling={config.rope_scaling!r}, hidden_act="
                                      f"{config.hidden_act!r}: only default RoPE and silu (as released) are "
                                      "implemented")
        if config.num_experts is not None and config.num_experts % config.n_group:
            raise ValueError(f"llada2_moe config: num_experts={config.num_experts} is not divisible by "
                             f"n_group={config.n_group}")
        super().__init__(config)
        self.model = LLaDA2MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, LLaDA2MoeGate):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            module.expert_bias.zero_()

    def dllm_block_size(self) -> int:
        return self.config.block_size

    def logits_from_hidden(self, hidden):
        return self.lm_head(hidden).float()  # the original returns float32 logits

    def decoder_parts(self):
        m = self.model
        return m.word_embeddings, m.layers, m.norm, self.logits_from_hidden, m.rope

    def dllm_facts(self) -> ModelFacts:
        return ModelFacts.read(self.config, "llada2", LORA_TARGETS)


MODEL_CLASS = LLaDA2MoeModelLM
# Attention and the dense/shared MLPs (a regex over module names, as peft's `target_modules`);
# the routed experts and the router stay frozen.
LORA_TARGETS = (r".*\.(attention\.(query_key_value|dense)|mlp\.(gate_proj|up_proj|down_proj)"
                r"|shared_experts\.(gate_proj|up_proj|down_proj))")

MASK_TOKEN = "<|mask|>"
END_OF_TURN = "<|role_end|>"  # Ling chat template: <role>HUMAN</role>...<|role_end|><role>ASSISTANT</role>
SPECIAL_TOKENS = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}


# The headline released checkpoint and its config (LLaDA2.0-mini has the same), for `dare models`.
RELEASED = ("inclusionAI/LLaDA2.1-mini", dict(
    vocab_size=157184, hidden_size=2048, intermediate_size=5120, num_hidden_layers=20, num_attention_heads=16,
    num_key_value_heads=4, head_dim=128, use_qk_norm=True, use_bias=False, rms_norm_eps=1e-6, rope_theta=600000,
    max_position_embeddings=32768, num_experts=256, num_shared_experts=1, num_experts_per_tok=8, n_group=8,
    topk_group=4, routed_scaling_factor=2.5, moe_intermediate_size=512, first_k_dense_replace=1,
    partial_rotary_factor=0.5, embedding_dropout=0.0, attention_dropout=0.0, output_dropout=0.0, pad_token_id=156892))

def scratch_config(scratch, tokenizer) -> LLaDA2MoeConfig:
    """A small LLaDA2 config: first layer dense, then 8 experts in 4 groups (keep 2), top-2,
    one shared expert, partial RoPE 0.5, block size 4."""
    kv = scratch.n_heads // 2 if scratch.n_heads % 2 == 0 else scratch.n_heads
    return LLaDA2MoeConfig(
        vocab_size=len(tokenizer), hidden_size=scratch.d_model, intermediate_size=scratch.mlp_hidden_size,
        num_hidden_layers=scratch.n_layers, num_attention_heads=scratch.n_heads, num_key_value_heads=kv,
        head_dim=scratch.d_model // scratch.n_heads, use_qk_norm=True, use_bias=False, rms_norm_eps=1e-6,
        embedding_dropout=0.0, attention_dropout=0.0, output_dropout=0.0,
        max_position_embeddings=scratch.max_sequence_length, rope_theta=scratch.rope_theta,
        num_experts=8, num_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
        moe_intermediate_size=max(8, scratch.mlp_hidden_size // 4), first_k_dense_replace=1, block_size=4,
        mask_token_id=tokenizer.convert_tokens_to_ids(MASK_TOKEN), pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, architectures=["LLaDA2MoeModelLM"],
    )


AutoConfig.register("llada2_moe", LLaDA2MoeConfig, exist_ok=True)
AutoModel.register(LLaDA2MoeConfig, LLaDA2MoeModelLM, exist_ok=True)
AutoModelForCausalLM.register(LLaDA2MoeConfig, LLaDA2MoeModelLM, exist_ok=True)
