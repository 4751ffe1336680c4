"""Inpainting in the masked sampler (`generate(..., fixed=...)`: IGPO's hints): given tokens stand from the start and
are never committed over, each block's quota is split over the positions still masked in each row, and without given
tokens the sampler is the plain one, bit for bit.

The pin: the ORIGINAL `generate_inpainting` (facebookresearch/igpo @e85eaea, utils/generate.py; run in a scratch
folder, never committed) at temperature 0 on `injected()`'s tiny LLaDA (tests/test_tracerl_masked.py) and its first
three prompts (one length: the original passes no attention mask), 12 tokens in blocks of 6 over 6 steps, its hint
canvas injected in place of `create_spacing_scaled_inpainting_sequence` (`FIXED`, one row at a time as it calls it)."""

import pytest
import torch

from dare.config import DecodingConfig, MaskedOptions
from dare.rollout import generate
from dare.utils import UserError
from test_block_rl import tiny
from test_tracerl_masked import injected

DECODING = DecodingConfig(gen_length=12, block_length=6, steps=6, temperature=0.0)
# the original's completions: row 0 given 3 tokens (positions 0, 1, 7), row 1 six (2-7: the first block keeps 2
# free positions, the second 4), row 2 none
GENERATED = [[12, 14, 18, 18, 9, 4, 9, 18, 9, 9, 9, 9], [9, 9, 9, 10, 11, 12, 13, 14, 9, 9, 9, 9],
             [18, 18, 18, 18, 18, 18, 4, 4, 9, 9, 9, 9]]


def setup():
    model, batch, _ = injected("llada")
    P = batch.prompt_length
    prompts, mask = batch.sequences[:3, :P], batch.attention_mask[:3, :P]
    fixed = torch.full((3, 12), -1)
    fixed[0, [0, 1, 7]] = torch.tensor([12, 14, 18])
    fixed[1, 2:8] = torch.tensor([9, 10, 11, 12, 13, 14])
    return model, prompts, mask, fixed


def test_inpainting_matches_the_reference():
    model, prompts, mask, fixed = setup()
    out = generate(model, prompts, mask, DECODING, fixed=fixed)
    assert out.sequences[:, prompts.shape[1]:].tolist() == GENERATED
    given = fixed >= 0
    assert (out.step_map[given] == -1).all() and (out.step_map[~given] >= 0).all()  # given: never committed
    # row 1's first block: 2 free positions over its 3 steps, one each in the first two (quota [1, 1, 0])
    assert sorted(out.step_map[1, :2].tolist()) == [0, 1]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_no_given_token_is_the_plain_sampler(temperature):
    model, prompts, mask, _ = setup()
    decoding = DecodingConfig(gen_length=12, block_length=6, steps=6, temperature=temperature)
    a = generate(model, prompts, mask, decoding, torch.Generator().manual_seed(3))
    b = generate(model, prompts, mask, decoding, torch.Generator().manual_seed(3), fixed=torch.full((3, 12), -1))
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.step_map, b.step_map) and a.nfe == b.nfe


def test_given_tokens_survive_sampling():
    model, prompts, mask, fixed = setup()
    out = generate(model, prompts, mask, DecodingConfig(gen_length=12, block_length=6, steps=6, temperature=1.2),
                   torch.Generator().manual_seed(0), fixed=fixed)
    given = fixed >= 0
    assert torch.equal(out.sequences[:, prompts.shape[1]:][given], fixed[given])


def test_inpainting_refuses_what_it_does_not_follow():
    model, prompts, mask, fixed = setup()
    for masked in (MaskedOptions(cache="prefix"), MaskedOptions(threshold=0.9)):
        with pytest.raises(UserError, match="inpainting"):
            generate(model, prompts, mask, DecodingConfig(gen_length=12, block_length=6, steps=6, masked=masked),
                     fixed=fixed)
    block_model = tiny("sdar")
    with pytest.raises(UserError, match="masked sampler"):
        generate(block_model, prompts, mask, DecodingConfig(gen_length=12, block_length=6, steps=6), fixed=fixed)


def test_given_tokens_of_the_wrong_shape_are_refused():
    model, prompts, mask, fixed = setup()
    with pytest.raises(UserError, match=r"shape \(3, 11\); the rollout is \(3, 12\)"):
        generate(model, prompts, mask, DECODING, fixed=fixed[:, :11])
