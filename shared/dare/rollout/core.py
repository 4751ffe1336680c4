"""Rollout outputs and the padding/response helpers shared by every sampler."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RolloutOutput:
    sequences: torch.Tensor
    """(B, P + G): the left-padded prompt followed by the generated tokens."""
    attention_mask: torch.Tensor
    """(B, P + G): 0 on prompt padding, 1 elsewhere."""
    prompt_length: int
    """P, the padded prompt length; the response is `sequences[:, P:]`."""
    response_mask: torch.Tensor
    """(B, G) bool: generated tokens up to and including the first EOS."""
    step_map: torch.Tensor
    """(B, G) long: the decoding step at which each generated position was committed."""
    nfe: int
    """Forward passes of the model (a CFG step counts once)."""

    @property
    def responses(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_length:]


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (ids, mask), both (B, max_len)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def response_mask(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    """True for tokens up to and including the first EOS (all tokens when there is none). (B, G)"""
    is_eos = responses == eos_id
    return torch.cumsum(is_eos.long(), dim=1) - is_eos.long() == 0


def decode_responses(tokenizer, responses: torch.Tensor, eos_id: int) -> list[str]:
    """Text of each response cut at the first EOS, special tokens removed."""
    texts = []
    for row in responses.tolist():
        if eos_id in row:
            row = row[: row.index(eos_id)]
        texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return texts

