"""Sequence packing: variable-length sequences concatenated into one row with `cu_seqlens`, so
no compute is spent on padding (the models attend within each sequence only: flash-attn varlen
on GPU, one attention call per sequence on CPU; see `dare.models.core`). The one implementation:
the log-prob passes (`dare.train.estimators`, `Compute.pack`) pack padded batches with
`pack_padded` / `unpack_padded`; `pack` / `pad` build either layout from a list of sequences."""

from __future__ import annotations

import torch


def cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    """(n,) sequence lengths -> (n + 1,) int32 offsets of each sequence in the packed row."""
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=lengths.device)
    cu[1:] = lengths.cumsum(0)
    return cu


def pack(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D tensors -> (packed (1, total), cu_seqlens (n + 1,) int32)."""
    return torch.cat(list(rows))[None], cu_seqlens(torch.tensor([len(r) for r in rows]))


def unpack(packed: torch.Tensor, cu_seqlens: torch.Tensor) -> list[torch.Tensor]:
    """(1, total, ...) -> the per-sequence slices."""
    cu = cu_seqlens.tolist()
    return [packed[0, s:e] for s, e in zip(cu[:-1], cu[1:])]


def pack_padded(attention_mask: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A padded batch -> (cu_seqlens, each (B, L) tensor's real positions (attention_mask 1) packed into
    one row (1, total)), in row-major order (each row's positions in order, row after row)."""
    keep = attention_mask.bool()
    return (cu_seqlens(keep.sum(dim=1)), *(t[keep][None] for t in tensors))


def unpack_padded(packed: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_padded`: (1, total) -> (B, L), the values at the real positions, 0 at the pads."""
    keep = attention_mask.bool()
    out = packed.new_zeros(keep.shape)
    out[keep] = packed[0]
    return out


def pad(rows: list[torch.Tensor], value: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D tensors -> right-padded (B, max_len) and its attention mask."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=rows[0].dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return out, mask
