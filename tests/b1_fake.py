"""A deterministic stand-in model for pinning b1's dynamic-size blocks (`tests/test_dynamic_blocks.py`) against the
reference's `dynamic_generate` (`YanJiangJerry/Block-R1@fd7a1b8`, `rl/trainers/dynamic_generate.py`), which imports
this file unchanged from a scratch folder outside the repository: causal (position i's logits read tokens 0..i
only, so a forward over a prefix gives the prefix's logits; the first token picks a row's own table), with a strong bias towards the marker every few
positions so that rows end blocks at different places, and an EOS late in some rows."""

from types import SimpleNamespace

import torch

V, PAD, EOS, MASK, MARKER = 16, 0, 1, 2, 3
BLOCK = 4  # the model's block (its facts); the pinned prompts have lengths that are multiples of it


class FakeModel(torch.nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Parameter(torch.randn(V, 8, generator=g), requires_grad=False)
        self.out = torch.nn.Parameter(torch.randn(8, V, generator=g), requires_grad=False)
        self.pos = torch.nn.Parameter(torch.randn(512, V, generator=g), requires_grad=False)
        self.row = torch.nn.Parameter(torch.randn(V, 512, V, generator=g), requires_grad=False)
        bias = torch.zeros(512, V)
        bias[:, MASK] = -30.0  # never predicted (real checkpoints never predict the mask)
        bias[:, PAD] = -30.0
        bias[:, MARKER] = -1.0
        bias[13::6, MARKER] = 4.0  # a marker is likely every 6th position (from 13), depending on the context
        bias[:, EOS] = -8.0
        bias[50:, EOS] = 2.0
        self.bias = torch.nn.Parameter(bias, requires_grad=False)
        self.config = SimpleNamespace(_name_or_path="fake-b1", model_type="fake")

    @property
    def dtype(self):
        return torch.float32

    def dllm_facts(self):
        from dare.models.registry import ModelFacts

        return ModelFacts(family="sdar", mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, logits_shift=False,
                          attention="block_causal", block_size=BLOCK)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        L = input_ids.shape[1]
        e = self.emb[input_ids]  # (B, L, 8)
        decay = 0.7 ** torch.arange(L, dtype=torch.float32)
        # h_i = sum_{j <= i} 0.7^(i - j) e_j: causal
        w = torch.tril(decay[:, None] / decay[None, :].clamp(min=1e-30))  # (L, L) 0.7^(i - j) for j <= i
        w = torch.where(torch.tril(torch.ones(L, L, dtype=torch.bool)), w, 0.0)
        h = torch.einsum("ij,bjd->bid", w, e)
        logits = 0.4 * h @ self.out + 2.0 * self.pos[:L] + 1.5 * self.row[input_ids[:, 0], :L] + self.bias[:L]
        return SimpleNamespace(logits=logits)


class FakeTokenizer:
    eos_token_id = EOS

    def encode(self, text, add_special_tokens=False):
        return [MARKER] if text == "block" else [4 + (ord(c) % 12) for c in text]


PROMPTS = [[4, 5, 6, 7, 8, 9, 10, 11], [11, 10, 9, 8, 7, 6, 5, 4], [6, 6, 7, 7, 8, 8, 9, 9]]
"""Three prompts of 8 tokens (two model blocks): no padding, so both canvases are the same."""
GEN, STEPS = 64, 32
"""gen_length, and the reference's total steps: windows of GEN // 2 tokens, STEPS // 2 steps each."""
