"""The Qwen2/Qwen3 decoder layout shared by Dream, SDAR and SDAR-MoE, with the original
parameter names (`self_attn.{q,k,v,o}_proj`, optional `self_attn.{q,k}_norm`,
`mlp.{gate,up,down}_proj` or `mlp.gate` + `mlp.experts.{e}`, `input_layernorm`,
`post_attention_layernorm`). Only the attention rule (bidirectional or block-causal, see
`core.visible`) differs between the families.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dare.models.core import Layout, RMSNorm, apply_rope, attend


class QwenAttention(nn.Module):
    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, *, qkv_bias: bool,
                 o_bias: bool = False, qk_norm_eps: float | None = None, norm_weight_in_fp32: bool = False):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, n_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, n_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, n_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden, bias=o_bias)
        if qk_norm_eps is not None:  # Qwen3: RMSNorm over each head's dims, before RoPE
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, norm_weight_in_fp32)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, norm_weight_in_fp32)

    def forward(self, x: torch.Tensor, cos_sin, layout: Layout, layer_idx: int) -> torch.Tensor:
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, L, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q.transpose(1, 2), k.transpose(1, 2), *cos_sin)
        k, v = layout.cached(layer_idx, k, v)
        return self.o_proj(attend(q, k, v, layout).reshape(B, L, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SoftmaxTopKMoE(nn.Module):
    """Qwen3-MoE / OLMoE sparse block: softmax router in float32, top-k, optional renormalisation
    of the k weights, weights cast back to the activation dtype; experts are SwiGLU MLPs.
    With `expert_bias` (LLaDA-MoE) a persistent bias is added to the softmax probabilities
    before the top-k, and so also to the weights, as in the original."""

    def __init__(self, hidden: int, intermediate: int, n_experts: int, top_k: int, norm_topk_prob: bool,
                 expert_bias: bool = False):
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.gate = nn.Linear(hidden, n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(hidden, intermediate) for _ in range(n_experts))
        if expert_bias:
            self.register_buffer("expert_bias", torch.zeros(n_experts))

    def forward(self, x: torch.Tensor):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        router_logits = self.gate(x)
        weights = F.softmax(router_logits, dim=-1, dtype=torch.float)
        if hasattr(self, "expert_bias"):
            weights = weights + self.expert_bias
        weights, chosen = torch.topk(weights, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        return run_experts(self.experts, x, chosen, weights).reshape(shape), router_logits


def run_experts(experts: nn.ModuleList, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_k weights[t, k] * experts[chosen[t, k]](x[t]), computing each expert only on its tokens."""
    out = torch.zeros_like(x)
    for e in torch.unique(chosen).tolist():
        token, slot = torch.where(chosen == e)
        y = experts[e](x[token]) * weights[token, slot, None]
        out.index_add_(0, token, y.to(x.dtype))
    return out


class QwenDecoderLayer(nn.Module):
    def __init__(self, hidden: int, eps: float, attn: QwenAttention, mlp: nn.Module, norm_weight_in_fp32: bool = False):
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden, eps, norm_weight_in_fp32)
        self.post_attention_layernorm = RMSNorm(hidden, eps, norm_weight_in_fp32)

    def forward(self, x, cos_sin, layout: Layout, layer_idx: int):
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, layout, layer_idx)
        h = self.mlp(self.post_attention_layernorm(x))
        router_logits = None
        if isinstance(h, tuple):
            h, router_logits = h
        return x + h, router_logits
