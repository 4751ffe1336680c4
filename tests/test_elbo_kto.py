"""ELBO-KTO: KTO's loss on unpaired examples with the fixed-l ELBO, and the preference recipe's unpaired data.

The pins: the ORIGINAL, vaibhavjindal/elbo-kto @80dc31e (`train.py` `ELBOKTOTrainer.compute_loss` with its Trainer
base stubbed, `precompute_bref.py` `elbo_batched_fixedl` for B_ref; run in a scratch folder, never committed) on the
tiny LLaDAs below (the policy seed 0, the reference seed 1), four unpadded examples (prompts of 5 tokens, responses
of 2 tokens and EOS, labels 1, 0, 1, 0), K = 3 masks injected in place of its seeded `make_fixedl_masks_batched`
(the masks `draw()` makes), beta 0.5, lambda_D = lambda_U = 1, z0 global_mean on one process; its `completion_length`
the 3 response tokens (ours score the response and its EOS; here they are the same window). B_ref: per draw the
completion length x the mean masked log-prob, averaged over the draws; then the loss and, after `backward`, each
parameter's gradient norm and its projection on a fixed random direction (as tests/test_tracerl_masked.py draws it)."""

from dataclasses import replace

import pytest
import torch

from baselines.elbo_kto import algorithm as kto
from conftest import run_config
from dare.config import ScratchModelConfig
from dare.models import facts, new_model
from dare.models.tokenizer import char_tokenizer
from dare.train import noise
from dare.train.batches import take
from dare.train.preference import preference_batch, unpaired
from test_tracerl_masked import _gradients

B_REF = [-8.976441, -9.121743, -8.818954, -9.314939]
LOSS = 0.5229048132896423
GRADIENTS = {
    "model.transformer.wte.weight": (0.585418331, 0.52759766),
    "model.transformer.blocks.0.v_proj.weight": (0.122593038, -0.0990095877),
    "model.transformer.blocks.1.ff_out.weight": (0.0253457906, -0.0147207442),
    "model.transformer.ff_out.weight": (0.63277681, 0.586056995),
}


def setup():
    tok = char_tokenizer("0123456789+=", "llada")
    size = ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64)
    policy, ref = new_model("llada", tok, size, 0), new_model("llada", tok, size, 1)
    f = facts(policy)
    ids = lambda text: [tok.convert_tokens_to_ids(c) for c in text]
    batch = preference_batch([ids(p) for p in ("12+34", "5+678", "9+9=1", "40+41")],
                             [[ids(r) for r in ("46", "83", "18", "81")]], f.eos_token_id, f.pad_token_id,
                             labels=[1, 0, 1, 0])
    return policy, ref, replace(batch, num_pairs=4)


def draw(batch, k: int = 3):
    return noise.elbo_draws(batch.response_mask[:, 0], k, torch.Generator().manual_seed(5), "count", stratified=False)


def test_elbo_loss_and_gradients_match_the_reference():
    policy, ref, batch = setup()
    cfg = run_config("elbo_kto", beta=0.5, n_mc=3)
    z = draw(batch)
    assert z.masked.sum(-1).tolist() == [[2, 1, 3], [1, 3, 2], [2, 2, 2], [1, 3, 1]]  # the masks the original got
    with torch.no_grad():
        b_ref = kto.logps(ref, batch, z, cfg)
    assert b_ref[:, 0].tolist() == pytest.approx(B_REF, abs=2e-5)
    loss, metrics = kto.loss(kto.logps(policy, batch, z, cfg), b_ref, batch, z, cfg)
    loss.backward()
    assert loss.item() == pytest.approx(LOSS, rel=1e-5)
    grads = _gradients(policy)
    for name, (norm, projection) in GRADIENTS.items():
        assert grads[name][0] == pytest.approx(norm, rel=1e-4), name
        assert grads[name][1] == pytest.approx(projection, abs=1e-4 * norm), name


def test_at_the_reference_the_loss_is_half_and_the_gradient_follows_the_label():
    """policy = reference: r = 0, z0 = 0, s = 0, v = lambda / 2, L = lambda / 2 for each example. The gradient of L
    with respect to an example's B_theta is -beta lambda_D sigmoid'(0) / B for a desirable one (raise its likelihood)
    and +beta lambda_U sigmoid'(0) / B for an undesirable one: z0 is detached, so the batch mean passes no gradient."""
    cfg = run_config("elbo_kto", beta=0.5, lambda_d=1.0, lambda_u=2.0)
    _, _, batch = setup()
    policy = torch.full((4, 1), -9.0, requires_grad=True)
    loss, metrics = kto.loss(policy, policy.detach().clone(), batch, None, cfg)
    assert loss.item() == pytest.approx((0.5 + 1.0 + 0.5 + 1.0) / 4)
    loss.backward()
    g = policy.grad[:, 0]
    assert g.tolist() == pytest.approx([-0.5 * 1 * 0.25 / 4, 0.5 * 2 * 0.25 / 4, -0.5 * 0.25 / 4, 0.5 * 2 * 0.25 / 4])
    cfg = run_config("elbo_kto", z0="zero")
    loss, metrics = kto.loss(torch.tensor([[1.0], [1.0], [1.0], [1.0]]), torch.zeros(4, 1), batch, None, cfg)
    assert metrics["rewards/z0"] == 0.0 and metrics["rewards/desirable_above_z0"] == 0.5  # r > 0 everywhere


def test_unpaired_examples_from_pairs():
    """Each pair gives its chosen response (label 1) then its rejected one (label 0), after the pair's prompt; the
    batch holds one response per row with its label, and micro-batches keep each row's label."""
    prompts, responses, labels = unpaired([[1], [2]], [[10], [20]], [[11], [21]])
    assert (prompts, responses, labels) == ([[1], [1], [2], [2]], [[10], [11], [20], [21]], [1, 0, 1, 0])
    batch = preference_batch(prompts, [responses], eos_id=9, pad_id=0, labels=labels)
    assert batch.input_ids.shape == (4, 1, 3) and batch.labels.tolist() == [1, 0, 1, 0]
    assert batch.input_ids[1, 0].tolist() == [1, 11, 9] and batch.response_mask[1, 0].tolist() == [False, True, True]
    assert take(batch, slice(1, 3), 4).labels.tolist() == [0, 1]
    pairs = preference_batch([[1]], [[[10]], [[11, 12]]], eos_id=9, pad_id=0)
    assert pairs.input_ids.shape == (1, 2, 4) and pairs.labels is None  # the paired layout as before


def test_independent_counts_are_uniform_and_exact():
    """stratified=False: each count l ~ U{1..L} on its own (not spread over the draws), exactly l positions masked,
    weight L / l; the default (stratified) draw is unchanged."""
    maskable = torch.zeros(2, 7, dtype=torch.bool)
    maskable[0, 2:6] = True  # L = 4
    maskable[1, 3:4] = True  # L = 1
    z = noise.elbo_draws(maskable, 4000, torch.Generator().manual_seed(0), "count", stratified=False)
    counts = z.masked.sum(-1)
    assert (z.masked & ~maskable[:, None]).sum() == 0 and (counts[1] == 1).all()
    share = torch.bincount(counts[0], minlength=5)[1:].float() / 4000
    assert share.tolist() == pytest.approx([0.25] * 4, abs=0.03)
    assert torch.equal(z.weight[0], 4 / counts[0].float())
    a = noise.elbo_draws(maskable, 8, torch.Generator().manual_seed(0), "count")
    b = noise.elbo_draws(maskable, 8, torch.Generator().manual_seed(0), "count", stratified=True)
    assert torch.equal(a.masked, b.masked) and torch.equal(a.weight, b.weight)


def test_config_needs_unpaired_data():
    cfg = run_config("elbo_kto")
    kto.check_config(cfg)
    with pytest.raises(ValueError, match="data.unpaired=true"):
        kto.check_config(replace(cfg, data=replace(cfg.data, unpaired=False)))


def test_vrpo_refuses_unpaired_data():
    from baselines.vrpo import algorithm as vrpo

    cfg = run_config("vrpo")
    vrpo.check_config(cfg)
    with pytest.raises(ValueError, match="VRPO compares each chosen response"):
        vrpo.check_config(replace(cfg, data=replace(cfg.data, unpaired=True)))


def test_unpaired_data_is_refused_outside_the_preference_recipe():
    from dare.app.baselines import load
    from dare.config import ConfigError
    from dare.train.fit import hooks_of

    cfg = run_config("d1")
    hooks_of(load("d1").algorithm, cfg, "d1")
    with pytest.raises(ConfigError, match="d1: data.unpaired: only the preference recipe"):
        hooks_of(load("d1").algorithm, replace(cfg, data=replace(cfg.data, unpaired=True)), "d1")
