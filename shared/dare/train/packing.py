"""Sequence packing: variable-length sequences concatenated into one row with `cu_seqlens`, so
no compute is spent on padding (the models attend within each sequence only: flash-attn varlen
on GPU, one attention call per sequence on CPU; see `dare.models.core`)."""

from __future__ import annotations

import torch


def pack(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D tensors -> (packed (1, total), cu_seqlens (n + 1,) int32)."""
    lengths = torch.tensor([len(r) for r in rows])
    cu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    return torch.cat(list(rows))[None], cu


def unpack(packed: torch.Tensor, cu_seqlens: torch.Tensor) -> list[torch.Tensor]:
    """(1, total, ...) -> the per-sequence slices."""
    cu = cu_seqlens.tolist()
    return [packed[0, s:e] for s, e in zip(cu[:-1], cu[1:])]


def pad(rows: list[torch.Tensor], value: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D tensors -> right-padded (B, max_len) and its attention mask."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=rows[0].dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return out, mask
