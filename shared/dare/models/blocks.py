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
from transformers import PretrainedConfig

from dare.models.core import Layout, RMSNorm, apply_rope, attend


class QwenConfig(PretrainedConfig):
    """The configuration Dream and SDAR share (their checkpoints' `config.json` fields, with Qwen2's defaults);
    each family's class sets its own defaults (mask, pad, `use_cache`) and adds its own fields."""

    keys_to_ignore_at_inference = ["past_key_values"]
    rope_scaling = None  # a plain attribute here (transformers 5 turns it into `rope_parameters`)

    def __init__(
        self,
        mask_token_id: int,
        pad_token_id: int | None,
        use_cache: bool,
        vocab_size: int = 151936,
        hidden_size: int = 4096,
        intermediate_size: int = 22016,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 32,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        rope_theta: float = 10000.0,
        rope_scaling: dict | None = None,
        use_sliding_window: bool = False,
        sliding_window: int | None = 4096,
        max_window_layers: int = 28,
        attention_dropout: float = 0.0,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window if use_sliding_window else None
        self.max_window_layers = max_window_layers
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.attention_dropout = attention_dropout
        self.mask_token_id = mask_token_id
        super().__init__(tie_word_embeddings=tie_word_embeddings, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, **kwargs)
        self.pad_token_id = pad_token_id


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
    before the top-k, and so also to the weights, as in the original.

    Each chosen expert's output times its weight is summed per token in the activation dtype, in
    ascending expert order (the original's `index_add_` loop over the experts)."""

    def __init__(self, hidden: int, intermediate: int, n_experts: int, top_k: int, norm_topk_prob: bool,
                 expert_bias: bool = False):
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.gate = nn.Linear(hidden, n_experts, bias=False)
        self.experts = Experts(SwiGLU(hidden, intermediate) for _ in range(n_experts))
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
        y = self.experts(x, chosen) * weights[..., None]  # (T, k, H)
        order = chosen.argsort(dim=-1)  # each token's experts in ascending id: the original's order of sums
        y = y.gather(1, order[..., None].expand_as(y))
        out = torch.zeros_like(x)
        for slot in range(self.top_k):  # k adds in sequence (top_k <= 8 in every released config)
            out = out + y[:, slot]
        return out.reshape(shape), router_logits


PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows of `x` (N, in) sorted by group, group g being rows [offsets[g-1], offsets[g]); -> (N, out)
    with row r of group g = x[r] @ w[g].T (w: (G, out, in)). `torch._grouped_mm` where the running torch
    has it (one kernel, no host sync: CUTLASS for bfloat16 on sm90+; torch's own per-group fallback
    otherwise), else (an older torch, or float64) one matmul per group after one host read of the offsets."""
    if hasattr(torch, "_grouped_mm") and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return torch._grouped_mm(x, w.transpose(1, 2), offs=offsets)
    out, start = x.new_empty(x.shape[0], w.shape[1]), 0
    for g, end in enumerate(offsets.tolist()):
        out[start:end] = x[start:end] @ w[g].T
        start = end
    return out


class Experts(nn.ModuleList):
    """The routed experts of a MoE layer: a list of SwiGLU MLPs, so that the checkpoints' names
    (`experts.{e}.{gate,up,down}_proj.weight`) are the parameters' names, run as grouped matrix
    products: `experts(x, chosen)` -> (T, k, H), slot j of token t being `experts[chosen[t, j]](x[t])`.

    Tokens are sorted by expert (on the device: no host sync), each projection is one grouped
    product over the (E, out, in) stack of the experts' weights, and the outputs are unsorted.
    Without weight gradients (a rollout, or frozen experts under LoRA) the stack is the parameters'
    own storage: the first such forward re-points each expert's weights into one stacked tensor per
    projection (`pack`, same memory, same `Parameter` objects), unless the weights are views of a larger
    buffer (FSDP's gathered parameters), where the stack is built per forward. With weight gradients
    it is built per forward with `torch.stack`, so the gradients reach each expert's parameters.
    `impl = "loop"` runs one expert after another (the former implementation; the reference of the
    tests and of `dare bench experts`)."""

    impl = "grouped"

    def forward(self, x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        if self.impl == "loop":
            return self._loop(x, chosen)
        T, k = chosen.shape
        experts, order = chosen.reshape(-1).sort(stable=True)  # (T * k,) slots sorted by expert
        # where each expert's rows end (searchsorted, not bincount: CUDA's bincount reads the maximum on the host)
        offsets = torch.searchsorted(experts, torch.arange(len(self), device=experts.device), right=True)
        offsets = offsets.to(torch.int32)
        rows = x[order // k]
        gate, up, down = self.stacked()
        h = F.silu(grouped_mm(rows, gate, offsets)) * grouped_mm(rows, up, offsets)
        y = grouped_mm(h, down, offsets)
        return torch.empty_like(y).index_copy_(0, order, y).view(T, k, -1)

    def _loop(self, x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(*chosen.shape, x.shape[-1])
        for e in torch.unique(chosen).tolist():
            token, slot = torch.where(chosen == e)
            out[token, slot] = self[e](x[token])
        return out

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(E, out, in) weights of the three projections."""
        first = self[0].gate_proj.weight
        if torch.is_grad_enabled() and first.requires_grad:
            return tuple(torch.stack([getattr(e, p).weight for e in self]) for p in PROJECTIONS)
        if torch.compiler.is_compiling() and "_stacks" in self.__dict__:
            return self.__dict__["_stacks"]  # (a captured step: packed by the eager warm-up; no pointer checks)
        if not self._packed() and not self.pack():
            return tuple(torch.stack([getattr(e, p).weight.detach() for e in self]) for p in PROJECTIONS)
        return self.__dict__["_stacks"]

    def _packed(self) -> bool:
        stacks = self.__dict__.get("_stacks")
        if stacks is None:
            return False
        last = len(self) - 1
        return all(getattr(self[i], p).weight.data_ptr() == s[i].data_ptr()
                   for s, p in zip(stacks, PROJECTIONS) for i in (0, last))

    def pack(self) -> bool:
        """Make each expert's weights views of one (E, out, in) tensor per projection; False (and nothing
        done) where a weight does not own its storage or the experts' weights differ in dtype or device."""
        stacks = []
        for p in PROJECTIONS:
            ws = [getattr(e, p).weight for e in self]
            if any(w.untyped_storage().nbytes() != w.nbytes or w.storage_offset() or not w.is_contiguous()
                   or w.dtype != ws[0].dtype or w.device != ws[0].device or type(w) is not nn.Parameter
                   for w in ws):
                return False
            stack = torch.stack([w.detach() for w in ws])
            for w, view in zip(ws, stack):
                w.data = view
            stacks.append(stack)
        self.__dict__["_stacks"] = tuple(stacks)
        return True

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .half(): the stacks are rebuilt at the next pack
        self.__dict__.pop("_stacks", None)
        return super()._apply(fn, recurse)

    def __getstate__(self):  # a copy (deepcopy, pickle) packs its own weights again
        state = dict(super().__getstate__())
        state.pop("_stacks", None)
        return state


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
