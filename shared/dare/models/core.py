"""Pieces every family shares: RMSNorm, rotary embeddings, the attention layout (which key each
query may see, at which position), the attention backends and the KV cache.

A forward pass builds one `Layout` from its inputs and hands it to every attention layer:

    layout = make_layout(model, input_ids, attention_mask, ...)     # once per forward
    q, k = rope(q, k, layout.positions)                             # in each layer
    k, v = layout.cached(layer_idx, k, v)                           # prepend / replace cached keys
    out = attend(q, k, v, layout)                                   # SDPA, FlexAttention or flash-attn

Visibility rule (one function, `visible`, used by every backend): a query sees a key when the key
is a real token (not padding), both belong to the same packed sequence, and the family's block
rule allows it: always for bidirectional models; for block-causal models (SDAR, LLaDA2) when the
key's block is not later than the query's (block = position // block_size). The block-diffusion
training layout `[x_t ; x_0]` (BD3-LM / SDAR) adds the three rules: x_t sees only its own block of
x_t, x_t sees strictly earlier blocks of x_0, x_0 is block-causal over x_0 and never sees x_t.
Padded query rows see every key (so no row is empty); their outputs are never used.

Backends. No mask is passed where every query sees every key (an unpadded bidirectional input, one block
read over a cache that ends on a block boundary); key padding alone where the block rule hides nothing.
Otherwise the rule is kept as per-token vectors (`Visibility`): SDPA and flash-attn's fallback take the
dense (B, 1, Lq, Lk) mask made from them, FlexAttention a block mask whose mask_mod indexes them (built
once per forward, compiled on CUDA). On CUDA SDPA stays on its fused kernels: grouped-query attention that
no fused kernel takes (a mask, or float32) repeats the key/value heads first; `fused_attention_only()`
makes a call that would need the math kernel fail instead.

Sequence parallelism (Ulysses, `sequence_parallel(group)` around a forward): every rank of the group
holds the whole input and its layout, but embeds, runs the layers on, and keeps the activations of only
its contiguous 1/P of the positions; in attention an all-to-all trades the sequence split for a head
split (each rank attends over all positions with H/P heads) and a second one trades back; after the
last layer the hidden states are gathered, so the head and the loss see the whole sequence on every
rank. The gradient of the gather returns each rank its own positions' share: summed over the group
(FSDP's reduction, or an all-reduce) the gradients of the parameters before the gather are the
single-process ones. What comes after the gather (the output head, or any head a caller applies to the
hidden states, such as a chunked loss or a value head) runs in full on every rank, so its gradient is the
single-process one on each rank: divide it by the group size before summing (`Trainer.step` does, for the
model's output head and value head). Router logits (MoE auxiliary losses) are not supported.

Blocks are counted in each row's own positions (`cumsum(attention_mask) - 1`), so a padded row
computes exactly what it computes alone. A batch decoded chunk by chunk through the cache must
therefore left-pad each row by a multiple of `block_size`, so that block boundaries fall on the
same columns in every row (the originals decode one sequence at a time, where the two agree).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import warnings
import weakref
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

# ------------------------------------------------------------------------------------------------
# Norm and rotary embedding


class RMSNorm(nn.Module):
    """`weight * (x / rms(x))`, normalised in float32. By default the result is cast back to the
    input dtype before the weight is applied (the Llama/Qwen2 formula); `weight_in_fp32=True`
    applies the weight in float32 and casts once (flash-attn's `rms_norm_fn`, used by SDAR).
    The two agree exactly in float32."""

    def __init__(self, dim: int, eps: float, weight_in_fp32: bool = False):
        super().__init__()
        self.eps, self.weight_in_fp32 = eps, weight_in_fp32
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_in_fp32:
            return (x * self.weight.float()).to(dtype)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin of NeoX-style rotary embeddings, computed in float32, shaped (B, 1, L, rotary_dim)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=positions.device)
                                .float() / rotary_dim))
    freqs = positions.float()[..., None] * inv_freq  # (B, L, rotary_dim / 2)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Rotary:
    """`rope(positions, dtype)` for a model: cos/sin over the first `rotary_dim` dims of each head
    with base `theta`, cast to the activation dtype (or kept in float32: `full_precision`)."""

    def __init__(self, rotary_dim: int, theta: float, full_precision: bool = False):
        self.rotary_dim, self.theta, self.full_precision = rotary_dim, theta, full_precision

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype):
        return rope_cos_sin(positions, self.rotary_dim, self.theta, torch.float32 if self.full_precision else dtype)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotate the first `cos.shape[-1]` dims of q and k (all of them unless RoPE is partial)."""
    r = cos.shape[-1]
    if r == q.shape[-1]:
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    q_rot, q_pass = q[..., :r], q[..., r:]
    k_rot, k_pass = k[..., :r], k[..., r:]
    q_rot = q_rot * cos + rotate_half(q_rot) * sin
    k_rot = k_rot * cos + rotate_half(k_rot) * sin
    return torch.cat([q_rot, q_pass], dim=-1), torch.cat([k_rot, k_pass], dim=-1)


# ------------------------------------------------------------------------------------------------
# KV cache


class KVCache:
    """Keys and values of already-processed positions, per layer, shaped (B, H_kv, L, D) after
    RoPE, with each cached position's RoPE position and whether it is a real token.

    How a forward uses it (`cache_mode`):
      - "append": attend to [cache ; new] and store the new keys (prefix cache fill, committed blocks);
      - "read":   attend to [cache ; new] without storing (denoising steps of the current block);
      - "replace": overwrite cached positions [start, start + L) with the new keys and attend to the
        whole cache (Fast-dLLM's dual cache: the suffix after the block stays cached too).

    Two kinds. `KVCache()` grows: each append concatenates. `KVCache(capacity=N)` (or `allocate`, which
    also makes the buffers now) is static: per layer one (B, H_kv, N, D) buffer, made at the first write
    (or by `allocate`) and never reallocated, a write pointer `length` (a host int, with its copy
    `cursor` on the device) and `valid` (B, N) bool of fixed shape, False on slots not written. "append"
    writes slots [length, length + L) and advances the pointer; "read" writes the new keys into the
    slots after the pointer without advancing it (they are not part of the cache: the next read or
    append overwrites them) and attends over the whole buffer, the slots not written hidden; "replace"
    writes the window [start, start + L) (`start` an int or a 0-d device tensor). The slots a read or a
    replace writes are indexed by device tensors (`cursor`, the replace start), so a forward on a static
    cache makes no host sync and its shapes do not change from block to block: it can be captured
    (`torch.compile`, CUDA graphs). The queries' RoPE positions are the growing cache's (the count of
    valid cached slots before them). Memory: `nbytes`.
    """

    def __init__(self, capacity: int | None = None):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.positions: torch.Tensor | None = None  # (B, L), static: (B, capacity)
        self.valid: torch.Tensor | None = None  # (B, L) bool, static: (B, capacity)
        self.capacity = capacity
        self.length = 0  # static: the slots written (the write pointer)
        self.cursor: torch.Tensor | None = None  # static: `length` as a 0-d long tensor on the device
        self.window: torch.Tensor | None = None  # static: the slots the current forward writes (read, replace)

    @property
    def static(self) -> bool:
        return self.capacity is not None

    @classmethod
    def allocate(cls, batch: int, capacity: int, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device) -> "KVCache":
        """A static cache with all its buffers made now: `nbytes(...)` bytes of keys and values, plus
        (B, capacity) positions (int64) and validity (bool)."""
        c = cls(capacity)
        c._rows(batch, torch.device(device))
        shape = (batch, kv_heads, capacity, head_dim)
        c.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        c.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        return c

    @staticmethod
    def nbytes(batch: int, capacity: int, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes of a static cache's keys and values: 2 * layers * B * kv_heads * capacity * head_dim * itemsize."""
        return 2 * layers * batch * kv_heads * capacity * head_dim * torch.empty((), dtype=dtype).element_size()

    def _rows(self, batch: int, device) -> None:
        if self.positions is None:
            self.positions = torch.zeros((batch, self.capacity), dtype=torch.long, device=device)
            self.valid = torch.zeros((batch, self.capacity), dtype=torch.bool, device=device)
            self.cursor = torch.zeros((), dtype=torch.long, device=device)
            self._seek(self.length)

    def _layer(self, layer: int, k: torch.Tensor) -> None:
        """Make the buffers of layers up to `layer` (static cache, at their first write), shaped like `k`."""
        while len(self.keys) <= layer:
            B, H, _, D = k.shape
            self.keys.append(torch.zeros((B, H, self.capacity, D), dtype=k.dtype, device=k.device))
            self.values.append(torch.zeros((B, H, self.capacity, D), dtype=k.dtype, device=k.device))

    def _seek(self, length: int) -> None:
        self.length = length
        if self.cursor is not None:
            self.cursor.fill_(length)  # a device write, no sync

    def __len__(self) -> int:
        if self.static:
            return self.length
        return 0 if self.positions is None else self.positions.shape[1]

    def next_positions(self) -> torch.Tensor:
        """(B,) the RoPE position of the next real token."""
        return self.valid.sum(dim=1)

    def truncate(self, length: int) -> "KVCache":
        """Keep only the first `length` positions (e.g. the prompt, for a prefix cache). A static cache
        keeps its buffers and hides the slots from `length` on."""
        if self.static:
            if self.valid is not None:
                self.valid[:, length:] = False
            self._seek(min(length, self.length))
            return self
        self.keys = [k[:, :, :length] for k in self.keys]
        self.values = [v[:, :, :length] for v in self.values]
        self.positions, self.valid = self.positions[:, :length], self.valid[:, :length]
        return self

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a forward reads or writes in place (a static cache's buffers, its rows and cursor):
        a captured step marks them as static addresses."""
        rows = [t for t in (self.positions, self.valid, self.cursor) if t is not None]
        return [*self.keys, *self.values, *rows]


# ------------------------------------------------------------------------------------------------
# Attention layout


@dataclass
class Layout:
    positions: torch.Tensor
    """(B, Lq) RoPE positions of the queries."""
    mask: torch.Tensor | None
    """(B, 1, Lq, Lk) bool (or (B, 1, 1, Lk): key padding only), True where a query may see a key; None when
    every query sees every key, and with backend flex, which builds its block mask from `visibility`."""
    backend: str
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0
    segment_masks: list | None = None
    """Packed input: each sequence's own (1, 1, n, n) mask, or None where it sees everything."""
    cache: KVCache | None = None
    cache_mode: str | None = None
    replace_start: int = 0
    _flex_mask: object = None
    sequence_group: object = None
    """The process group of a sequence-parallel forward (`sequence_parallel`); None otherwise."""
    visibility: Visibility | None = None
    """The per-token vectors `mask` is made of; None when every query sees every key (or the caller gave
    the mask as a 4-D tensor)."""

    def cached(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """The keys/values this layer attends to, updating the cache as `cache_mode` says."""
        c = self.cache
        if c is None:
            return k, v
        if c.static:
            c._layer(layer, k)
            keys, values = c.keys[layer], c.values[layer]
            if self.cache_mode == "append":  # the pointer was advanced by `make_layout`: slots [start, end)
                end = c.length
                s = end - k.shape[2]
                keys[:, :, s:end], values[:, :, s:end] = k, v
                return keys[:, :, :end], values[:, :, :end]
            keys.index_copy_(2, c.window, k)  # read / replace: the window's slots, indexed on the device
            values.index_copy_(2, c.window, v)
            return keys, values
        if self.cache_mode == "replace":
            s = self.replace_start
            c.keys[layer][:, :, s:s + k.shape[2]] = k
            c.values[layer][:, :, s:s + v.shape[2]] = v
            return c.keys[layer], c.values[layer]
        if layer < len(c.keys):
            k, v = torch.cat([c.keys[layer], k], dim=2), torch.cat([c.values[layer], v], dim=2)
        if self.cache_mode == "append":
            if layer < len(c.keys):
                c.keys[layer], c.values[layer] = k, v
            else:
                c.keys.append(k)
                c.values.append(v)
        return k, v


def visible(q_pos, k_pos, k_valid, block_size=None, q_doc=None, k_doc=None, q_noisy=None, k_noisy=None):
    """Which keys each query sees (broadcasting query tensors (.., Lq, 1) against keys (.., 1, Lk))."""
    qb, kb = (None, None) if block_size is None else (q_pos // block_size, k_pos // block_size)
    return visible_by_block(qb, kb, k_valid, q_doc, k_doc, q_noisy, k_noisy)


def visible_by_block(qb, kb, k_valid, q_doc=None, k_doc=None, q_noisy=None, k_noisy=None):
    """`visible` from each query's and key's block (position // block_size; None: bidirectional)."""
    ok = k_valid
    if q_doc is not None:
        ok = ok & (q_doc == k_doc)
    if qb is not None:
        if q_noisy is None:
            ok = ok & (kb <= qb)
        else:  # block-diffusion training layout [x_t ; x_0]
            rule = torch.where(q_noisy, torch.where(k_noisy, kb == qb, kb < qb), ~k_noisy & (kb <= qb))
            ok = ok & rule
    return ok


@dataclass
class Visibility:
    """A layout's mask as per-token vectors, which `visible_by_block` turns into each (query, key) pair's
    answer: key validity, and where the rule needs them each query's and key's block (`blocks`: position
    // block size), packed sequence (`doc`) and half of the block-diffusion input (`noisy`); query
    validity where padded query rows see every key. Vectors are (B, Lq) or (B, Lk) (B = 1 for a packed
    input). `dense()` is the (B, 1, Lq, Lk) mask SDPA takes ((B, 1, 1, Lk) for key padding only);
    `mask_mod()` indexes the vectors for FlexAttention, so its block mask is built without an (Lq, Lk)
    tensor (and with no division in the kernel)."""

    k_valid: torch.Tensor
    q_block: torch.Tensor | None = None
    k_block: torch.Tensor | None = None
    q_valid: torch.Tensor | None = None
    q_doc: torch.Tensor | None = None
    k_doc: torch.Tensor | None = None
    q_noisy: torch.Tensor | None = None
    k_noisy: torch.Tensor | None = None

    def _rule(self, q, k):
        """The rule over the vectors, each query vector passed through `q` and each key vector through `k`."""
        ok = visible_by_block(q(self.q_block), k(self.k_block), k(self.k_valid), q(self.q_doc), k(self.k_doc),
                              q(self.q_noisy), k(self.k_noisy))
        return ok if self.q_valid is None else ok | ~q(self.q_valid)

    def dense(self) -> torch.Tensor:
        rows = lambda t: None if t is None else t[:, :, None]  # noqa: E731
        cols = lambda t: None if t is None else t[:, None, :]  # noqa: E731
        return self._rule(rows, cols)[:, None]

    def mask_mod(self):
        """FlexAttention's `mask_mod(b, h, q_idx, kv_idx)`: the rule at one pair, read from the vectors."""

        def mod(b, h, q_idx, kv_idx):
            return self._rule(lambda t: None if t is None else t[b, q_idx],
                              lambda t: None if t is None else t[b, kv_idx])

        return mod


def blocks(positions: torch.Tensor, block_size: int | None) -> torch.Tensor | None:
    return None if block_size is None else positions // block_size


def _positions_from_mask(valid: torch.Tensor, start: torch.Tensor | int = 0) -> torch.Tensor:
    return (valid.long().cumsum(-1) - 1).clamp(min=0) + (start if isinstance(start, int) else start[:, None])


def _static_window(cache: KVCache, mode, valid, given: bool, position_ids, start):
    """`make_layout`'s cache step on a static cache -> (query positions, query validity, key positions, key
    validity). Append writes the rows' slots and advances the pointer (eager: slices by host ints); read and
    replace index their window with device tensors (`cache.cursor`, a tensor `start`), which a captured
    step needs: no host sync, and the same graph for every block."""
    B, L = valid.shape
    cache._rows(B, valid.device)
    checking = not torch.compiler.is_compiling()
    if mode == "append":
        s = cache.length
        if s + L > cache.capacity:
            raise ValueError(f"appending {L} positions to a static cache holding {s} of {cache.capacity}")
        if position_ids is None:
            position_ids = _positions_from_mask(valid, cache.next_positions())
        cache.positions[:, s:s + L], cache.valid[:, s:s + L] = position_ids, valid
        cache._seek(s + L)
        return position_ids, valid, cache.positions[:, :s + L], cache.valid[:, :s + L]
    span = torch.arange(L, device=valid.device)
    if mode == "read":
        if checking and cache.length + L > cache.capacity:
            raise ValueError(f"reading {L} positions on a static cache holding {cache.length} of {cache.capacity}")
        if position_ids is None:
            position_ids = _positions_from_mask(valid, cache.next_positions())
        cache.window = cache.cursor + span
        return (position_ids, valid, cache.positions.index_copy(1, cache.window, position_ids),
                cache.valid.index_copy(1, cache.window, valid))
    if mode != "replace":
        raise ValueError(f"cache_mode must be 'append', 'read' or 'replace'; got {mode!r}")
    if checking and isinstance(start, int) and (start < 0 or start + L > len(cache)):
        raise ValueError(f"replace [{start}, {start + L}) is outside the cache (length {len(cache)})")
    cache.window = span + start
    if position_ids is None:
        position_ids = cache.positions.index_select(1, cache.window)
    if given:  # the cached positions stay what they were: pads stay hidden
        cache.valid.index_copy_(1, cache.window, cache.valid.index_select(1, cache.window) & valid)
    return position_ids, cache.valid.index_select(1, cache.window), cache.positions, cache.valid


def make_layout(model, input_ids: torch.Tensor, attention_mask=None, position_ids=None, *, cu_seqlens=None,
                past_key_values: KVCache | None = None, cache_mode: str | None = None, replace_start: int = 0,
                block_diffusion: bool = False) -> Layout:
    """Build the layout of one forward pass. `model.dllm_block_size()` (None: bidirectional) and
    `model.attn_backend` say which rule and which kernel apply."""
    B, L = input_ids.shape
    dev = input_ids.device
    block = model.dllm_block_size()
    backend = model.attn_backend
    own_positions = position_ids is None  # positions we count, so that their blocks are known from shapes
    if attention_mask is not None and attention_mask.dim() == 4:
        # An explicit (B, 1, Lq, Lk) mask, as the originals' callers build them: bool (True = visible)
        # or additive float (0 = visible, -inf / dtype.min = hidden; LLaDA2.1's +1 counts as visible).
        if past_key_values is not None or cu_seqlens is not None or block_diffusion:
            raise ValueError("an explicit 4-D attention mask cannot be combined with a cache, packing or the "
                             "block-diffusion layout; pass a 2-D padding mask instead")
        m = attention_mask
        if m.dtype != torch.bool:
            m = torch.isfinite(m) & (m > torch.finfo(m.dtype).min / 2)
        if position_ids is None:
            position_ids = torch.arange(L, device=dev).expand(B, L)
        return Layout(position_ids, m, backend)

    if cu_seqlens is not None:
        if B != 1 or attention_mask is not None or past_key_values is not None or block_diffusion:
            raise ValueError("a packed forward (cu_seqlens) takes input_ids of shape (1, total) and no "
                             "attention_mask, cache or block-diffusion layout")
        cu = cu_seqlens.to(dev, torch.long)
        if int(cu[0]) != 0 or int(cu[-1]) != L or bool((cu[1:] < cu[:-1]).any()):
            raise ValueError(f"cu_seqlens must rise from 0 to the packed length {L}; got {cu.tolist()}")
        lengths = cu[1:] - cu[:-1]
        doc = torch.repeat_interleave(torch.arange(len(lengths), device=dev), lengths)
        if position_ids is None:
            position_ids = (torch.arange(L, device=dev) - cu[doc])[None]
        segs, one = [], torch.ones((), dtype=torch.bool, device=dev)
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            p = position_ids[0, s:e]
            segs.append(None if block is None else visible(p[:, None], p[None, :], one, block)[None, None])
        # FlexAttention: one block mask over the whole pack (block-sparse), from the positions and doc ids
        b = blocks(position_ids, block)
        vis = Visibility(torch.ones(1, L, dtype=torch.bool, device=dev), b, b, q_doc=doc[None], k_doc=doc[None])
        return Layout(position_ids, None, backend, cu_seqlens=cu.to(torch.int32),
                      max_seqlen=int(lengths.max()) if len(lengths) else 0, segment_masks=segs, visibility=vis)

    given = attention_mask is not None
    valid = attention_mask.bool().clone() if given else torch.ones(B, L, dtype=torch.bool, device=dev)
    if valid.shape != (B, L) and not (block_diffusion and valid.shape == (B, L // 2)):
        raise ValueError(f"attention_mask has shape {tuple(valid.shape)}, input_ids {(B, L)}")

    if block_diffusion:
        if block is None:
            raise ValueError("the block-diffusion layout needs a block-causal model (SDAR, LLaDA2)")
        if L % 2 or past_key_values is not None:
            raise ValueError("the block-diffusion layout takes [x_t ; x_0] (even length) and no cache")
        half = L // 2
        v1 = valid if valid.shape[1] == half else valid[:, :half]
        pos = _positions_from_mask(v1) if position_ids is None else position_ids[:, :half]
        position_ids = torch.cat([pos, pos], dim=1)
        k_valid = torch.cat([v1, v1], dim=1)
        noisy = (torch.arange(L, device=dev) < half).expand(B, L)
        b = blocks(position_ids, block)
        vis = Visibility(k_valid, b, b, q_valid=k_valid, q_noisy=noisy, k_noisy=noisy)
        return Layout(position_ids, None if backend == "flex" else vis.dense(), backend, visibility=vis)

    cache = past_key_values
    fixed = cache is not None and cache.static and cache_mode != "append"  # keys: the whole static buffer
    if cache is not None and not cache.static and len(cache) == 0 and cache_mode == "read":
        cache = None  # reading an empty cache: the tokens attend to themselves only
    if cache is not None and cache.static:
        position_ids, valid, k_pos, k_valid = _static_window(cache, cache_mode, valid, given, position_ids,
                                                             replace_start)
    elif cache is None or len(cache) == 0:
        if position_ids is None:
            position_ids = _positions_from_mask(valid)
        k_pos, k_valid = position_ids, valid
        if cache is not None:
            if cache_mode != "append":
                raise ValueError("an empty cache can only be filled (cache_mode='append')")
            cache.positions, cache.valid = position_ids, valid
    elif cache_mode == "replace":
        if replace_start < 0 or replace_start + L > len(cache):
            raise ValueError(f"replace [{replace_start}, {replace_start + L}) is outside the cache "
                             f"(length {len(cache)})")
        window = slice(replace_start, replace_start + L)
        if position_ids is None:
            position_ids = cache.positions[:, window]
        if given:  # the cached positions stay what they were: pads stay hidden
            cache.valid[:, window] &= valid
        valid = cache.valid[:, window].clone()
        k_pos, k_valid = cache.positions, cache.valid
    elif cache_mode in ("read", "append"):
        if position_ids is None:
            position_ids = _positions_from_mask(valid, cache.next_positions())
        k_pos = torch.cat([cache.positions, position_ids], dim=1)
        k_valid = torch.cat([cache.valid, valid], dim=1)
        if cache_mode == "append":
            cache.positions, cache.valid = k_pos, k_valid
    else:
        raise ValueError(f"cache_mode must be 'append', 'read' or 'replace' with a non-empty cache; got {cache_mode!r}")

    # No mask when every query sees every key; key padding only when the block rule hides nothing; the
    # whole rule otherwise. Decided from shapes where possible, and from facts about the masks that are
    # read once per tensor (a cache between two fills, a padding mask passed again at every step).
    if cache is None:  # the keys' validity, in parts: the cache (which now holds every key), the new tokens
        parts = [attention_mask] if given else []
    elif cache_mode == "read":
        parts = [cache.valid] + ([attention_mask] if given else [])
    else:
        parts = [k_valid]  # the cache's validity
    vis, plain = None, not fixed and _block_rule_hides_nothing(block, own_positions, cache, cache_mode, L)
    if not (plain and all(_fact(t, "all") for t in parts)):
        if plain and any(_fact(t, "every row") for t in parts):
            vis = Visibility(k_valid)  # key padding only (every row has a real key to see)
        else:
            vis = Visibility(k_valid, blocks(position_ids, block), blocks(k_pos, block), q_valid=valid)
    return Layout(position_ids, None if vis is None or backend == "flex" else vis.dense(), backend, cache=cache,
                  cache_mode=cache_mode if cache is not None else None, replace_start=replace_start, visibility=vis)


def _block_rule_hides_nothing(block, own_positions: bool, cache: KVCache | None, cache_mode, L: int) -> bool:
    """Whether the block-causal rule lets every query see every key (bidirectional models: always). So it
    does when the queries lie in one block and no key is in a later one: L <= block new tokens at positions
    we count from a block start (no cache, or every row's cached length a whole number of blocks), over
    [cache ; new]. A replaced window also sees the cached suffix after it, in later blocks."""
    if block is None:
        return True
    if not own_positions or L > block or cache_mode == "replace":
        return False
    if cache is None:
        return True
    before = cache.valid[:, :len(cache) - L] if cache_mode == "append" else cache.valid
    return before.shape[1] == 0 or _fact(before, ("block start", block))


_FACT_QUESTIONS = {
    "all": lambda t: bool(t.all()),
    "every row": lambda t: bool(t.any(dim=1).all()),  # every row has a real key
}
_FACTS: dict = {}  # id(tensor or its base) -> (weak reference to it, {(question, view, version): answer})


def _fact(t: torch.Tensor, question) -> bool:
    """The answer to `question` about the (B, L) validity tensor `t`: `_FACT_QUESTIONS[question]`, or
    ("block start", n): every row's count of real tokens is a multiple of n (its next position starts a
    block). Reading it is a host sync on CUDA, so the answer is kept for this tensor (or this view of it)
    until it is changed in place: a cache is looked at once per fill, a mask given at every step once."""
    ask = _FACT_QUESTIONS.get(question) or (lambda x: bool((x.sum(dim=1) % question[1] == 0).all()))
    if t.is_inference() or torch.compiler.is_compiling():  # (no version counter to tell a change)
        return ask(t)
    base = t if t._base is None else t._base
    entry = _FACTS.get(id(base))
    if entry is None or entry[0]() is not base:
        entry = _FACTS[id(base)] = (weakref.ref(base, lambda _, i=id(base): _FACTS.pop(i, None)), {})
    key = (question, t.storage_offset(), tuple(t.shape), t.stride(), t._version)
    if key not in entry[1]:
        if len(entry[1]) > 64:
            entry[1].clear()
        entry[1][key] = ask(t)
    return entry[1][key]


# ------------------------------------------------------------------------------------------------
# Backends


def _notice(msg: str) -> None:
    print(f"dare: {msg}", file=sys.stderr)


@functools.cache
def flash_attn_functions():
    """(flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache), or None if not installed."""
    try:
        from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    except Exception:  # ImportError, or a build that does not match the installed torch/CUDA
        return None
    return flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache


@functools.cache
def flex_attention_functions():
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception:
        return None
    return flex_attention, create_block_mask


BACKEND_ALIASES = {None: "sdpa", "sdpa": "sdpa", "eager": "sdpa", "flex": "flex", "flex_attention": "flex",
                   "flash": "flash", "flash_attention_2": "flash", "flash_attention_3": "flash"}


def resolve_backend(requested: str | None, *, explicit: bool) -> str:
    """Map a requested attention implementation to one of sdpa | flex | flash.

    A config that merely names flash/flex (as downloaded checkpoints do) falls back to SDPA with a
    one-line notice when the kernel is missing; asking for it explicitly is an error."""
    if requested not in BACKEND_ALIASES:
        raise ValueError(f"unknown attention backend {requested!r}; choose sdpa, flex or flash")
    name = BACKEND_ALIASES[requested]
    if name == "flash" and flash_attn_functions() is None:
        if explicit:
            raise ImportError("attention backend 'flash' needs the flash-attn package (a CUDA build): "
                              "pip install --no-build-isolation -e '.[flash]' on a GPU machine, or choose 'sdpa'")
        _notice(f"flash-attn is not installed; the config asks for {requested!r}, using SDPA")
        return "sdpa"
    if name == "flex" and flex_attention_functions() is None:
        if explicit:
            raise ImportError("attention backend 'flex' needs torch.nn.attention.flex_attention (torch >= 2.5)")
        _notice(f"FlexAttention is unavailable; the config asks for {requested!r}, using SDPA")
        return "sdpa"
    return name


FUSED_KERNELS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


@contextlib.contextmanager
def fused_attention_only():
    """Inside, SDPA may run only its fused kernels (flash, memory-efficient, cuDNN): a call that would
    need the math kernel (slow, and memory quadratic in the length) raises instead of running it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, name) for name in FUSED_KERNELS]):
        yield


@functools.cache
def _fused_kernel_takes_gqa(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether SDPA on this CUDA device has a fused kernel for unmasked grouped-query attention
    (`enable_gqa`: fewer key/value heads than query heads) in `dtype`; tried once on tiny tensors. In
    torch 2.5 to 2.13 flash-attention takes it in float16 and bfloat16, and no fused kernel in float32."""
    q = torch.zeros(1, 2, 16, 64, device=device, dtype=dtype)
    kv = torch.zeros(1, 1, 16, 64, device=device, dtype=dtype)
    try:
        with warnings.catch_warnings(), fused_attention_only():
            warnings.simplefilter("ignore")  # (each kernel that declines says why)
            F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (RuntimeError, TypeError):
        return False
    return True


def _sdpa(q, k, v, mask, *, repeat_kv: bool | None = None):
    """SDPA of q (B, Hq, Lq, D) over k, v (B, Hkv, Lk, D) with a bool mask (or None). Fewer key/value
    heads: `enable_gqa` (flash-attention takes it), except on CUDA with a mask or where no fused kernel
    takes it (float32): there the keys and values are first repeated to q's heads, so that the
    memory-efficient kernel runs, which needs equal heads, instead of the math one (`repeat_kv` decides
    instead, for tests). The memory-efficient kernel takes the bool mask as it is: SDPA turns it into an
    additive one in q's dtype and pads its last dimension to the kernel's alignment itself."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        if repeat_kv is None:
            repeat_kv = q.is_cuda and (mask is not None or torch.compiler.is_compiling()
                                       or not _fused_kernel_takes_gqa(q.device, q.dtype))
        if repeat_kv and q.shape[2] <= FOLD_QUERIES:
            return _folded_sdpa(q, k, v, mask, groups)
        if repeat_kv:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False,
                                          enable_gqa=q.shape[1] != k.shape[1])


FOLD_QUERIES = 64
"""Up to this many queries (a decoding step's block), `_sdpa` folds each key/value head's query heads into its
query length instead of repeating the keys and values: the cache is read as it is (repeating it would write and
read `groups` copies of it at every step), the mask is repeated instead (`groups` x queries x keys)."""


def _folded_sdpa(q, k, v, mask, groups: int):
    """GQA as equal heads: q (B, Hkv * G, Lq, D) -> (B, Hkv, G * Lq, D) (query head h belongs to key/value head
    h // G, as `repeat_interleave` pairs them), the mask repeated over the G groups, and the output unfolded."""
    B, H, Lq, D = q.shape
    folded = q.reshape(B, H // groups, groups * Lq, D)
    if mask is not None and mask.shape[2] > 1:  # (a mask over keys only broadcasts over the folded queries)
        mask = mask[:, :, None].expand(mask.shape[0], mask.shape[1], groups, *mask.shape[2:])
        mask = mask.reshape(mask.shape[0], mask.shape[1], groups * Lq, mask.shape[-1])
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, is_causal=False)
    return out.reshape(B, H, Lq, out.shape[-1])


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Attention of q (B, Hq, Lq, D) over k, v (B, Hkv, Lk, D) as `layout` allows. -> (B, Lq, Hq, D)
    In a sequence-parallel forward q, k, v hold this rank's positions: all-to-all to all positions of
    H/P heads, attention, all-to-all back (Ulysses)."""
    group = layout.sequence_group
    if group is not None:
        heads = [_seq_to_heads(t, group) for t in (q, k, v)]
        inner = replace(layout, sequence_group=None)
        out = attend(*heads, inner)  # (B, L, Hq/P, D)
        layout._flex_mask = inner._flex_mask  # (built once per forward, as without sequence parallelism)
        return _heads_to_seq(out.transpose(1, 2), group).transpose(1, 2)
    if layout.backend == "flash":
        out = _flash(q, k, v, layout)
        if out is not None:
            return out
    if layout.backend == "flex" and (layout.visibility is not None or layout.mask is not None):
        return _flex(q, k, v, layout).transpose(1, 2)
    if layout.cu_seqlens is not None:  # packed: each sequence on its own, no compute across them
        out = torch.empty_like(q)
        cu = layout.cu_seqlens.tolist()
        for i, (s, e) in enumerate(zip(cu[:-1], cu[1:])):
            out[:, :, s:e] = _sdpa(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], layout.segment_masks[i])
        return out.transpose(1, 2)
    return _sdpa(q, k, v, layout.mask).transpose(1, 2)


# ------------------------------------------------------------------------------------------------
# Sequence parallelism (Ulysses)

_SEQUENCE_GROUP: contextvars.ContextVar = contextvars.ContextVar("sequence_group", default=None)


@contextlib.contextmanager
def sequence_parallel(group):
    """Forwards inside run sequence-parallel over `group` (a torch.distributed process group whose ranks all
    hold the same input): see the module docstring. A length that does not divide by the group's size is
    right-padded with invisible positions (each half of a block-diffusion input), whose outputs are dropped;
    the attention heads (query and key/value) must divide by it."""
    token = _SEQUENCE_GROUP.set(group)
    try:
        yield
    finally:
        _SEQUENCE_GROUP.reset(token)


def _pad_to_group(P: int, input_ids, inputs_embeds, attention_mask, position_ids, block_diffusion: bool):
    """Right-pad the input (each half of a block-diffusion `[x_t ; x_0]`) with invisible positions so that
    the length divides by the group size `P`; -> the padded input, mask, position ids and the length of
    the outputs to keep (the unpadded length; one half's for block diffusion)."""
    x = input_ids if input_ids is not None else inputs_embeds
    B, L = x.shape[:2]
    half = L // 2 if block_diffusion else L
    parts = 2 if block_diffusion else 1
    extra = 0
    while (parts * (half + extra)) % P:
        extra += 1
    if not extra:
        return input_ids, inputs_embeds, attention_mask, position_ids, half

    def widen(t, fill, n=half):  # (B, parts * n, ...) -> (B, parts * (n + extra), ...)
        if t is None:
            return None
        pieces = t.split(n, dim=1) if t.shape[1] == parts * n else [t]
        pad = [torch.full((B, extra, *t.shape[2:]), fill, dtype=t.dtype, device=t.device)]
        return torch.cat([q for piece in pieces for q in (piece, *pad)], dim=1)

    mask = attention_mask
    if mask is None:
        mask = torch.ones(B, half, dtype=torch.long, device=x.device)
    elif mask.dim() != 2:
        raise ValueError("a sequence-parallel forward whose length needs padding takes a 2-D attention_mask")
    return (widen(input_ids, 0), widen(inputs_embeds, 0.0), widen(mask, 0), widen(position_ids, 0), half)


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """(P, ...) chunks, chunk j sent to rank j; returns (P, ...) with chunk j received from rank j (autograd:
    the backward is the reverse exchange)."""
    from torch.distributed.nn.functional import all_to_all_single

    x = x.contiguous()  # (the output buffer must be contiguous too: empty_like keeps a transposed layout)
    return all_to_all_single(torch.empty_like(x), x, group=group)


def _seq_to_heads(t: torch.Tensor, group) -> torch.Tensor:
    """(B, H, L/P, D) this rank's positions of all heads -> (B, H/P, L, D) all positions of its heads."""
    P = torch.distributed.get_world_size(group)
    B, H, n, D = t.shape
    if H % P:
        raise ValueError(f"sequence parallelism over {P} ranks needs the heads ({H}) to divide by {P}")
    chunks = t.reshape(B, P, H // P, n, D).transpose(0, 1)  # chunk j: the heads rank j will own
    got = _all_to_all(chunks, group)  # chunk j: rank j's positions of my heads
    return got.permute(1, 2, 0, 3, 4).reshape(B, H // P, P * n, D)


def _heads_to_seq(t: torch.Tensor, group) -> torch.Tensor:
    """(B, H/P, L, D) all positions of this rank's heads -> (B, H, L/P, D) its positions of all heads."""
    P = torch.distributed.get_world_size(group)
    B, h, L, D = t.shape
    chunks = t.reshape(B, h, P, L // P, D).permute(2, 0, 1, 3, 4)  # chunk j: rank j's positions
    got = _all_to_all(chunks, group)  # chunk j: my positions of rank j's heads
    return got.transpose(0, 1).reshape(B, P * h, L // P, D)


class _GatherPositions(torch.autograd.Function):
    """All-gather along the positions (dim 1); the backward returns this rank's slice of the gradient (every
    rank computes the same loss from the gathered states, so no sum)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.rank, ctx.n = torch.distributed.get_rank(group), x.shape[1]
        parts = [torch.empty_like(x) for _ in range(torch.distributed.get_world_size(group))]
        torch.distributed.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.rank * ctx.n:(ctx.rank + 1) * ctx.n].contiguous(), None


def _flex(q, k, v, layout: Layout):
    """FlexAttention over the layout's block mask, built once per forward (shared by the layers) from the
    per-token vectors of `layout.visibility` (only a 4-D mask the caller gave is indexed as it is)."""
    flex_attention, create_block_mask = flex_attention_functions()
    if layout._flex_mask is None:
        B, Lq, Lk = q.shape[0], q.shape[2], k.shape[2]
        if layout.visibility is not None:
            mask_mod = layout.visibility.mask_mod()
        else:
            dense = layout.mask[:, 0].expand(B, Lq, Lk)

            def mask_mod(b, h, qi, ki):
                return dense[b, qi, ki]

        if q.device.type == "cuda":  # compiled: no (B, Lq, Lk) tensor is made on the way either
            create_block_mask = _compiled_create_block_mask()
        layout._flex_mask = create_block_mask(mask_mod, B, None, Lq, Lk, device=q.device)
    if q.device.type == "cuda":  # the fused kernel; eager flex_attention is a slow reference on GPU
        flex_attention = _compiled_flex()
    return flex_attention(q, k, v, block_mask=layout._flex_mask, enable_gqa=q.shape[1] != k.shape[1])


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention_functions()[0], dynamic=True)


@functools.cache
def _compiled_create_block_mask():
    return torch.compile(flex_attention_functions()[1])


def _flash(q, k, v, layout: Layout):
    """flash-attn where it applies (fp16/bf16 on CUDA, and no mask it cannot express: padding or
    block-causal rules inside the query span); None means "use SDPA" for this call."""
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        return None
    flash_func, varlen_func, kvcache_func = flash_attn_functions()
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, L, H, D)
    if layout.cu_seqlens is not None:
        if any(m is not None for m in layout.segment_masks):
            return None  # block-causal inside a packed sequence: not expressible in flash-attn
        cu, n = layout.cu_seqlens, layout.max_seqlen
        return varlen_func(qt[0], kt[0], vt[0], cu, cu, n, n, causal=False)[None]
    if layout.mask is not None:
        return None
    if layout.cache is not None and layout.cache_mode == "read" and kt.shape[1] > qt.shape[1]:
        # queries of the current block over [cache ; block] (the cache already holds them concatenated)
        return kvcache_func(qt, kt.contiguous(), vt.contiguous(), causal=False)
    return flash_func(qt, kt, vt, causal=False)


# ------------------------------------------------------------------------------------------------
# Output and base class


@dataclass
class DLLMOutput(ModelOutput):
    """`logits` are the model's raw logits (Dream's are shifted: use `dare.models.token_logits` for
    aligned ones). With `output_logits=False` only `last_hidden_state` (after the final norm) is
    returned, for chunked cross-entropy against `get_output_embeddings()`."""

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    past_key_values: KVCache | None = None
    router_logits: tuple | None = None


class DLLMPreTrainedModel(PreTrainedModel):
    """Base of every family's model class. The attention kernel is ours (`attn_backend`, one of
    sdpa | flex | flash), so transformers' own attention dispatch is bypassed: a checkpoint whose
    config names `flash_attention_2` loads anywhere and uses SDPA when flash-attn is missing."""

    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = True
    _supports_flash_attn_2 = True  # transformers 4.x name
    supports_gradient_checkpointing = True

    def __init__(self, config, *args, **kwargs):
        if getattr(config, "tie_word_embeddings", False):
            raise NotImplementedError(f"{config.model_type} config with tie_word_embeddings=true: the released "
                                      "checkpoints have an untied output head, and only that is implemented")
        super().__init__(config, *args, **kwargs)
        # `gradient_checkpointing_enable()` sets this flag and `_gradient_checkpointing_func`;
        # `decoder_forward` then recomputes each decoder layer in the backward pass.
        self.gradient_checkpointing = False

    def _check_and_adjust_attn_implementation(self, attn_implementation=None, *args, **kwargs):
        self.attn_backend = resolve_backend(attn_implementation, explicit=False)
        return "sdpa"

    def set_attention_backend(self, name: str) -> None:
        """Choose sdpa | flex | flash; an unavailable kernel asked for here is an error."""
        self.attn_backend = resolve_backend(name, explicit=True)

    @property
    def attn_backend(self) -> str:
        return self.__dict__.get("_dare_attn_backend", "sdpa")

    @attn_backend.setter
    def attn_backend(self, value: str) -> None:
        self.__dict__["_dare_attn_backend"] = value

    def decoder_parts(self):
        """(embedding, layers, final norm, output head, rope(positions, dtype) -> cos/sin)."""
        raise NotImplementedError

    def get_input_embeddings(self):
        return self.decoder_parts()[0]

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=False, *, cu_seqlens=None, replace_position=None,
                block_diffusion=False, output_logits=True, output_router_logits=False, store_kv=None, logits_at=None,
                **kwargs):
        """The originals' positional signature (input_ids, attention_mask, position_ids, ...), plus
        the forward modes of `decoder_forward`. `store_kv` is SDAR's name for `use_cache`; Dream's
        `attention_mask="full"` means no mask."""
        check_forward_args(kwargs, type(self).__name__)
        if store_kv is not None:
            use_cache = bool(store_kv)
        if isinstance(attention_mask, str):
            attention_mask = None
        return decoder_forward(self, self.decoder_parts(), input_ids, attention_mask, position_ids,
                               inputs_embeds=inputs_embeds, cu_seqlens=cu_seqlens, past_key_values=past_key_values,
                               use_cache=use_cache, replace_position=replace_position,
                               block_diffusion=block_diffusion, output_logits=output_logits,
                               output_router_logits=output_router_logits, logits_at=logits_at)

    def get_output_embeddings(self):
        return self.lm_head

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head, as `forward` applies it to the final hidden states."""
        return self.get_output_embeddings()(hidden)

    def dllm_block_size(self) -> int | None:
        """Block size of block-causal attention; None for bidirectional models."""
        return None

    def _init_weights(self, module):
        std = getattr(self.config, "initializer_range", None) or getattr(self.config, "init_std", 0.02)
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


def check_forward_args(kwargs: dict, model_name: str) -> None:
    """Refuse options the originals accept but we do not implement, instead of ignoring them."""
    ignored = {"return_dict", "output_attentions", "output_hidden_states", "labels", "num_items_in_batch",
               "cache_position", "logits_to_keep"}
    unknown = {k: v for k, v in kwargs.items() if k not in ignored}
    if unknown:
        raise TypeError(f"{model_name}.forward got unsupported arguments {sorted(unknown)}")
    if kwargs.get("output_attentions") or kwargs.get("labels") is not None:
        raise NotImplementedError(f"{model_name}.forward: output_attentions and labels are not supported "
                                  "(losses live in the baselines)")


def decoder_forward(model, parts, input_ids=None, attention_mask=None, position_ids=None, *, inputs_embeds=None,
                    cu_seqlens=None, past_key_values: KVCache | None = None, use_cache: bool = False,
                    replace_position: int | None = None, block_diffusion: bool = False, output_logits: bool = True,
                    output_router_logits: bool = False, logits_at: slice | None = None) -> DLLMOutput:
    """The forward pass every family shares: embed, one layout, the layers, final norm, head.

    `parts` = (embed, layers, norm, head, rope) where `rope(positions, dtype)` returns the layers'
    cos/sin and each layer is called as `layer(x, cos_sin, layout, index)` -> (x, router_logits).

    Cache use: `use_cache=True` appends the new keys to `past_key_values` (a fresh `KVCache` when
    None); a cache with `use_cache=False` is only read; `replace_position=s` overwrites cached
    positions [s, s + L) (dual cache). `block_diffusion=True` takes `[x_t ; x_0]` and returns the
    outputs of the x_t half only. `logits_at` (a slice of the positions): the head runs on those positions only
    and the logits are theirs (the model's own, unaligned), as a sampler reads one block of its canvas.
    """
    embed, layers, norm, head, rope = parts
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("give exactly one of input_ids and inputs_embeds")
    if past_key_values is not None and not isinstance(past_key_values, KVCache):
        raise TypeError(f"past_key_values must be a dare.models.core.KVCache (the one a forward with use_cache=True "
                        f"returns), got {type(past_key_values).__name__}")
    # (a captured step, `dare.rollout.core.StepForward`, runs outside `sequence_parallel`: dynamo cannot read it)
    group, length = None if torch.compiler.is_compiling() else _SEQUENCE_GROUP.get(), None
    if group is not None:
        if past_key_values is not None or cu_seqlens is not None or output_router_logits:
            raise ValueError("a sequence-parallel forward takes no cache, no packed input and no router logits")
        input_ids, inputs_embeds, attention_mask, position_ids, length = _pad_to_group(
            torch.distributed.get_world_size(group), input_ids, inputs_embeds, attention_mask, position_ids,
            block_diffusion)
    x = embed(input_ids) if inputs_embeds is None else inputs_embeds
    shape_ids = input_ids if input_ids is not None else x[..., 0]
    if use_cache and past_key_values is None:
        past_key_values = KVCache()
    mode = None
    if past_key_values is not None:
        mode = "replace" if replace_position is not None else ("append" if use_cache else "read")
    layout = make_layout(model, shape_ids, attention_mask, position_ids, cu_seqlens=cu_seqlens,
                         past_key_values=past_key_values, cache_mode=mode,
                         replace_start=0 if replace_position is None else replace_position,
                         block_diffusion=block_diffusion)
    if group is not None:  # Ulysses: this rank's contiguous share of the positions
        P, r = torch.distributed.get_world_size(group), torch.distributed.get_rank(group)
        n = x.shape[1] // P
        x, layout.sequence_group = x[:, r * n:(r + 1) * n], group
        cos_sin = rope(layout.positions[:, r * n:(r + 1) * n], x.dtype)
    else:
        cos_sin = rope(layout.positions, x.dtype)
    routers = []
    recompute = getattr(model, "gradient_checkpointing", False) and model.training and torch.is_grad_enabled()
    for i, layer in enumerate(layers):
        if recompute:
            x, router_logits = model._gradient_checkpointing_func(layer.__call__, x, cos_sin, layout, i)
        else:
            x, router_logits = layer(x, cos_sin, layout, i)
        if router_logits is not None:
            routers.append(router_logits)
    x = norm(x)
    if group is not None:  # per position so far: gathered before the head, which every rank applies in full
        x = _GatherPositions.apply(x, group)
    if block_diffusion:
        x = x[:, : x.shape[1] // 2]
    if group is not None:
        x = x[:, :length]  # without the positions added for the split
    if logits_at is not None and output_logits:
        x = x[:, logits_at]
    out = head(x) if output_logits else x
    return DLLMOutput(logits=out if output_logits else None, last_hidden_state=None if output_logits else out,
                      past_key_values=past_key_values,
                      router_logits=tuple(routers) if output_router_logits and routers else None)
