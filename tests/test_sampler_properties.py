"""Every sampler finishes its completions: whatever the cache, the commit rule and the step count (below,
equal to and above the number of masked positions), no MASK token is left in a completion unless an EOS stop
allows it (the block sampler's `eos_early_stop`, the truncated sampler's all-EOS stop: then only after the
row's first EOS). Settings a sampler cannot honour are refused with one line (`UserError`), never decoded
half-way; the cases below name the ones expected to be refused.

The models are the tiny random `sharp` models of `test_reference_samplers` (a sharpened head that never
predicts MASK, as trained checkpoints), the prompts of mixed lengths, left-padded, none a block multiple.
The regression this guards: the masked sampler with a parallel rule (threshold, factor) and no cache stopped
after `decoding.steps` forwards and returned MASK tokens (the tree rollouts' step cap applied to every
rollout)."""

import itertools

import pytest
import torch

from dare.config import DecodingConfig
from dare.decoding import from_flat
from dare.models import facts
from dare.rollout import generate, left_pad
from dare.utils import UserError
from test_reference_samplers import PROMPTS, sharp

G = 8  # generated positions (masked at the start) per row

RULES = {"quota": {}, "threshold": {"threshold": 0.9}, "threshold-low": {"threshold": 0.3}, "factor": {"factor": 1.0}}


def _cases():
    """(family, settings, refused): every sampler x cache x commit rule x step count."""
    cases = []
    # masked: 2 blocks of 4; steps below (2), at (8) and above (16) the masked count, and between (4)
    for family, steps, cache, rule in itertools.product(("llada", "dream"), (2, 4, 8, 16), ("none", "prefix", "dual"),
                                                        RULES):
        cases.append((family, dict(sampler="masked", block_length=4, steps=steps, cache=cache, **RULES[rule]), False))
    for steps, remasking in itertools.product((2, 8, 16), ("random", "left_to_right")):
        cases.append(("llada", dict(sampler="masked", block_length=4, steps=steps, remasking=remasking), False))
    for cache in ("none", "prefix", "dual"):
        cases.append(("llada", dict(sampler="masked", block_length=4, steps=4, cache=cache, eos_gamma_min=0.01), False))
        cases.append(("llada", dict(sampler="masked", steps=3, schedule="ass", ass_blocks=2, cache=cache), False))
    for family, steps, horizon, remasking in itertools.product(("llada", "dream"), (2, 8, 16), (1, 4),
                                                               ("low_confidence", "margin")):
        for rule in ("quota", "threshold"):
            cases.append((family, dict(sampler="masked", block_length=4, steps=steps, cache="prefix",
                                       further_horizon=horizon, remasking=remasking, **RULES[rule]), False))
    for family, steps, rule in itertools.product(("llada", "dream"), (2, 8), ("quota", "threshold")):  # the block alone
        cases.append((family, dict(sampler="masked", block_length=4, steps=steps, cache="prefix", further_horizon=0,
                                   **RULES[rule]), False))
    cases.append(("llada", dict(sampler="masked", block_length=8, steps=8, cfg_scale=1.0), False))
    cases.append(("llada", dict(sampler="masked", block_length=8, steps=4, tree=(2, 2)), False))
    # block: the model's block of 4 (plus the prompt tail); steps per block below, at and above its 4 masks
    for family, steps, cache, rule, last in itertools.product(("sdar", "llada2"), (1, 2, 4, 8),
                                                              ("none", "prefix", "dual"), ("quota", "threshold"),
                                                              (True, False)):
        cases.append((family, dict(sampler="block", steps=steps, cache=cache, whole_last_block=last, **RULES[rule]),
                      False))
    for steps, early in itertools.product((1, 4, 8), (False, True)):
        cases.append(("llada2", dict(sampler="block", steps=steps, threshold=0.5, editing_threshold=0.6,
                                     max_post_steps=2, eos_early_stop=early), False))
    # dream's own algorithms: one block, steps below, at and above the 8 masks
    for family, steps, alg in itertools.product(("dream", "llada"), (2, 5, 8, 16),
                                                ("origin", "maskgit_plus", "topk_margin", "entropy")):
        cases.append((family, dict(sampler="dream", steps=steps, alg=alg), False))
    # MDPO's maskgit sampler, with and without running-confidence remasking
    for family, steps, rcr in itertools.product(("llada", "dream"), (2, 4, 8, 16), (False, True)):
        cases.append((family, dict(sampler="maskgit", block_length=4, steps=steps, rcr=rcr), False))
    # AGRPO's truncated sampler commits gen_length / steps tokens a step: more steps than tokens is refused
    for steps, remasking in itertools.product((2, 4, 8, 16), ("low_confidence", "random", "entropy")):
        cases.append(("llada", dict(sampler="truncated", block_length=4, steps=steps, remasking=remasking),
                      steps > G))
    return cases


CASES = _cases()
MODELS = {}


def _model(family):
    if family not in MODELS:
        MODELS[family] = sharp(family, 0)
    return MODELS[family]


def _ids(case):
    family, settings, _ = case
    return family + " " + " ".join(f"{k}={v}" for k, v in settings.items() if k != "sampler") + f" [{settings['sampler']}]"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_no_mask_is_left_in_a_completion(case, temperature):
    family, settings, refused = case
    model = _model(family)
    f = facts(model)
    ids, mask = left_pad(PROMPTS, f.pad_token_id)
    if settings.get("tree"):  # one tree per group of prod(widths) identical prompts
        ids, mask = ids[:1].repeat(4, 1), mask[:1].repeat(4, 1)
    decoding = DecodingConfig(**from_flat({"gen_length": G, "temperature": temperature, **settings}))
    if refused:
        with pytest.raises(UserError):
            decoding.validate()
            generate(model, ids, mask, decoding, torch.Generator().manual_seed(0))
        return
    decoding.validate()
    out = generate(model, ids, mask, decoding, torch.Generator().manual_seed(0))
    responses = out.responses[:, :G]
    masked = responses == f.mask_token_id
    if settings.get("eos_early_stop") or settings["sampler"] == "truncated":  # an EOS stop may leave the rest
        after_eos = torch.cumsum(responses == f.eos_token_id, dim=1) > 0
        masked &= ~after_eos
    assert not masked.any(), (responses.tolist(), out.nfe)
    assert out.nfe > 0


def test_the_regression_case_decodes_every_block_until_it_is_clean():
    """Fast-dLLM's `generate` (no cache) with a threshold: more forwards than `decoding.steps` when the rule
    commits fewer tokens a step than the even split would (here 2 steps for 8 masks), none left masked."""
    model = _model("llada")
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    out = generate(model, ids, mask, DecodingConfig(gen_length=G, block_length=4, steps=2, masked={"threshold": 0.99}))
    assert out.nfe > 2 and not (out.responses == facts(model).mask_token_id).any()
