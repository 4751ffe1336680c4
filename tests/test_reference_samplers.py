"""The samplers against the original code, token for token at temperature 0.

The expected outputs below were produced by running the ORIGINAL functions (in a scratch folder
outside this repository, never committed) on the same tiny weights as `sharp()` builds here:
  - SDAR: `JetAstra/SDAR@c2041a8:generate.py::block_diffusion_generate`; its model call with
    `store_kv` was emulated by recomputing the stored prefix (the cache is exact), and its sampling
    function replaced at T = 0 by the argmax with its softmax probability (the original divides
    the logits by the temperature, so T = 0 is undefined there).
  - LLaDA2.0 / 2.1: `generate` of `modeling_llada2_moe.py` / `modeling_llada21_moe.py` as
    mirrored in `ZHZisZZ/dllm@ca17675:dllm/pipelines/llada2{,1}/models/`, one prompt at a time
    (their batch size is 1), with our LLaDA2 model as `forward`.
  - LLaDA: `ML-GSAI/LLaDA@b7e6c35:generate.py::generate` with its hard-coded EOS/EoT ids
    (126081/126348) replaced by the tiny tokenizer's, batched with left padding and the
    attention mask, as the original supports.
  - LLaDA with a parallel rule and no cache: `NVlabs/Fast-dLLM@f6b35ec:llada/generate.py::generate`
    (threshold and factor), one row at a time and batched (details at `FAST_DLLM_CASES`).
  - LLaDA's TraceRL rollout: `Gen-Verse/dLLM-RL@10b4fd1:sample/llada_rl_rollout.py` (the prefix cache's
    window `further_horizon`, margin confidence; details at `FURTHER_HORIZON_CASES`).
Our sampler runs the whole batch at once (mixed prompt lengths, none a block multiple, so the
last block is partial), with and without the cache; each row must equal the original alone.
LLaDA2 returns the response cut after its first EOS; we compare that prefix.

SDAR cases use steps = block size (quota 1): with a larger quota the original's `topk` over a
block with fewer masks than the quota also picks -inf positions and overwrites decoded or
prompt tokens (deviation 3 of `dare.rollout.block`); with that one line capped, the original
agreed with ours on the quota-2 cases too (checked in the same scratch run).
"""

import math
from dataclasses import dataclass, field

import pytest
import torch

from dare.config import DecodingConfig, ScratchModelConfig
from dare.models import facts, new_model
from dare.models.tokenizer import char_tokenizer
from dare.rollout import generate, left_pad
from dare.utils import UserError

PROMPTS = [[5, 6, 7], [5, 6, 7, 8, 9, 10, 11], [9, 8], [4, 5, 6, 7, 8]]


def sharp(family: str, seed: int):
    """A tiny random model with a sharpened head (so thresholds and ties matter) that never
    predicts MASK (its head row is zero: a finite logit below the maximum), as trained
    checkpoints; the scratch runs built exactly this."""
    tok = char_tokenizer("0123456789+=", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64),
                      seed=seed).eval()
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        head.mul_(40)
        head[facts(model).mask_token_id] = 0
    return model


def decode(model, p, prompts=PROMPTS):
    ids, mask = left_pad(prompts, facts(model).pad_token_id)
    return generate(model, ids, mask, p).responses.tolist()


BLOCK_CASES = {  # (family, seed, decoding) -> the original's outputs for PROMPTS, gen_length 16, block 4
    ("sdar", 0, "steps=4 threshold=0"): [  # low_confidence_static
        [9, 9, 9, 9, 9, 9, 9, 9, 9, 3, 9, 9, 9, 9, 9, 9], [14, 14, 9, 16, 9, 9, 14, 14, 9, 16, 16, 16, 9, 14, 16, 16],
        [9, 15, 16, 16, 16, 16, 13, 9, 16, 16, 9, 3, 3, 9, 9, 3], [9, 14, 14, 16, 16, 16, 9, 16, 16, 9, 16, 3, 9, 9, 16, 9]],
    ("sdar", 0, "steps=4 threshold=0.5"): [  # low_confidence_dynamic
        [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], [14, 9, 9, 9, 9, 14, 14, 9, 9, 16, 16, 9, 3, 3, 16, 16],
        [9, 15, 16, 16, 16, 16, 13, 9, 16, 16, 9, 9, 3, 9, 9, 3], [9, 9, 14, 14, 16, 9, 16, 16, 9, 14, 16, 16, 9, 16, 16, 9]],
    ("sdar", 0, "steps=4 threshold=0.9"): [
        [9, 9, 9, 9, 9, 9, 9, 9, 9, 3, 9, 9, 9, 9, 9, 9], [14, 14, 9, 16, 9, 9, 14, 14, 9, 16, 16, 16, 9, 14, 16, 16],
        [9, 15, 16, 16, 16, 16, 13, 9, 16, 16, 9, 3, 3, 9, 9, 3], [9, 14, 14, 16, 16, 16, 9, 16, 16, 9, 16, 3, 9, 9, 16, 9]],
    ("llada2", 2, "steps=4 threshold=0.5"): [  # LLaDA2.0
        [10, 5, 14, 10, 10, 16, 5, 14, 16, 10, 14, 10, 10, 14, 10, 10], [10, 10, 4, 4, 4, 16, 10, 10, 10, 10, 4, 10, 1],
        [7, 10, 5, 14, 10, 16, 1], [10, 10, 14, 10, 10, 10, 14, 5, 10, 10, 16, 10, 14, 16, 14, 10]],
    ("llada2", 2, "steps=2 threshold=0.9"): [  # quota 2 per step, capped by the masks left
        [10, 5, 14, 14, 10, 16, 5, 5, 16, 10, 10, 10, 14, 14, 10, 10], [10, 10, 4, 4, 4, 16, 10, 10, 10, 4, 4, 4, 10, 1],
        [10, 10, 7, 7, 3, 10, 7, 7, 14, 14, 3, 4, 16, 16, 7, 14],
        [10, 10, 14, 10, 10, 10, 14, 5, 5, 10, 16, 16, 16, 14, 14, 10]],
    ("llada2", 2, "steps=4 threshold=0.5 editing_threshold=0.6 max_post_steps=16"): [  # LLaDA2.1
        [14, 6, 4, 17, 17, 16, 16, 16, 4, 9, 14, 14, 4, 10, 4, 9], [10, 10, 17, 17, 10, 17, 17, 17, 11, 17, 17, 17, 17, 17, 17, 17],
        [4, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [3, 3, 17, 9, 4, 14, 4, 4, 4, 14, 4, 4, 4, 4, 4, 4]],
    ("llada2", 2, "steps=4 threshold=0.5 editing_threshold=0.3 max_post_steps=2"): [
        [8, 9, 9, 10, 14, 9, 1], [12, 1], [14, 3, 14, 4, 4, 4, 4, 9, 9, 4, 4, 4, 4, 4, 4, 4],
        [4, 17, 17, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]],
    ("llada2", 2, "steps=4 threshold=0.9 editing_threshold=0.5 max_post_steps=3"): [
        [16, 9, 16, 9, 14, 9, 17, 16, 10, 16, 9, 9, 6, 9, 14, 9], [17, 9, 8, 17, 17, 16, 16, 1],
        [14, 5, 4, 9, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [17, 8, 6, 4, 14, 11, 9, 14, 17, 9, 10, 4, 4, 14, 14, 14]],
}


def _settings(text: str, **options) -> dict:
    """"steps=4 threshold=0.5 ..." as DecodingConfig keywords: `steps` and the block sampler's options."""
    values = {k: (int(v) if k in ("steps", "max_post_steps") else float(v))
              for k, v in (kv.split("=") for kv in text.split())}
    return {"steps": values.pop("steps"), "block": {**values, **options}}


@pytest.mark.parametrize("family, seed, settings", list(BLOCK_CASES), ids=[" ".join(map(str, k)) for k in BLOCK_CASES])
@pytest.mark.parametrize("cache", ["auto", "none"])
def test_block_sampler_matches_the_original_token_for_token(family, seed, settings, cache):
    """SDAR/LLaDA2 block decoding: the last partial block decoded whole, the schedule split of
    the block size over steps capped by what is masked, LLaDA2.1's editing with per-row post-step
    counters (the batch gives each row what the original gives it alone)."""
    model = sharp(family, seed)
    expected = BLOCK_CASES[(family, seed, settings)]
    got = decode(model, DecodingConfig(gen_length=16, **_settings(settings, cache=cache)))
    for row, want in zip(got, expected):
        assert row[:len(want)] == want
        if len(want) < 16:  # the original stops after its first EOS
            assert want[-1] == facts(model).eos_token_id


def test_block_sampler_ignores_top_p_and_top_k_at_temperature_zero():
    """At T = 0 both originals take the argmax with its UNFILTERED softmax probability as the
    confidence; renormalising over top-p/top-k (Dream's rule) would push every confidence up and
    change what the threshold commits."""
    from dare.rollout.block import choose

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])  # the last id plays MASK
    token, p = choose(logits, DecodingConfig(temperature=0.0, block={"top_p": 0.5, "top_k": 1}), mask_id=3,
                      generator=None)
    assert token.tolist() == [0]
    assert p.item() == pytest.approx(math.exp(2) / (math.exp(2) + math.exp(1) + 1 + math.exp(-1)))
    model = sharp("llada2", 2)
    filtered = decode(model, DecodingConfig(gen_length=16, steps=4, block={"threshold": 0.5, "top_p": 0.3, "top_k": 2}))
    for row, want in zip(filtered, BLOCK_CASES[("llada2", 2, "steps=4 threshold=0.5")]):
        assert row[:len(want)] == want


def test_block_schedule_splits_the_block_size_over_steps():
    from dare.rollout.block import schedule

    assert schedule(4, 4) == [1, 1, 1, 1]
    assert schedule(32, 5) == [7, 7, 6, 6, 6]  # get_num_transfer_tokens(32, 5): the remainder to the first steps
    assert schedule(4, 8) == [1, 1, 1, 1, 0, 0, 0, 0]


def test_block_sampler_decodes_the_whole_last_block():
    """A 3-token prompt with gen_length 16 and block 4 ends mid-block (19 of 20 positions): the
    originals fill the 20th with MASK and decode it too; we return only the 16 generated tokens.
    One row alone takes as many forwards as its blocks need: prefill none (the prompt block is
    partial and decoded first), then per block its steps (one token each) and one cache write:
    block 0 holds 1 mask, blocks 1-4 hold 4 each (the last one's 4th being the 20th position)."""
    model = sharp("sdar", 0)
    ids, mask = left_pad([[5, 6, 7]], facts(model).pad_token_id)
    out = generate(model, ids, mask, DecodingConfig(gen_length=16, steps=4, record=("states",)))
    assert out.responses.shape == (1, 16)
    assert out.trajectory.shape[1] == 1 + 4 * 4
    assert out.nfe == (1 + 1) + 4 * (4 + 1)


def test_block_length_is_validated_only_for_the_masked_sampler():
    """The block sampler uses the model's block and Dream's sampler has none; sampler=auto is the
    masked sampler for bidirectional families, checked when the config names the family."""
    from dare.config import ConfigError, Invalid, ModelConfig, RLConfig, load

    DecodingConfig(sampler="block", gen_length=10, block_length=32).validate()  # block_length unused there
    DecodingConfig(sampler="dream", gen_length=10, block_length=32).validate()
    DecodingConfig(sampler="auto", gen_length=10, block_length=32).validate()  # no family known here
    with pytest.raises(Invalid, match="multiple of block_length"):
        DecodingConfig(sampler="masked", gen_length=10, block_length=32).validate()

    @dataclass
    class Run:
        model: ModelConfig = field(default_factory=ModelConfig)
        rl: RLConfig = field(default_factory=RLConfig)

    load(Run, overrides=["model.family=sdar", "rl.decoding.gen_length=10"])  # SDAR decodes with its own block
    with pytest.raises(ConfigError, match=r"rl\.decoding\.gen_length: gen_length \(10\) must be a multiple of "
                                          r"block_length \(32\).*from command line"):
        load(Run, overrides=["model.family=llada", "rl.decoding.gen_length=10"])


# ------------------------------------------------------------------------------------------------
# Fast-dLLM's no-cache `generate` with a parallel rule (threshold, factor): every block decoded until it is
# clean, however many forwards that takes.
#
# The ORIGINAL, NVlabs/Fast-dLLM @f6b35ec `llada/generate.py::generate` (with `get_transfer_index` and
# `get_transfer_index_dynamic`), run in a scratch folder on the `sharp` LLaDA models (seeds 0 and 3), T = 0:
#   - one row at a time for PROMPTS (its `generate` takes no attention mask, so a left-padded batch would
#     attend the padding): the four responses and each row's forward count;
#   - batched, on EQUAL (four prompts of one length, no padding): the responses and the batch's forwards.
#     The original's factor rule raises an IndexError on a row whose block is already clean while another
#     row's is not (`threshs[0] = -1` on an empty list); the cases marked "patched" ran with that row skipped
#     (`continue` when the row has no mask: the guard later forks add), everything else as released.
# Tokens are written one character each (0-9, a-z = ids 0-35).

EQUAL = [[5, 6, 7, 8, 9], [9, 8, 7, 6, 5], [4, 4, 5, 5, 6], [10, 11, 5, 6, 7]]
FAST_DLLM_CASES = {  # (seed, block, steps, rule) -> (PROMPTS one by one, their forwards, EQUAL batched, forwards)
    (0, 4, 4, "threshold=0.5"): ("iiiiiiii44449999 iiii4i4499999999 iiiiiiii44449999 iiiiiiii44449999", [4, 9, 4, 4],
        "iiiiiiii44449999 iiiiiiii44449999 iiiiiiii94449999 iiiiiiii44449999", 7),
    (0, 4, 4, "threshold=0.9"): ("iiii4ii444999999 iiii4i4499999999 iiiiiii444999999 iiiiiii494499999", [16, 15, 16, 16],
        "iiii4ii494999999 iiii44ii94999999 iiii4iii94499999 iiii44i494999999", 16),
    (0, 4, 4, "factor=1.0"): ("iiii4ii444999999 iiii4i4499999999 iiiiiiii44449999 iiiiiiii44449999", [9, 8, 9, 9],
        "iiii4ii494999999 iiii44ii94999999 iiiiiiii44449999 iiii44i494999999", 9),
    (0, 4, 4, "factor=2.0"): ("iiiiiiii44449999 iiiiii4444999999 iiiiiiii44449999 iiiiiiii44449999", [4, 6, 4, 4],
        "iiiiiiii44449999 iiiiiiii44449999 iiiiiiii44449999 iiiiiiii44449999", 5),  # patched
    (0, 8, 2, "threshold=0.5"): ("iiiiiiii44444444 iiiiiiii44444444 iiiiiiii44444444 iiiiiiii44444444", [2, 2, 2, 2],
        "iiiiiiii44444444 iiiiiiii44444444 iiiiiiii94449999 iiiiiiii44444444", 6),
    (0, 8, 2, "threshold=0.9"): ("44iiiiii44999999 444iiiii99999999 i4iiiiii44999999 4iiiiiii94499999", [16, 15, 16, 16],
        "44iiiiii94999999 4iii4iii94999999 4iiiiiii94499999 44i4iiii94999999", 16),
    (0, 8, 2, "factor=1.0"): ("44iiiiii44999999 44iii4ii99999999 iiiiiiii44499999 iiiiiiii44499999", [10, 10, 10, 10],
        "44iiiiii94999999 4iii4iii94999999 iiiiiiii94449999 44i4iiii94999999", 11),  # patched
    (0, 8, 2, "factor=2.0"): ("iiiiiiii44449999 iiiiiiii44499999 iiiiiiii44499999 iiiiiiii44499999", [3, 4, 4, 4],
        "iiiiiiii44499999 iiiiiiii44499999 iiiiiiii44449999 iiiiiiii44449999", 4),  # patched
    (0, 16, 1, "threshold=0.5"): ("iiiiiiiiiiiiiiii iiiiiiiiiiiiiiii iiiiiiiiiiiiiiii iiiiiiiiiiiiiiii", [1, 1, 1, 1],
        "iiiiiiiiiiiiiiii iiiiiiiiiiiiiiii iiiiiiiiiiiiiiii iiiiiiiiiiiiiiii", 1),
    (0, 16, 1, "threshold=0.9"): ("9944499994iiiiii 4449999999iii9ii 9944i99994iiiiii 994449999iiiiiii", [16, 15, 16, 16],
        "9944999994iiiiii 499449999i9iiiii 99944999i4iiiiii 99444999994iiiii", 16),
    (0, 16, 1, "factor=1.0"): ("9944499994iiiiii 444999999ii9ii9i 9944ii99949iiiii 994449999iiiiiii", [11, 11, 11, 11],
        "994499i994iiii9i 49944999i99iiiii 99944999i4iiiiii 99444999994iiiii", 12),  # patched
    (0, 16, 1, "factor=2.0"): ("4944499iiiiiiiii 444ii9999iii99ii 444iiii94iiii999 99444999iiiiiiii", [3, 4, 3, 4],
        "99944iii94iiiiii 4ii9944iii99iiii 9999444iiii4iiii 994449ii999iiiii", 4),  # patched
    (3, 4, 4, "threshold=0.5"): ("hhhhggggg3ggg333 gghhggggg33ggg33 hhhhgggggg33333g hhggggggggg6666g", [13, 16, 13, 16],
        "hhhhgggggg3g3gg3 hhhhgggggg3g3gg3 ggggg66gg66666g6 hhhhgggg33ggg333", 16),
    (3, 4, 4, "threshold=0.9"): ("hghhggggg3ggg333 gghhggggg33ggg33 hhhggggg3gg3333g hhggggggggg6666g", [16, 16, 16, 16],
        "gghhgggggg3g3g63 gghhggggg3ggg633 ggggg66gg66666g6 hhghgggg33ggg333", 16),
    (3, 4, 4, "factor=1.0"): ("hhhhgggg33ggggg3 gghhgggggg3g3333 hhhhggggg333333g hhgggggggggg6666", [12, 12, 12, 12],
        "gghhgggggggg3333 gghhgggggggg3333 gggggg6g6666666g hhhhgggg333gggg3", 12),
    (3, 4, 4, "factor=2.0"): ("hhhhgggg33gggg33 gghhgggg33gggg33 hhhhggggg33g3333 hhgggggggggg6666", [7, 8, 7, 8],
        "hhhhgggggggg3333 hhhhgggggggg3333 gggggg6g666666gg hhhhgggg33gggg33", 9),  # patched
    (3, 8, 2, "threshold=0.5"): ("hhhhhhhhgg33333g gghhgggg333gggg3 hhhhhhhh3g33333g ggggghhgg6666ggg", [9, 16, 9, 16],
        "hhhhhhhhgg3333gg hhhhhhhhgg3333gg ggggg66g666666gg hhhhhhhh3gg33333", 16),
    (3, 8, 2, "threshold=0.9"): ("ggghhhggg3333ggg gghhgggg333gggg3 hgggghhggg33333g ggggghhgg6666ggg", [16, 16, 16, 16],
        "ggghhgggg333ggg6 gghhgggg6333gggg ggggg66g666666gg gggghhhgg33333gg", 16),
    (3, 8, 2, "factor=1.0"): ("ggghhhgggg333ggg gghhgggg333ggg33 hgggghhgggg3333g ggggghhgg6666ggg", [14, 14, 14, 14],
        "ggghhgggg333ggg3 gghhgggg3333gggg gggggg6g6666666g gggghhhggg3333gg", 14),
    (3, 8, 2, "factor=2.0"): ("ggghhhhgg3333ggg gghhgggg333gggg3 hgggghhh3g33333g ggggghhgg666gggg", [7, 8, 7, 9],
        "ggghhhggg3333ggg gghhhgggg333ggg3 gggggg6g6g66666g gggghhhggg3333gg", 9),  # patched
    (3, 16, 1, "threshold=0.5"): ("hhhhhhhhhhhhhhhh ggh3ggggh3gggg33 hhhhhhhhhhhhhhhh gggg6hhggg666ggg", [1, 16, 1, 16],
        "hhhhhhhhhhhhhhhh hhhhhhhhhhhhhhhh 666g66666ggggggg hhhhhhhhhhhhhhhh", 15),
    (3, 16, 1, "threshold=0.9"): ("ggg3hh3gggh33ggg ggh3ggggh3gggg33 33ggghh3ggg3h3gg gggg6hhggg666ggg", [16, 16, 16, 16],
        "ggghh3ggg633gggg gggh33gggh63gggg 666g66666ggggggg 3gg3hh3ggg3h3ggg", 16),
    (3, 16, 1, "factor=1.0"): ("gggghh3gggh33ggg g3h3ggggh3gggg33 33ggghh3ggg3h3gg gggg6hhggg666ggg", [15, 15, 15, 15],
        "ggghh3ggg333gggg gggh33gggh33gggg 666g66666ggggggg 3ggghh3ggg3h3ggg", 15),
    (3, 16, 1, "factor=2.0"): ("3ggghhhggg3h33gg gghhgggg333gggg3 h3gg3hh3ggg3h33g gggg6hhggg66gggg", [7, 8, 7, 9],
        "ggghhhggggg33ggg gghhgggggh33gggg g666g6666ggggggg 3ggghhhggg3333gg", 9),  # patched
}
_ID = "0123456789abcdefghijklmnopqrstuvwxyz"


def _tokens(text: str) -> list[list[int]]:
    return [[_ID.index(c) for c in row] for row in text.split()]


@pytest.mark.parametrize("case", list(FAST_DLLM_CASES), ids=[" ".join(map(str, c)) for c in FAST_DLLM_CASES])
def test_parallel_decoding_without_a_cache_matches_fast_dllm(case):
    """Our masked sampler, cache none, batched with left padding: each row the original's alone (and its
    forward count when decoded alone); the equal-length batch the original's batch, forwards included."""
    seed, BL, steps, rule = case
    name, value = rule.split("=")
    rows, nfe, batched, batched_nfe = FAST_DLLM_CASES[case]
    model = sharp("llada", seed)
    decoding = DecodingConfig(gen_length=16, block_length=BL, steps=steps, masked={"cache": "none", name: float(value)})
    assert decode(model, decoding) == _tokens(rows)
    assert [generate(model, *left_pad([p], 0), decoding).nfe for p in PROMPTS] == nfe
    ids, mask = left_pad(EQUAL, facts(model).pad_token_id)
    out = generate(model, ids, mask, decoding)
    assert out.responses.tolist() == _tokens(batched) and out.nfe == batched_nfe


# ------------------------------------------------------------------------------------------------
# TraceRL's LLaDA rollout: the prefix cache with a window after the block (`further_horizon`) and the margin
# confidence (`target: margin_confidence`), static (the quota) and dynamic (a threshold).
#
# The ORIGINAL, Gen-Verse/dLLM-RL @10b4fd1 `sample/llada_rl_rollout.py::generate_with_prefix_cache` (with its
# `get_transfer_index` and `denoise_step_map`), run in a scratch folder with `use_cache=True` on `never_mask`
# LLaDA models (seeds 0 and 3), gen 16, block 4, T = 0: one row at a time for PROMPTS and batched on EQUAL
# (its rollout passes no attention mask). Its model calls (a full forward that fills the cache, then the window
# on the cache chopped to the prefix) ran on our model and our KV cache, so this pins the sampler's logic: the
# window, the ranking over it, the schedule, both commit rules and the margin. The original evaluates the
# quota `num_transfer[:, i]` even in dynamic mode, so it raises an IndexError when a block needs more forwards
# than its steps: the dynamic cases give a block as many steps as tokens (steps 16), as rl_llada.yaml does.
# Step maps: the original runs one more forward for a block whose first forward already committed it whole
# (it checks for a clean block after the window's forward) and numbers its steps by forward, so its step
# values can skip; ours commit in the same order, and TraceRL reads only that order (its trace steps rank the
# distinct values): the test compares the ranks. Tokens (and ranks) one character each. Window 0 is the block
# alone (the original's `x[:, s:min(e + 0, L)]`); those four cases were produced later by the same harness (which
# reproduced the twelve cases above token for token, step maps included).

FURTHER_HORIZON_CASES = {  # (seed, steps, horizon, remasking, threshold) -> PROMPTS (tokens, step maps), EQUAL
    (0, 8, 4, "low_confidence", 0.0): (
        "iiii4ii444449999 iiiiii4444999999 iiii4ii444999999 iiii4ii444999999", "1100322344556677 1100223344556677 0110322344556677 1100322344556677",
        "iiii4ii444999999 iiii44ii44999999 iiiiiiii44449999 iiii44ii94499999", "0011322344556677 1001332244556677 1001332254457667 0011332254456677"),
    (0, 16, 4, "low_confidence", 0.5): (
        "iiiiiiii44449999 iiii9i4499999999 iiiiiiii44449999 iiiiiiii44449999", "0000222244446666 0000523488769999 0000222244446666 0000222244446666",
        "iiiiiiii44449999 iiiiiiii44449999 iiiiiiii94449999 iiiiiiii44449999", "0000222244448888 0000222244448888 0000222275468888 0000222244448888"),
    (0, 16, 4, "low_confidence", 0.9): (
        "iiii44i4944i9999 iiii9i4499999999 iiiiii4444999999 iiii4ii494499999", "13025647b9a8fcde 23107456ba98cdee 1320546789bacdef 21306547b89adcef",
        "iiii4ii444999999 iiii44ii94499999 iiiiiii494499999 ii4i44ii94499999", "0321654798bacdef 21036754b89acdef 13026547b98afcde 02316745b89acdef"),
    (0, 16, 4, "margin", 0.0): (
        "iiii44i4494i9999 iiii4i4999999999 iiii4ii444999999 iiii4ii444999999", "213057469ba8fcde 23106457ab98cdef 1320745689bacdef 2130754689badcef",
        "iiii4ii444999999 iiii44ii44999999 iiii4iii49499999 ii4i44ii44999999", "0231654789bacdef 2103675489bacdef 130275468b9afcde 0231675489bacdef"),
    (0, 16, 4, "margin", 0.5): (
        "iiii44i4494i9999 iiii4i4999999999 iiii4ii444999999 iiii4ii444999999", "000035247986babb 000042358976aaaa 000052346798aaaa 000053246798babb",
        "iiii4ii444999999 iiii44ii44999999 iiii4iii49499999 iiii44i494499999", "000043256798aaaa 000045326798aaaa 000053246978babb 000034259678aaaa"),
    (0, 16, 128, "low_confidence", 0.5): (
        "iiiiiiii44449999 iiiiii4449999999 iiiiiiii44449999 iiiiiiii44449999", "0000222244446666 0000324568879999 0000222244446666 0000222244446666",
        "iiiiiiii44449999 iiiiiiii44449999 iiiiiiii94449999 iiiiiiii44449999", "0000222244448888 0000222244448888 0000222275468888 0000222244448888"),
    (3, 8, 4, "low_confidence", 0.0): (
        "hgghhhgggg3333gg gghh3gg3gggggg33 hhgg3hh3gggg3333 hhgggggggggg6666", "0110223344557766 1100322355446677 0011322344556677 0011233244556677",
        "gghhggggg33ggg33 gghhggggg33ggg33 gggg66gg6gg66666 hggh33gggggg6gg6", "1100332245546677 1100332245546677 0011332245546677 0110332244556776"),
    (3, 16, 4, "low_confidence", 0.5): (
        "hhhh3gggg3ggg333 gghg3gg33gggg66g hhhhgg33gggg3333 hgggg6gggg6666g6", "000054327986adcb 12036457ba98dcef 000023546666b98a 011135429678adcb",
        "hhhhggggg33g3g33 hhhhgggggg3333g3 ggggg66gg66666g6 hhhhgg333gggg333", "000022226987dacb 000022226798bcad 011154328976adbc 000023549867adbc"),
    (3, 16, 4, "low_confidence", 0.9): (
        "gghhh3gggg3g3g33 gghg3gg33gggg66g hgggg3h3ggg3333g hgggg6gggg6666g6", "2310476589badcfe 12036457ba98dcef 0312574698abfdec 03125764b89acfed",
        "gggh3gggg6gg6g66 gggh3gggg6gg6g66 ggggg66gg66666g6 hggg3h3gggg36gg6", "123076548ab9fedc 123076459ab8fecd 01237654ab98cfde 0312746589abefdc"),
    (3, 16, 4, "margin", 0.0): (
        "gghhh3gggg3g3g33 gghg3gg3g3ggg66g hgggg3h3ggg3333g hgggg6gggg6666g6", "2310476589baecfd 12036457ab98decf 03125746a89bfdec 031247658ba9cdef",
        "gggh3gggg6ggg666 gggh3gggg6ggg666 ggggg66gg66666g6 hggggh333ggg66gg", "12307654ba98efdc 12307645ba98efdc 02137654ab98cfde 03125467b89acedf"),
    (3, 16, 4, "margin", 0.5): (
        "gghhh3gggg3g3g33 gghg3gg3g3ggg66g hgggg3h3ggg3333g hgggg6gggg6666g6", "2310476589baecfd 12036457ab98decf 03125746a89bfdec 031247658ba9cdef",
        "gggh3gggg6ggg666 gggh3gggg6ggg666 ggggg66gg66666g6 hggggh333ggg66gg", "12307654ba98efdc 12307645ba98efdc 02137654ab98cfde 03125467b89acedf"),
    (3, 16, 128, "low_confidence", 0.5): (
        "hhhhgggg33ggg333 gghhgggg333gg333 hhhhgggg3333g33g hhggggggggg6666g", "000054329876adcb 23017546ba98cfed 000023459768bdca 0132467598abcefd",
        "hhhhggggg33g3g33 hhhhgggggg3333g3 ggggg66gg66666g6 hhhhgggg333gg333", "000044448ba9fced 0000444489badecf 01236754ab98cfde 000045679ab8cfed"),
    (0, 8, 0, "low_confidence", 0.0): (  # window 0: the block alone
        "iiii4ii444999999 99ii99ii99999999 iiii9ii944999999 iiii9ii994499999", "1100322344556677 1100332255446677 0110322344556677 1100322354456677",
        "iiii9ii994499999 iiii99ii44999999 iiii99ii94499999 ii99ii9999999999", "0011322354456677 1001332244556677 1001332254457667 0011223355446776"),
    (0, 16, 0, "low_confidence", 0.5): (
        "iiiiiiii44449999 iiii9i9999999999 iiiiiiii44449999 iiiiiiii44449999", "0000222244446666 0000324466657777 0000222244446666 0000222244446666",
        "iiiiiiii44449999 iiiiiiii44449999 iiiiiiii99499999 iiiiiiii44449999", "0000222244447777 0000222244447777 0000222256467777 0000222244447777"),
    (3, 8, 0, "low_confidence", 0.0): (
        "hgghhh33gg33gggg 33hh3gg333gggggg hh33gg333gg3gggg hhggg33ggg3366gg", "0110223344557766 1100322355446677 0011223354457766 0011233244557766",
        "gghh33ggg33ggggg gghh33ggg33ggggg gggg66gg6gg66666 h33hgg333gg3gggg", "1100332245546677 1100332245546677 0011332245546677 0110223354457766"),
    (3, 16, 0, "low_confidence", 0.5): (
        "hhhh333ggggg33gg 33h3gggg333ggg6g hhhhg333gggg333g hgggg33ggg66666g", "000034425555a987 2201333386759acb 0000233344449876 011135426978acdb",
        "hhhhggggg333gggg hhhhggggg333gggg ggggg66g66g6666g hhhhg333gggg333g", "000022226777aaaa 000022226777aaaa 011154327986acdb 000023336666dcba"),
}


def never_mask(model):
    """A model whose MASK logit is -1e4 at every position (its probability 0 in float64): a no-cache rule that
    never forbids MASK (the original's) then decodes as ours, which never commits it."""
    mask_id = facts(model).mask_token_id

    def hook(head, inputs, logits):
        logits[..., mask_id] = -1e4
        return logits

    model.get_output_embeddings().register_forward_hook(hook)
    return model


def _ranks(step_maps) -> list[list[int]]:
    return [torch.unique(torch.tensor(row), return_inverse=True)[1].tolist() for row in step_maps]


@pytest.mark.parametrize("case", list(FURTHER_HORIZON_CASES), ids=[" ".join(map(str, c)) for c in FURTHER_HORIZON_CASES])
def test_prefix_window_and_margin_match_tracerls_llada_rollout(case):
    seed, steps, horizon, remasking, threshold = case
    rows, maps, batched, batched_maps = FURTHER_HORIZON_CASES[case]
    model = never_mask(sharp("llada", seed))
    decoding = DecodingConfig(gen_length=16, block_length=4, steps=steps, masked=dict(
        cache="prefix", further_horizon=horizon, remasking=remasking, threshold=threshold))
    decoding.validate()
    out = generate(model, *left_pad(PROMPTS, facts(model).pad_token_id), decoding)
    assert out.responses.tolist() == _tokens(rows)
    assert _ranks(out.step_map.tolist()) == _ranks(_tokens(maps))
    out = generate(model, *left_pad(EQUAL, facts(model).pad_token_id), decoding)
    assert out.responses.tolist() == _tokens(batched)
    assert _ranks(out.step_map.tolist()) == _ranks(_tokens(batched_maps))


def test_the_window_changes_what_the_sampler_decodes():
    """The horizon is not a no-op: on seed 3 with a threshold of 0.5 windows of 4 and of 0 (the block alone)
    decode other steps than the whole suffix (unset: no window), as the original does (the pins above), and past
    the canvas's end it is the whole suffix."""
    model = never_mask(sharp("llada", 3))
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    maps = {h: generate(model, ids, mask, DecodingConfig(gen_length=16, block_length=4, steps=16, masked=dict(
                cache="prefix", further_horizon=h, threshold=0.5))).step_map
            for h in (None, 0, 4, 128)}
    assert not torch.equal(maps[4], maps[None]) and not torch.equal(maps[0], maps[None])
    assert not torch.equal(maps[0], maps[4]) and torch.equal(maps[128], maps[None])


def test_further_horizon_and_margin_are_checked_before_decoding():
    from dare.config import ConfigError, Invalid, ModelConfig, RLConfig, load

    with pytest.raises(Invalid, match="window on the masked sampler's prefix cache"):
        DecodingConfig(masked=dict(further_horizon=8, cache="dual")).validate()
    with pytest.raises(Invalid, match="must be >= 0"):
        DecodingConfig(masked=dict(further_horizon=-1, cache="prefix")).validate()
    with pytest.raises(Invalid, match="window on the masked sampler's prefix cache.*0 is the block alone"):
        DecodingConfig(masked=dict(further_horizon=0)).validate()  # 0 is a window now, not the option unset
    DecodingConfig(masked=dict(further_horizon=0, cache="prefix")).validate()
    DecodingConfig(masked=dict(further_horizon=None, cache="dual")).validate()
    with pytest.raises(ConfigError, match=r"block\.remasking: must be one of \['low_confidence', 'left_to_right'\]"):
        load(DecodingConfig, overrides=["sampler=block", "block.remasking=margin"])  # margin: the masked sampler's

    @dataclass
    class Run:
        model: ModelConfig = field(default_factory=ModelConfig)
        rl: RLConfig = field(default_factory=RLConfig)

    with pytest.raises(ConfigError, match=r"rl\.decoding\.masked\.further_horizon.*set masked\.cache=prefix"):
        load(Run, overrides=["rl.decoding.masked.further_horizon=128"])
    load(Run, overrides=["rl.decoding.masked.further_horizon=128", "rl.decoding.masked.cache=prefix",
                         "rl.decoding.masked.remasking=margin"])
    for settings in (["rl.decoding.masked.cache=prefix", "rl.decoding.masked.further_horizon=4"],
                     ["rl.decoding.masked.remasking=margin"]):  # sampler=auto picks the block sampler on SDAR
        with pytest.raises(ConfigError, match="option of the masked sampler.*decodes with the block sampler"):
            load(Run, overrides=["model.family=sdar", *settings])


# ------------------------------------------------------------------------------------------------
# LLaDA's reference sampler: confidence_eos_eot_inf and ties


def llada_with_end_tokens(seed: int, eos_bias: float, eot_bias: float):
    """`sharp("llada", seed)` whose chat has an end-of-turn token (`<|user|>` stands in for
    `<|eot_id|>`), with the head pushed towards EOS/EoT so that many positions predict them."""
    model = sharp("llada", seed)
    tok = char_tokenizer("0123456789+=", "llada")
    model.config.eot_token_id = tok.convert_tokens_to_ids("<|user|>")
    f = facts(model)
    head, norm = model.get_output_embeddings().weight, model.model.transformer.ln_f.weight
    with torch.no_grad():
        head[f.eos_token_id] += eos_bias * norm
        head[f.eot_token_id] += eot_bias * norm
    return model


LLADA_CASES = {  # (seed, eos bias, eot bias, gen, block, steps) -> LLaDA generate.py, confidence_eos_eot_inf, T = 0
    # EoT predictions tie at confidence 0: the reference ranks the whole row (-inf outside the block)
    (0, 0.0, 0.4, 16, 8, 8): [
        [5, 5, 5, 5, 5, 5, 5, 5, 18, 5, 5, 5, 5, 9, 9, 18], [5, 5, 5, 5, 5, 5, 5, 5, 9, 5, 5, 5, 5, 9, 9, 9],
        [5, 5, 5, 5, 5, 5, 5, 5, 18, 5, 5, 5, 5, 9, 9, 18], [5, 5, 5, 5, 5, 5, 5, 5, 18, 5, 5, 5, 5, 9, 9, 18]],
    # EOS predictions: at T = 0 the reference's noised logits ARE the logits, so EOS gets confidence 0 too
    (1, 1.0, 0.0, 16, 16, 16): [
        [4] * 16, [0, 0, 0, 0, 4, 4, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4], [4] * 16, [4] * 16],
    (0, 1.0, 0.0, 16, 8, 8): [
        [1] * 16, [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 9, 9, 1], [1] * 16, [1] * 16],
}


@pytest.mark.parametrize("case", list(LLADA_CASES), ids=[str(c) for c in LLADA_CASES])
def test_llada_reference_sampler_matches_the_original_with_eos_eot_confidence(case):
    seed, eos_bias, eot_bias, G, BL, steps = case
    model = llada_with_end_tokens(seed, eos_bias, eot_bias)
    got = decode(model, DecodingConfig(gen_length=G, block_length=BL, steps=steps,
                                       masked={"confidence_eos_eot_inf": True}))
    assert got == LLADA_CASES[case]


def test_confidence_eos_eot_inf_by_hand():
    """Three positions predicting EOS (id 0), EoT (id 1) and token 2. T = 0: both EOS and EoT
    logits are -inf in the confidence softmax (the noised copy is the same tensor), so those two
    predictions get confidence 0 and token 2 gets e^3 / (e^3 + e^1); T > 0 (the draw here is
    deterministic: one dominant logit per row): only EoT is removed, EOS keeps its probability."""
    from dare.rollout.core import predict

    logits = torch.tensor([[[9.0, 1.0, 3.0, 1.0], [1.0, 9.0, 3.0, 1.0], [1.0, 1.0, 3.0, 1.0]]], dtype=torch.float64)
    masked = torch.ones(1, 3, dtype=torch.bool)
    cold = DecodingConfig(masked={"confidence_eos_eot_inf": True}, temperature=0.0)
    x0, conf = predict(logits, masked, cold, None, eos_id=0, eot_id=1)
    assert x0.tolist() == [[0, 1, 2]]
    assert conf[0, :2].tolist() == [0.0, 0.0]
    assert conf[0, 2].item() == pytest.approx(math.exp(3) / (math.exp(3) + math.exp(1)))  # tokens 2 and 3 remain
    warm = DecodingConfig(masked={"confidence_eos_eot_inf": True}, temperature=1e-6)
    x0, conf = predict(logits, masked, warm, torch.Generator().manual_seed(0), eos_id=0, eot_id=1)
    assert x0.tolist() == [[0, 1, 2]]
    assert conf[0, 0].item() == pytest.approx(math.exp(9) / (math.exp(9) + math.exp(3) + math.exp(1)))
    assert conf[0, 1].item() == 0.0


# ------------------------------------------------------------------------------------------------
# CJ-GRPO's decoding companions: EOSER and the ascending step-size schedule (ASS)


def raise_logit(model, token: int, bias: torch.Tensor):
    """`model` with `bias` (G,) added to `token`'s logit at the last G positions of every forward (counted from the
    end of the sequence, so a left-padded batch and a prompt alone see the same), also where the forward computes
    only some positions' logits (`logits_at`, as the samplers ask for the block they decode)."""
    G = len(bias)

    def hook(module, args, kwargs, out):
        ids = kwargs["input_ids"] if kwargs.get("input_ids") is not None else args[0]
        full = torch.zeros(ids.shape[1])
        full[-G:] = bias
        at = kwargs.get("logits_at")
        out.logits[..., token] += full[at] if at is not None else full
        return out

    model.register_forward_hook(hook, with_kwargs=True)
    return model


def eos_at(seed: int, where: tuple, G: int):
    """`soft_llada(seed)` (head x 4, never MASK) whose EOS logit is raised by 2 at the response positions
    `where` (counted from the end of the sequence, so a left-padded batch and a prompt alone see the
    same): EOS is predicted there with a confidence EOSER's damping reorders."""
    model = soft_llada(seed)
    bias = torch.zeros(G)
    bias[list(where)] = 2.0
    return raise_logit(model, facts(model).eos_token_id, bias)


CJ_MODELS = {"even": ((3, 6, 10, 12, 15), dict(gen_length=16, block_length=8, steps=8)),
             "ass1": ((1, 4, 6, 10, 12, 15), dict(gen_length=16, steps=4, masked=dict(schedule="ass", ass_blocks=1))),
             "ass3": ((1, 4, 6, 10, 12, 18), dict(gen_length=19, steps=4, masked=dict(schedule="ass", ass_blocks=3)))}


def _eoser(settings: dict, gamma: float = 1.0) -> DecodingConfig:
    """A CJ_MODELS layout with EOSER from `gamma` (1: off)."""
    return DecodingConfig(**{**settings, "masked": {**settings.get("masked", {}), "eos_gamma_min": gamma}})
# (seed, layout, eos_gamma_min) -> (tokens, step maps) of the ORIGINAL, yjyddq/EOSER-ASS-RL@5affb4e
# `eval/generate.py`: `eoser_generate` (even, gamma_min 0.2), `generate` (even, 1.0), `eoser_ass_generate`
# (gamma_min 0.01) and `ass_generate` (1.0) with `block_num` 1 or 3, T = 0, one prompt at a time (batch
# 1, no padding), run in a scratch folder on `eos_at`'s weights; the step maps were read from the
# states the original passed to the model (the step after which each position is no longer masked).
CJ_CASES = {
    (0, 'even', 0.2): (
        [[18, 18, 18, 1, 18, 18, 1, 18, 4, 4, 1, 4, 1, 4, 9, 1], [18, 18, 18, 1, 18, 18, 1, 18, 4, 4, 1, 9, 1, 9, 9, 1], [18, 18, 18, 1, 18, 18, 1, 18, 4, 4, 1, 4, 1, 9, 4, 1], [18, 18, 18, 1, 18, 18, 1, 18, 4, 4, 1, 4, 1, 9, 4, 1]],
        [[2, 2, 0, 3, 1, 1, 3, 0, 4, 4, 7, 5, 7, 5, 6, 6], [2, 2, 1, 3, 0, 0, 3, 1, 4, 4, 7, 5, 7, 5, 6, 6], [2, 2, 1, 3, 0, 0, 3, 1, 4, 4, 7, 5, 7, 6, 5, 6], [2, 2, 1, 3, 1, 0, 3, 0, 4, 4, 7, 5, 7, 6, 5, 6]]),
    (0, 'even', 1.0): (
        [[18, 18, 18, 1, 18, 18, 1, 18, 4, 4, 1, 4, 1, 9, 9, 1], [4, 4, 18, 1, 18, 18, 1, 18, 9, 9, 1, 9, 1, 9, 9, 1], [18, 18, 18, 1, 18, 18, 1, 18, 9, 4, 1, 9, 1, 9, 9, 1], [18, 18, 18, 1, 18, 18, 1, 18, 9, 4, 1, 9, 1, 9, 9, 1]],
        [[3, 3, 2, 0, 2, 1, 0, 1, 6, 5, 5, 6, 4, 7, 7, 4], [3, 3, 2, 0, 1, 1, 0, 2, 7, 7, 5, 5, 4, 6, 6, 4], [3, 3, 2, 0, 1, 1, 0, 2, 7, 5, 4, 7, 5, 6, 6, 4], [3, 3, 2, 0, 2, 1, 0, 1, 7, 5, 5, 7, 4, 6, 6, 4]]),
    (0, 'ass1', 0.01): (
        [[4, 1, 4, 4, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 1], [4, 1, 4, 4, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 1], [4, 1, 4, 4, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 1], [4, 1, 4, 4, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 1]],
        [[3, 3, 3, 3, 3, 2, 3, 2, 2, 2, 3, 1, 3, 1, 0, 3], [3, 3, 3, 3, 3, 2, 3, 2, 2, 0, 3, 1, 3, 2, 1, 3], [3, 3, 3, 3, 3, 2, 3, 2, 2, 1, 3, 0, 3, 2, 1, 3], [3, 3, 3, 3, 3, 2, 3, 2, 2, 2, 3, 1, 3, 0, 1, 3]]),
    (0, 'ass1', 1.0): (
        [[4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 18, 1, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 18, 4, 1], [18, 1, 18, 18, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 1], [18, 1, 18, 18, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 1]],
        [[3, 1, 3, 3, 2, 3, 0, 3, 3, 3, 2, 2, 1, 3, 3, 2], [3, 1, 3, 3, 2, 3, 2, 3, 3, 3, 1, 3, 2, 2, 3, 0], [3, 2, 3, 3, 0, 3, 2, 3, 3, 3, 1, 3, 2, 3, 2, 1], [3, 2, 3, 3, 1, 3, 0, 3, 3, 2, 2, 3, 1, 3, 3, 2]]),
    (0, 'ass3', 0.01): (
        [[18, 1, 18, 18, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 18, 18, 18, 1], [18, 1, 18, 18, 1, 18, 1, 4, 4, 4, 1, 4, 1, 4, 4, 4, 4, 4, 1], [18, 1, 18, 18, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 18, 18, 18, 1], [18, 1, 18, 18, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 18, 18, 18, 1]],
        [[1, 1, 0, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 1, 0, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 1, 0, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]),
    (0, 'ass3', 1.0): (
        [[18, 1, 18, 18, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 18, 18, 18, 1], [18, 1, 18, 18, 1, 18, 1, 4, 4, 4, 1, 4, 1, 4, 4, 4, 4, 4, 1], [18, 1, 18, 18, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 18, 18, 18, 1], [18, 1, 18, 18, 1, 18, 1, 18, 18, 18, 1, 18, 1, 18, 18, 18, 18, 18, 1]],
        [[1, 0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]),
    (1, 'even', 0.2): (
        [[4, 4, 4, 1, 4, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1], [4, 4, 4, 1, 4, 4, 1, 4, 0, 0, 1, 4, 1, 0, 4, 1], [4, 4, 4, 1, 4, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1], [4, 4, 4, 1, 4, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1]],
        [[3, 1, 1, 2, 3, 0, 2, 0, 7, 5, 6, 5, 7, 4, 4, 6], [3, 3, 1, 2, 0, 0, 2, 1, 5, 5, 6, 4, 7, 7, 4, 6], [3, 0, 0, 2, 1, 1, 2, 3, 5, 4, 7, 7, 6, 5, 4, 6], [3, 3, 1, 2, 0, 0, 2, 1, 7, 4, 6, 5, 7, 5, 4, 6]]),
    (1, 'even', 1.0): (
        [[4, 4, 4, 1, 4, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1], [4, 4, 4, 1, 4, 4, 1, 4, 0, 0, 1, 0, 1, 0, 0, 1], [4, 4, 4, 1, 4, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1], [4, 4, 4, 1, 4, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1]],
        [[3, 2, 2, 0, 3, 1, 0, 1, 7, 6, 4, 6, 5, 7, 5, 4], [3, 3, 2, 0, 1, 1, 0, 2, 5, 6, 4, 6, 5, 7, 7, 4], [3, 3, 1, 0, 2, 2, 0, 1, 7, 6, 5, 6, 4, 7, 5, 4], [3, 3, 2, 0, 1, 1, 0, 2, 7, 5, 4, 6, 5, 7, 6, 4]]),
    (1, 'ass1', 0.01): (
        [[4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1]],
        [[3, 3, 3, 3, 2, 3, 3, 3, 3, 1, 2, 3, 2, 1, 0, 2], [3, 2, 3, 3, 2, 3, 3, 3, 3, 3, 2, 0, 3, 1, 1, 2], [3, 3, 3, 1, 2, 3, 2, 3, 3, 1, 2, 3, 2, 3, 0, 3], [3, 3, 3, 3, 2, 3, 3, 3, 3, 1, 2, 1, 2, 3, 0, 2]]),
    (1, 'ass1', 1.0): (
        [[4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 1]],
        [[3, 2, 3, 3, 0, 3, 2, 3, 3, 3, 1, 3, 1, 3, 2, 2], [3, 2, 3, 3, 0, 3, 1, 3, 3, 3, 1, 3, 2, 3, 2, 2], [3, 1, 3, 3, 2, 3, 0, 3, 3, 2, 2, 3, 1, 3, 3, 2], [3, 2, 3, 3, 2, 3, 2, 3, 3, 3, 0, 3, 1, 3, 2, 1]]),
    (1, 'ass3', 0.01): (
        [[4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 4, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 4, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 4, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 4, 4, 4, 1]],
        [[0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 1, 0, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 1, 0, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 1, 0, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]),
    (1, 'ass3', 1.0): (
        [[4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 4, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 4, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 4, 4, 4, 1], [4, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 4, 1, 4, 4, 4, 4, 4, 1]],
        [[1, 0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [1, 0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]),
}


@pytest.mark.parametrize("case", list(CJ_CASES), ids=[str(c) for c in CJ_CASES])
def test_eoser_and_ass_match_the_original_token_for_token(case):
    seed, layout, gamma = case
    where, settings = CJ_MODELS[layout]
    model = eos_at(seed, where, settings["gen_length"])
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    out = generate(model, ids, mask, _eoser(settings, gamma))
    tokens, step_maps = CJ_CASES[case]
    assert out.responses.tolist() == tokens
    assert out.step_map.tolist() == step_maps


def test_eoser_changes_what_the_sampler_decodes():
    """EOSER is not a no-op: on every pinned layout, damping EOS changes the order our sampler commits
    in (as it does the original's)."""
    for seed in (0, 1):
        for layout, gamma in (("even", 0.2), ("ass1", 0.01), ("ass3", 0.01)):
            where, settings = CJ_MODELS[layout]
            model = eos_at(seed, where, settings["gen_length"])
            ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
            damped = generate(model, ids, mask, _eoser(settings, gamma)).step_map
            plain = generate(model, ids, mask, _eoser(settings)).step_map
            assert not torch.equal(damped, plain), (seed, layout)
            assert CJ_CASES[(seed, layout, gamma)][1] != CJ_CASES[(seed, layout, 1.0)][1], (seed, layout)


def test_ass_plan_and_eos_gamma_by_hand():
    from dare.rollout.llada import ass_plan, eos_gamma

    assert ass_plan(256, 8, 1) == [(256, list(range(8)), [1, 2, 4, 8, 16, 32, 64, 129])]  # the last step: the rest
    assert ass_plan(256, 8, 4) == [(31, [0, 1, 2, 3, 4], [1, 2, 4, 8, 16]), (32, [5], [32]), (64, [6], [64]),
                                   (129, [7], [129])]
    assert ass_plan(19, 4, 3) == [(3, [0, 1], [1, 2]), (4, [2], [4]), (12, [3], [12])]
    even = DecodingConfig(gen_length=16, block_length=8, steps=8, masked={"eos_gamma_min": 0.2})
    # the index inside the block over the TOTAL steps: block 2's steps restart at 0.2 and stop at 0.2 + 0.8 * 3/7
    assert [eos_gamma(even, i, 4 + i) for i in range(4)] == pytest.approx([0.2 + 0.8 * i / 7 for i in range(4)])
    ass = DecodingConfig(gen_length=16, steps=4, masked={"schedule": "ass", "eos_gamma_min": 0.01})
    assert [eos_gamma(ass, 0, s) for s in range(4)] == pytest.approx([0.01 + 0.99 * (2 ** (s + 1) - 1) / 16
                                                                       for s in range(4)])
    assert eos_gamma(DecodingConfig(), 0, 0) == 1.0  # off


def test_ass_and_eoser_settings_are_checked_before_decoding():
    from dare.config import ConfigError, Invalid, ModelConfig, RLConfig, load

    with pytest.raises(Invalid, match=r"steps must be floor\(log2 gen_length\) = 4 for gen_length 16, got 5"):
        DecodingConfig(gen_length=16, steps=5, masked={"schedule": "ass"}).validate()
    with pytest.raises(Invalid, match=r"must be in \[1, steps = 4\]"):
        DecodingConfig(gen_length=16, steps=4, masked={"schedule": "ass", "ass_blocks": 5}).validate()
    with pytest.raises(Invalid, match="no parallel rule"):
        DecodingConfig(gen_length=16, steps=4, masked={"schedule": "ass", "threshold": 0.9}).validate()
    with pytest.raises(Invalid, match="eos_gamma_min <= eos_gamma_max"):
        DecodingConfig(masked={"eos_gamma_min": 0.5, "eos_gamma_max": 0.4}).validate()
    DecodingConfig(gen_length=19, block_length=32, steps=4, masked={"schedule": "ass"}).validate()  # block_length unused

    @dataclass
    class Run:
        model: ModelConfig = field(default_factory=ModelConfig)
        rl: RLConfig = field(default_factory=RLConfig)

    with pytest.raises(ConfigError, match="option of the masked sampler.*decodes with the block sampler"):
        load(Run, overrides=["model.family=sdar", "rl.decoding.masked.eos_gamma_min=0.01"])


# ------------------------------------------------------------------------------------------------
# MDPO's sampler: MaskGIT schedule, top-p confidences, running-confidence remasking (RCR)


def soft_llada(seed: int):
    """A tiny LLaDA whose head is scaled by 4 (not 40): confidences stay below 1, so RCR's ranking of
    stored confidences has no ties with the positions it counts as 1.0. Its MASK row is zero."""
    tok = char_tokenizer("0123456789+=", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64),
                      seed=seed).eval()
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.mul_(4)
        head[facts(model).mask_token_id] = 0
    return model


# (seed, gen, block, steps, top_p, rcr) -> (tokens, step maps) of the ORIGINAL, autonomousvision/mdpo@e6ae439
# `src/mdlm_generation_utils.py::diffusion_generate` (conf_alg "llada", mode "linear", T = 0), one prompt at
# a time, run in a scratch folder on `soft_llada`'s weights; a position's step is the LAST step after which
# it went from masked to committed, read from the states the original passed to the model.
MDPO_CASES = {
    (0, 16, 8, 8, None, False): (
        [[4, 4, 18, 18, 18, 18, 18, 18, 4, 4, 9, 9, 9, 9, 9, 9], [4, 4, 18, 18, 18, 18, 18, 18, 4, 4, 9, 9, 9, 9, 9, 9], [18, 18, 18, 18, 18, 18, 18, 18, 4, 4, 4, 4, 9, 9, 9, 9], [18, 18, 18, 18, 18, 18, 18, 18, 4, 4, 4, 4, 9, 9, 9, 9]],
        [[3, 3, 2, 2, 1, 1, 0, 0, 4, 4, 6, 6, 7, 7, 5, 5], [3, 3, 2, 0, 0, 2, 1, 1, 4, 4, 6, 5, 5, 6, 7, 7], [3, 3, 2, 1, 0, 0, 2, 1, 4, 4, 5, 5, 6, 6, 7, 7], [3, 3, 2, 2, 1, 1, 0, 0, 5, 4, 4, 5, 6, 6, 7, 7]]),
    (0, 16, 8, 8, None, True): (
        [[4, 4, 18, 18, 18, 18, 18, 18, 4, 4, 9, 9, 9, 9, 9, 9], [9, 9, 9, 18, 18, 9, 18, 18, 9, 9, 9, 9, 9, 9, 9, 9], [9, 9, 18, 18, 18, 18, 18, 18, 4, 4, 4, 4, 9, 9, 9, 9], [9, 9, 18, 18, 18, 18, 18, 18, 4, 4, 4, 4, 9, 9, 9, 9]],
        [[3, 3, 2, 2, 1, 1, 0, 0, 4, 4, 6, 6, 6, 6, 7, 7], [6, 6, 7, 0, 0, 7, 1, 1, 6, 6, 5, 5, 5, 5, 5, 5], [6, 6, 2, 1, 0, 0, 2, 1, 4, 4, 4, 4, 7, 7, 6, 6], [6, 6, 2, 2, 1, 1, 0, 0, 4, 4, 4, 4, 7, 7, 6, 6]]),
    (0, 10, 10, 4, 0.95, False): (
        [[9, 9, 4, 4, 4, 18, 18, 18, 18, 18], [4, 4, 9, 9, 18, 9, 9, 9, 18, 18], [9, 4, 4, 4, 18, 18, 18, 9, 18, 18], [9, 9, 4, 4, 4, 18, 18, 18, 18, 18]],
        [[3, 3, 2, 2, 2, 1, 1, 0, 0, 0], [1, 1, 3, 2, 0, 2, 2, 3, 0, 0], [3, 2, 2, 2, 0, 0, 0, 3, 1, 1], [3, 3, 2, 2, 2, 1, 1, 0, 0, 0]]),
    (0, 10, 10, 4, 0.95, True): (
        [[9, 9, 4, 4, 4, 18, 18, 18, 18, 18], [9, 9, 9, 9, 18, 9, 9, 9, 18, 18], [9, 4, 4, 4, 18, 18, 18, 9, 18, 18], [9, 9, 4, 4, 4, 18, 18, 18, 18, 18]],
        [[3, 3, 2, 2, 2, 1, 1, 0, 0, 0], [3, 3, 2, 2, 0, 2, 2, 2, 0, 0], [3, 2, 2, 2, 0, 0, 0, 3, 1, 1], [3, 3, 2, 2, 2, 1, 1, 0, 0, 0]]),
    (1, 16, 8, 8, None, False): (
        [[4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 4, 0, 0, 0, 0, 4], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]],
        [[3, 1, 1, 2, 2, 3, 0, 0, 7, 7, 6, 6, 5, 5, 4, 4], [3, 3, 2, 2, 0, 0, 1, 1, 5, 5, 4, 6, 6, 7, 7, 4], [3, 0, 0, 1, 1, 2, 2, 3, 6, 5, 5, 7, 7, 6, 4, 4], [3, 3, 2, 0, 0, 1, 1, 2, 6, 5, 5, 7, 7, 6, 4, 4]]),
    (1, 16, 8, 8, None, True): (
        [[4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 0, 0, 4, 4], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]],
        [[5, 5, 5, 6, 6, 5, 5, 5, 6, 6, 7, 7, 4, 4, 4, 4], [5, 5, 6, 6, 5, 5, 5, 5, 6, 7, 4, 4, 7, 6, 4, 4], [5, 5, 5, 5, 5, 6, 5, 6, 7, 4, 7, 6, 6, 4, 4, 4], [5, 5, 6, 5, 5, 5, 5, 6, 6, 4, 4, 7, 6, 7, 4, 4]]),
    (1, 10, 10, 4, 0.95, False): (
        [[4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4]],
        [[3, 3, 2, 1, 1, 2, 2, 0, 0, 0], [0, 2, 1, 0, 0, 1, 2, 3, 3, 2], [3, 0, 0, 1, 2, 2, 3, 2, 0, 1], [3, 3, 2, 0, 0, 1, 2, 2, 1, 0]]),
    (1, 10, 10, 4, 0.95, True): (
        [[4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4]],
        [[2, 2, 3, 1, 1, 1, 3, 2, 2, 2], [2, 1, 1, 2, 2, 1, 3, 2, 2, 3], [2, 2, 2, 1, 1, 3, 2, 3, 2, 1], [2, 2, 1, 2, 2, 1, 3, 3, 1, 2]]),
}


@pytest.mark.parametrize("case", list(MDPO_CASES), ids=[str(c) for c in MDPO_CASES])
def test_mdpo_sampler_and_rcr_match_the_original_token_for_token(case):
    seed, G, BL, steps, top_p, rcr = case
    model = soft_llada(seed)
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    out = generate(model, ids, mask, DecodingConfig(sampler="maskgit", gen_length=G, block_length=BL, steps=steps,
                                                    maskgit={"top_p": top_p or 1.0, "rcr": rcr}))
    tokens, step_maps = MDPO_CASES[case]
    assert out.responses.tolist() == tokens
    assert out.step_map.tolist() == step_maps


def test_rcr_changes_what_the_sampler_decodes():
    """RCR is not a no-op: in every pinned layout our sampler decodes differently with it (as the original)."""
    for seed in (0, 1):
        model = soft_llada(seed)
        ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
        for G, BL, steps, top_p in ((16, 8, 8, None), (10, 10, 4, 0.95)):
            runs = [generate(model, ids, mask, DecodingConfig(sampler="maskgit", gen_length=G, block_length=BL,
                                                              steps=steps, maskgit={"top_p": top_p or 1.0, "rcr": rcr}))
                    for rcr in (False, True)]
            assert not (torch.equal(runs[0].responses, runs[1].responses)
                        and torch.equal(runs[0].step_map, runs[1].step_map)), (seed, G)
            assert MDPO_CASES[(seed, G, BL, steps, top_p, True)] != MDPO_CASES[(seed, G, BL, steps, top_p, False)]


def test_maskgit_quota_is_the_floor_rule():
    from dare.rollout.maskgit import maskgit_quota

    assert maskgit_quota(10, 4) == [3, 2, 3, 2]  # 10 - floor(10 * (1 - t/4)): 3, 5, 8, 10 committed
    assert maskgit_quota(8, 4) == [2, 2, 2, 2] and sum(maskgit_quota(7, 3)) == 7


def test_rcr_is_an_option_of_the_mdpo_sampler_for_bidirectional_models():
    from dare.config import ConfigError, load

    with pytest.raises(ConfigError, match="maskgit.rcr=True .* option of the maskgit sampler"):
        load(DecodingConfig, overrides=["sampler=masked", "maskgit.rcr=true"])
    sdar = sharp("sdar", 0)
    ids, mask = left_pad(PROMPTS, facts(sdar).pad_token_id)
    with pytest.raises(UserError, match="sampler=maskgit: this sampler decodes bidirectional"):
        generate(sdar, ids, mask, DecodingConfig(sampler="maskgit", gen_length=8, block_length=8, steps=4))


# rcr -> (intermediate_results, intermediate_confidence) of the same original (`soft_llada(0)`, gen 8, block 4,
# 4 steps, T = 0), per prompt and step, confidences rounded to 6 decimals: MDPO's training data
MDPO_STEPS = {
    False: ([[[18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 4, 4, 4, 4], [18, 18, 18, 18, 4, 4, 9, 9]], [[18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 9, 9, 9, 9], [18, 18, 18, 18, 9, 9, 9, 9]], [[18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 4, 4, 4, 4], [18, 18, 18, 18, 4, 9, 9, 4]], [[18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 4, 4, 4, 4], [18, 18, 18, 18, 4, 4, 9, 9]]],
            [[[0.102, 0.10201, 0.102011, 0.102012, 0.10202, 0.102037, 0.102056, 0.102067], [0.094489, 0.094446, 0.12872, 0.128729, 0.09446, 0.094548, 0.094591, 0.094563], [0.132667, 0.132616, 0.132619, 0.132698, 0.094423, 0.09442, 0.094419, 0.094415], [0.127283, 0.127185, 0.127175, 0.127269, 0.109739, 0.109736, 0.096245, 0.096257]], [[0.099307, 0.099313, 0.099344, 0.099377, 0.099387, 0.099371, 0.099348, 0.099344], [0.091531, 0.091507, 0.123923, 0.123857, 0.091578, 0.091599, 0.091587, 0.091561], [0.124748, 0.124826, 0.124842, 0.124795, 0.097475, 0.097472, 0.097438, 0.097408], [0.106271, 0.106373, 0.106467, 0.106476, 0.11106, 0.111175, 0.11198, 0.111918]], [[0.105341, 0.105318, 0.105326, 0.105359, 0.105388, 0.105389, 0.105361, 0.105331], [0.12406, 0.100184, 0.100199, 0.123894, 0.100294, 0.100309, 0.100287, 0.100258], [0.116661, 0.116758, 0.11684, 0.116856, 0.0985, 0.098482, 0.098482, 0.098493], [0.110488, 0.110556, 0.110612, 0.110614, 0.103029, 0.104779, 0.104798, 0.102883]], [[0.103353, 0.103353, 0.103352, 0.103359, 0.103374, 0.10339, 0.103399, 0.103398], [0.124719, 0.096652, 0.096659, 0.124809, 0.096723, 0.096744, 0.096741, 0.096727], [0.129151, 0.129171, 0.129206, 0.129238, 0.093177, 0.093158, 0.093145, 0.093147], [0.123819, 0.123785, 0.123804, 0.12386, 0.106114, 0.106077, 0.099337, 0.099353]]]),
    True: ([[[18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 4, 4, 4, 4], [18, 18, 18, 18, 4, 4, 9, 9]], [[18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 9, 9, 9, 9], [9, 9, 18, 18, 9, 9, 9, 9]], [[18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 4, 4, 4, 4], [18, 18, 18, 18, 4, 9, 9, 4]], [[18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 18, 18, 18, 18], [18, 18, 18, 18, 4, 4, 4, 4], [18, 18, 18, 18, 4, 4, 9, 9]]],
            [[[0.102, 0.10201, 0.102011, 0.102012, 0.0, 0.0, 0.0, 0.0], [0.094489, 0.094446, 0.102011, 0.102012, 0.0, 0.0, 0.0, 0.0], [0.094489, 0.094446, 0.102011, 0.102012, 0.094423, 0.09442, 0.094419, 0.094415], [0.094489, 0.094446, 0.102011, 0.102012, 0.094423, 0.09442, 0.096245, 0.096257]], [[0.099307, 0.099313, 0.099344, 0.099377, 0.0, 0.0, 0.0, 0.0], [0.091531, 0.091507, 0.099344, 0.099377, 0.0, 0.0, 0.0, 0.0], [0.091531, 0.091507, 0.099344, 0.099377, 0.097475, 0.097472, 0.097438, 0.097408], [0.117085, 0.117044, 0.099344, 0.099377, 0.097475, 0.097472, 0.097438, 0.097408]], [[0.105341, 0.105318, 0.105326, 0.105359, 0.0, 0.0, 0.0, 0.0], [0.105341, 0.100184, 0.100199, 0.105359, 0.0, 0.0, 0.0, 0.0], [0.105341, 0.100184, 0.100199, 0.105359, 0.0985, 0.098482, 0.098482, 0.098493], [0.105341, 0.100184, 0.100199, 0.105359, 0.0985, 0.104779, 0.104798, 0.098493]], [[0.103353, 0.103353, 0.103352, 0.103359, 0.0, 0.0, 0.0, 0.0], [0.103353, 0.096652, 0.096659, 0.103359, 0.0, 0.0, 0.0, 0.0], [0.103353, 0.096652, 0.096659, 0.103359, 0.093177, 0.093158, 0.093145, 0.093147], [0.103353, 0.096652, 0.096659, 0.103359, 0.093177, 0.093158, 0.099337, 0.099353]]]),
}


@pytest.mark.parametrize("rcr", [False, True])
def test_mdpo_sampler_records_the_original_predictions_and_confidences(rcr):
    model = soft_llada(0)
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    out = generate(model, ids, mask, DecodingConfig(sampler="maskgit", gen_length=8, block_length=4, steps=4,
                                                    maskgit={"rcr": rcr}, record=("states", "predictions")))
    predictions, confidences = MDPO_STEPS[rcr]
    assert out.predictions.tolist() == predictions
    assert torch.allclose(out.confidences, torch.tensor(confidences), atol=2e-6)


# ------------------------------------------------------------------------------------------------
# AGRPO's sampler: a fixed count per step, the drawn log-probs and entropies, rows that end on an all-EOS block

AGRPO_PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 5, 6], [9, 8, 7, 6, 5, 4, 13, 12, 5, 6, 7], [4, 5, 6, 7, 8, 9, 10, 11]]


def eos_first_block(G: int):
    """`soft_llada(0)` whose first 4 answer positions predict EOS (+50 on its logit): the first block
    is all EOS, so every row stops after it."""
    model = soft_llada(0)
    bias = torch.zeros(G)
    bias[:4] = 50.0
    return raise_logit(model, facts(model).eos_token_id, bias)


# (model, gen, block, steps, remasking) -> (tokens, step maps, drawn log-probs, entropies) of the ORIGINAL,
# probablyabot/agrpo@98f1182 `generate.py::generate` (T = 0, top_k 0, top_p 1; TRL's selective_log_softmax is
# log_softmax + gather), one prompt at a time, run in a scratch folder; prompts no shorter than the block (the
# original's all-EOS check before the first block reads the prompt's last block_length tokens).
AGRPO_CASES = {
    (0, 16, 8, 8, 'low_confidence'): ([[4, 4, 18, 18, 18, 18, 18, 18, 9, 4, 4, 9, 9, 9, 9, 9], [4, 18, 18, 4, 18, 18, 18, 18, 9, 9, 9, 9, 9, 9, 9, 9], [4, 4, 18, 18, 18, 18, 18, 18, 9, 9, 9, 9, 9, 9, 9, 9]],
        [[3, 3, 0, 2, 2, 1, 1, 0, 6, 4, 4, 6, 7, 7, 5, 5], [3, 0, 1, 3, 2, 2, 1, 0, 6, 7, 7, 5, 4, 4, 5, 6], [3, 3, 2, 0, 0, 2, 1, 1, 7, 7, 6, 4, 4, 5, 5, 6]],
        [[-2.37944, -2.37955, -2.28317, -2.36126, -2.36135, -2.31554, -2.3153, -2.28295, -2.26278, -2.39448, -2.39443, -2.26258, -2.1813, -2.18143, -2.35484, -2.35462], [-2.41033, -2.29572, -2.3287, -2.41034, -2.37294, -2.37285, -2.3286, -2.29561, -2.22267, -2.15294, -2.15288, -2.30201, -2.38867, -2.38871, -2.30182, -2.22284], [-2.3782, -2.37825, -2.36042, -2.28802, -2.28799, -2.36027, -2.31733, -2.31716, -2.12522, -2.12518, -2.20212, -2.38982, -2.38979, -2.29105, -2.29138, -2.20216]],
        [[2.86858, 2.86856, 2.86382, 2.86688, 2.8669, 2.86527, 2.86527, 2.86384, 2.86064, 2.86781, 2.86784, 2.86067, 2.854, 2.85401, 2.86689, 2.86687], [2.86785, 2.86342, 2.86481, 2.86791, 2.86636, 2.86635, 2.86479, 2.86342, 2.85525, 2.84895, 2.84895, 2.8614, 2.86695, 2.86697, 2.86142, 2.85532], [2.86549, 2.86553, 2.86412, 2.86173, 2.8617, 2.86406, 2.86276, 2.86278, 2.84393, 2.84391, 2.85093, 2.86434, 2.86436, 2.85798, 2.85802, 2.85101]]),
    (0, 12, 6, 4, 'entropy'): ([[18, 18, 18, 18, 18, 18, 9, 9, 4, 4, 4, 9], [18, 18, 18, 18, 18, 18, 9, 9, 9, 9, 9, 9], [18, 18, 18, 18, 18, 18, 4, 9, 9, 9, 4, 4]],
        [[1, 0, 0, 0, 1, 1, 3, 3, 2, 2, 2, 3], [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3], [1, 1, 1, 0, 0, 0, 2, 3, 3, 3, 2, 2]],
        [[-2.37412, -2.29283, -2.29279, -2.29304, -2.37425, -2.37391, -2.28959, -2.28946, -2.35899, -2.35898, -2.35894, -2.28889], [-2.30925, -2.30888, -2.30892, -2.38736, -2.38738, -2.3873, -2.36075, -2.36083, -2.36088, -2.22093, -2.22103, -2.22118], [-2.37213, -2.37179, -2.37157, -2.29645, -2.29646, -2.2967, -2.35153, -2.25761, -2.25776, -2.25766, -2.35216, -2.35205]],
        [[2.86687, 2.86385, 2.86382, 2.86383, 2.86683, 2.86687, 2.86821, 2.86821, 2.86976, 2.86975, 2.86979, 2.8682], [2.86336, 2.86336, 2.86338, 2.86614, 2.86614, 2.86613, 2.86873, 2.86874, 2.86876, 2.85868, 2.8587, 2.85871], [2.8632, 2.86323, 2.86323, 2.86099, 2.86097, 2.86097, 2.86568, 2.86328, 2.86331, 2.8633, 2.8657, 2.86569]]),
    (0, 12, 4, 12, 'low_confidence'): ([[18, 18, 18, 18, 4, 4, 9, 9, 9, 9, 9, 9], [18, 18, 18, 18, 9, 9, 9, 18, 9, 9, 9, 9], [18, 18, 18, 18, 9, 9, 4, 4, 9, 9, 9, 9]],
        [[2, 1, 0, 3, 5, 4, 7, 6, 8, 9, 10, 11], [2, 0, 1, 3, 7, 6, 5, 4, 8, 9, 10, 11], [2, 3, 1, 0, 7, 6, 4, 5, 9, 11, 10, 8]],
        [[-2.34224, -2.31496, -2.29279, -2.37414, -2.40128, -2.3926, -2.33581, -2.39261, -2.28015, -2.22929, -2.18297, -2.1411], [-2.35719, -2.30888, -2.33101, -2.38736, -2.29432, -2.34317, -2.3942, -2.4208, -2.24756, -2.20488, -2.16551, -2.12948], [-2.34183, -2.37224, -2.31664, -2.29645, -2.30943, -2.36959, -2.39215, -2.40224, -2.19891, -2.10674, -2.15039, -2.25189]],
        [[2.86582, 2.86477, 2.86382, 2.8668, 2.86744, 2.86792, 2.86358, 2.86696, 2.85977, 2.85585, 2.85191, 2.848], [2.86515, 2.86336, 2.86424, 2.86614, 2.86154, 2.86488, 2.86794, 2.86707, 2.858, 2.85439, 2.85074, 2.84713], [2.86238, 2.86323, 2.86166, 2.86099, 2.85857, 2.86246, 2.86405, 2.86335, 2.85019, 2.84165, 2.84585, 2.85445]]),
    (1, 16, 8, 8, 'low_confidence'): ([[0, 0, 0, 0, 4, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4]],
        [[2, 1, 1, 2, 0, 3, 3, 0, 4, 4, 5, 6, 7, 7, 6, 5], [2, 3, 2, 1, 1, 0, 0, 3, 5, 4, 4, 5, 6, 7, 7, 6], [3, 3, 2, 2, 1, 0, 0, 1, 6, 6, 5, 5, 7, 7, 4, 4]],
        [[-2.264, -2.33615, -2.33615, -2.26397, -2.36692, -2.19673, -2.19687, -2.36692, -2.13759, -2.13776, -2.09267, -2.06398, -2.05128, -2.05112, -2.06376, -2.09292], [-2.23833, -2.17443, -2.23861, -2.30703, -2.30683, -2.33414, -2.33403, -2.17551, -2.07758, -2.11995, -2.11973, -2.07733, -2.05029, -2.0379, -2.03791, -2.05047], [-2.23969, -2.2397, -2.26314, -2.26305, -2.29075, -2.32111, -2.32111, -2.29046, -2.19853, -2.1986, -2.20741, -2.20742, -2.14647, -2.14678, -2.21999, -2.2197]],
        [[2.86976, 2.8719, 2.87189, 2.86976, 2.87505, 2.86726, 2.86726, 2.87507, 2.8644, 2.8644, 2.86169, 2.85947, 2.85779, 2.85771, 2.85932, 2.86168], [2.86114, 2.85797, 2.8612, 2.86411, 2.86406, 2.86761, 2.86761, 2.85807, 2.85204, 2.85491, 2.85488, 2.85207, 2.85003, 2.84874, 2.84871, 2.85], [2.85837, 2.85839, 2.86274, 2.8627, 2.8668, 2.87049, 2.87053, 2.86687, 2.84638, 2.84632, 2.84984, 2.84985, 2.84545, 2.84548, 2.85396, 2.8539]]),
    (1, 12, 6, 4, 'entropy'): ([[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 4, 4, 4, 0, 0, 0, 0, 0, 0]],
        [[0, 0, 0, 1, 1, 1, 3, 2, 2, 2, 3, 3], [0, 1, 1, 1, 0, 0, 2, 2, 3, 3, 3, 2], [1, 1, 1, 0, 0, 0, 3, 3, 3, 2, 2, 2]],
        [[-2.35607, -2.35594, -2.3559, -2.23123, -2.23183, -2.23227, -2.0763, -2.13096, -2.13088, -2.13091, -2.07664, -2.07688], [-2.31891, -2.20109, -2.20113, -2.20082, -2.31874, -2.31892, -2.10718, -2.10775, -2.05669, -2.05634, -2.05582, -2.10752], [-2.28493, -2.28513, -2.28487, -2.34823, -2.34799, -2.34776, -2.07105, -2.0711, -2.07081, -2.15725, -2.15746, -2.15802]],
        [[2.87819, 2.87819, 2.87819, 2.87435, 2.87438, 2.87439, 2.86362, 2.86895, 2.86893, 2.86893, 2.86368, 2.86375], [2.86881, 2.8634, 2.86344, 2.86339, 2.86887, 2.86882, 2.8572, 2.85728, 2.85247, 2.85244, 2.85235, 2.8573], [2.866, 2.86604, 2.866, 2.87284, 2.87281, 2.87282, 2.85721, 2.85723, 2.85717, 2.86141, 2.86137, 2.86138]]),
    (1, 12, 4, 12, 'low_confidence'): ([[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]],
        [[3, 1, 0, 2, 4, 5, 6, 7, 8, 9, 10, 11], [0, 3, 2, 1, 4, 5, 6, 7, 11, 10, 9, 8], [0, 3, 2, 1, 4, 5, 6, 7, 11, 10, 8, 9]],
        [[-2.23119, -2.31348, -2.3559, -2.27154, -2.19392, -2.16021, -2.13095, -2.10695, -2.08879, -2.07654, -2.06988, -2.06819], [-2.31891, -2.2011, -2.23911, -2.27858, -2.16558, -2.13404, -2.10718, -2.08533, -2.04762, -2.04947, -2.05582, -2.0677], [-2.34815, -2.23712, -2.28189, -2.32736, -2.19375, -2.15494, -2.12101, -2.09251, -2.04056, -2.04399, -2.06946, -2.05349]],
        [[2.87429, 2.87712, 2.87819, 2.87584, 2.87267, 2.87084, 2.86895, 2.86707, 2.86528, 2.86365, 2.86223, 2.86102], [2.86881, 2.86334, 2.86542, 2.86729, 2.86135, 2.8592, 2.8572, 2.85542, 2.85042, 2.85127, 2.85235, 2.85373], [2.87286, 2.86787, 2.86941, 2.87071, 2.86614, 2.86436, 2.86261, 2.86095, 2.85609, 2.85683, 2.85926, 2.85788]]),
    ('first_block_eos', 12, 4, 12, 'low_confidence'): ([[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]],
        [[3, 1, 0, 2, 4, 4, 4, 4, 4, 4, 4, 4], [3, 1, 0, 2, 4, 4, 4, 4, 4, 4, 4, 4], [3, 1, 0, 2, 4, 4, 4, 4, 4, 4, 4, 4]],
        [[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]],
        [[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]),
}


@pytest.mark.parametrize("case", list(AGRPO_CASES), ids=[str(c) for c in AGRPO_CASES])
def test_agrpo_sampler_matches_the_original_token_for_token(case):
    seed, G, BL, steps, remasking = case
    model = eos_first_block(G) if seed == "first_block_eos" else soft_llada(seed)
    ids, mask = left_pad(AGRPO_PROMPTS, facts(model).pad_token_id)
    out = generate(model, ids, mask, DecodingConfig(sampler="truncated", gen_length=G, block_length=BL, steps=steps,
                                                    truncated={"remasking": remasking}))
    tokens, step_maps, logps, entropies = AGRPO_CASES[case]
    assert out.responses.tolist() == tokens
    assert out.step_map.tolist() == step_maps
    assert torch.allclose(out.logps, torch.tensor(logps), atol=2e-5)
    assert torch.allclose(out.entropies, torch.tensor(entropies), atol=2e-5)


def test_agrpo_sampler_records_the_support_it_drew_from():
    """At T > 0 with top-k 3, every drawn token lies in its recorded support of 3 tokens, and its
    recorded log-prob is that of the truncated, tempered distribution."""
    model = soft_llada(1)
    ids, mask = left_pad(AGRPO_PROMPTS, facts(model).pad_token_id)
    decoding = DecodingConfig(sampler="truncated", gen_length=8, block_length=4, steps=4, temperature=0.7,
                              truncated={"top_k": 3, "remasking": "random"}, record=("states", "supports"))
    out = generate(model, ids, mask, decoding, torch.Generator().manual_seed(0))
    assert (out.supports.sum(-1) == 3).all()
    assert out.supports.gather(-1, out.responses[..., None]).all()
    assert (out.logps < 0).all() and (out.logps > math.log(1e-6)).all() and (out.step_map >= 0).all()
