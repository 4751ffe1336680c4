"""d2-StepMerge: each token scored from the canvas at the start of its segment of the rollout's steps, the
prompt masked at random, diffu-GRPO's loss.

The pins: the ORIGINAL, kuleshov-group/d2 @381b9f1 `diffu-grpo/diffu_grpo_trainer.py` `d2StepMergeTrainer`
(`generate`, `_get_per_token_logps`, `_get_per_token_logps_oldandref`, `compute_loss`, the class run with its
base class stubbed in a scratch folder, never committed) on the tiny LLaDA of `injected()`
(tests/test_tracerl_masked.py), with the prompt masks injected in place of `forward_process`'s
`set_seed` + `torch.rand` (the masks `PROMPT_MASKS` draws), its trajectory snapshots built by its own loop over
the steps from the step map `STEPS` (12 steps, N = 5: segment boundaries at steps 2, 4, 7, 9), mu = 2, eps 0.2,
beta 0.5, the old log-probs `injected()`'s and the reference's those plus 0.1 x linspace(-1, 1, 12); its loss
summed over the N micro-steps of one optimizer step, each divided by gradient_accumulation_steps = N as the
Trainer does. `generate` ran with its entropy buffer in float32 (bfloat16 in the original, for CUDA autocast;
only logged)."""

from dataclasses import replace

import pytest
import torch

from baselines.d1 import algorithm as d1
from baselines.d2 import algorithm as d2
from conftest import run_config
from dare.config import DecodingConfig, MaskedOptions
from dare.rollout import generate
from dare.train import noise
from dare.train.estimators import trajectory_logps
from dare.train.rl import Totals
from test_tracerl_masked import ADVANTAGES, STEPS, _gradients, injected

# the original's segment of each completion token of `STEPS` (steps 12, N 5)
SEGMENTS = [[1, 0, 0, 0, 1, 2, 2, 2, 2, 3, 3, 2], [0, 1, 0, 2, 1, 1, 2, 2, 3, 3, 4, 4],
            [4, 4, 4, 3, 3, 2, 2, 2, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]]
# `_get_per_token_logps_oldandref` under each of the two prompt masks: per row, the sum over the completion up to
# and including its first EOS (9, 4, 12 and 1 tokens)
OLD_SUMS = [[-26.610844, -12.046554, -33.989895, -3.048565], [-26.516369, -12.06986, -33.981884, -3.039704]]
# `compute_loss` over the 5 micro-steps, and {parameter: (gradient norm, gradient . v)} as `_gradients` draws v
LOSS = -0.8939675539731979
GRADIENTS = {
    "model.transformer.wte.weight": (0.796561783, -0.214934572),
    "model.transformer.blocks.0.v_proj.weight": (0.401880465, -0.190980563),
    "model.transformer.blocks.0.attn_out.weight": (0.374460647, -0.775448274),
    "model.transformer.blocks.1.q_proj.weight": (0.001565918, 0.00064286446),
    "model.transformer.blocks.1.ff_out.weight": (0.0481457603, -0.0745630757),
    "model.transformer.ln_f.weight": (0.0268252007, -0.0214967149),
    "model.transformer.ff_out.weight": (0.911988792, -0.553981941),
}
# `generate(steps=6, gen_length=12, block_length=6, temperature=0, N=4)` on `injected()`'s model and prompts: the
# tokens and each token's segment (its `trajectory_mask`; boundaries at steps 1, 3, 4)
GENERATED = [[4, 18, 18, 18, 18, 4, 9, 9, 9, 9, 9, 9], [4, 4, 18, 18, 18, 18, 4, 4, 9, 9, 9, 9],
             [18, 18, 18, 18, 18, 18, 4, 4, 9, 9, 9, 9], [18, 18, 18, 18, 18, 18, 4, 4, 9, 9, 9, 9]]
GENERATED_SEGMENTS = [[1, 0, 0, 1, 1, 1, 3, 3, 2, 2, 3, 3], [1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 3, 3],
                      [1, 0, 1, 1, 1, 0, 2, 2, 3, 3, 3, 3], [0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3]]


def prompt_masks(batch) -> list[torch.Tensor]:
    """The two injected prompt masks (each prompt token with probability 0.3), as the original received them."""
    gen = torch.Generator().manual_seed(7)
    B, L = batch.sequences.shape
    prompt = ~noise.completion(batch.attention_mask, batch.prompt_length)
    return [(torch.rand(B, L, generator=gen) < 0.3) & prompt for _ in range(2)]


def setup(**algo):
    """`injected()`'s model, batch (step map `STEPS`) with `prepare`'s segments, old log-probs; a config of 12 steps."""
    model, batch, old = injected("llada")
    batch = replace(batch, totals=Totals(num_tokens=float(batch.response_mask.sum()), num_sequences=4))
    cfg = run_config("d2", **{"segments": 5, "beta": 0.5, "epsilon": 0.2, **algo})
    cfg = replace(cfg, rl=replace(cfg.rl, decoding=replace(cfg.rl.decoding, steps=12)))
    return model, d2.prepare(batch, cfg), old, cfg


def test_segments_are_the_references_boundaries():
    """Step s is in segment k when int(12 k / 5) <= s < int(12 (k + 1) / 5): the original's snapshots. One segment
    per step gives the step; one segment, 0 everywhere; an uncommitted position is in none."""
    steps = torch.tensor(STEPS)
    assert d2.segments(steps, 12, 5).tolist() == SEGMENTS
    assert d2.segments(steps, 12, 12).tolist() == STEPS
    assert (d2.segments(steps, 12, 1) == 0).all()
    assert d2.segments(torch.tensor([[-1, 3]]), 12, 5).tolist() == [[noise.NEVER, 1]]


def test_rollout_segments_match_the_references_snapshots():
    """Our masked sampler (temperature 0, no cache) decodes the original's tokens, and its step map cut into
    segments is the original's `trajectory_mask`: 6 steps, N = 4."""
    model, batch, _ = injected("llada")
    P = batch.prompt_length
    out = generate(model, batch.sequences[:, :P], batch.attention_mask[:, :P],
                   DecodingConfig(gen_length=12, block_length=6, steps=6, temperature=0.0))
    assert out.sequences[:, P:].tolist() == GENERATED
    assert d2.segments(out.step_map, 6, 4).tolist() == GENERATED_SEGMENTS


def test_log_probs_loss_and_gradients_match_the_reference():
    model, batch, old, cfg = setup()
    assert batch.extras["rounds"][:, batch.prompt_length:].tolist() == SEGMENTS
    masks = prompt_masks(batch)
    with torch.no_grad():
        for mask, want in zip(masks, OLD_SUMS):
            logps = d2.token_logps(model, batch, noise.Draw(mask), cfg)
            assert (logps[~batch.response_mask] == 0).all()
            assert logps.sum(1).tolist() == pytest.approx(want, abs=2e-5)
    G = old.shape[1]
    ref = old + 0.1 * torch.linspace(-1, 1, G)
    batch.advantages = torch.tensor(ADVANTAGES)
    logps = d2.token_logps(model, batch, noise.Draw(masks[0]), cfg)
    loss, metrics = d2.loss(logps, old, ref, batch, noise.Draw(masks[0]), cfg)
    loss.backward()
    assert loss.item() == pytest.approx(LOSS, rel=1e-5)
    assert metrics["stats/clip_ratio"] > 0 and metrics["loss/kl"] > 0  # both the clip and the KL take part
    grads = _gradients(model)
    for name, (norm, projection) in GRADIENTS.items():
        assert grads[name][0] == pytest.approx(norm, rel=1e-4), name
        assert grads[name][1] == pytest.approx(projection, abs=1e-4 * norm), name


def test_one_segment_is_d1_and_one_segment_a_step_the_trajectory_likelihood():
    """N = 1: every token from the all-masked completion, d1's one-step estimate, on the same prompt mask. N =
    steps with no prompt masking: the exact likelihood of the rollout's transitions, TraceRL's replay with one
    step a round."""
    model, batch, _, cfg = setup(segments=1)
    mask = prompt_masks(batch)[0]
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    with torch.no_grad():
        ours = d2.token_logps(model, batch, noise.Draw(mask), cfg)
        theirs = d1.token_logps(model, batch, noise.Draw(completion | mask), run_config("d1"))
        on = batch.response_mask
        assert torch.equal(ours[on], theirs[on])
        model, batch, _, cfg = setup(segments=12, p_mask_prompt=0.0)
        ours = d2.token_logps(model, batch, d2.sample_noise(batch, torch.Generator().manual_seed(0), cfg), cfg)
        exact = trajectory_logps(model, batch, noise.rollout_rounds(batch), targets=batch.response_mask)
        assert torch.equal(ours, exact)


def test_the_prompt_draw_masks_the_prompt_only():
    _, batch, _, cfg = setup(p_mask_prompt=0.5)
    draw = d2.sample_noise(batch, torch.Generator().manual_seed(0), cfg)
    P = batch.prompt_length
    assert not draw.masked[:, P:].any() and draw.masked[:, :P].any() and not draw.masked[:, :P].all()


def test_config_refuses_what_it_cannot_replay():
    cfg = run_config("d2")
    d2.check_config(cfg)
    with pytest.raises(ValueError, match="a segment holds at least one step"):
        d2.check_config(run_config("d2", segments=129))
    cfg = replace(cfg, rl=replace(cfg.rl, decoding=replace(cfg.rl.decoding, masked=MaskedOptions(threshold=0.9))))
    with pytest.raises(ValueError, match="parallel rule"):
        d2.check_config(cfg)
    with pytest.raises(Exception, match="must be >= 1"):
        run_config("d2", segments=0).algo.validate()
