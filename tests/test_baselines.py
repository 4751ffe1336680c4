"""The wave-one baselines (sft, peft, vrpo, d1, coupled_grpo, wd1): losses against hand-computed
values on tiny tensors and their invariants; and for every baseline, discovered under baselines/, a
two-step run on a tiny model of every family it applies to (finite losses, a non-zero gradient,
parameters change)."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from baselines.coupled_grpo import algorithm as cg
from baselines.peft import algorithm as peft_algo
from baselines.sft import algorithm as sft
from baselines.wd1 import algorithm as wd1
from conftest import (RECIPE_OVERRIDES, REPO, RL, baseline_recipe, baseline_runs, run_config,
                      tiny_overrides)
from dare.config import ConfigError, ScratchModelConfig
from dare.models import facts, new_model, token_logits
from dare.models.tokenizer import char_tokenizer
from dare.app.runs import resolve, train
from dare.train.estimators import Compute
from dare.train.hooks import bind
from dare.train.noise import Draw
from dare.train.sft import sft_batch

def rl_batch(adv, mask, group_size=2):
    mask = torch.tensor(mask)
    return SimpleNamespace(advantages=torch.tensor(adv), response_mask=mask, num_tokens=float(mask.sum()),
                           num_sequences=len(adv), group_size=group_size)


# ---------------------------------------------------------------------------------------------
# coupled_grpo
# ---------------------------------------------------------------------------------------------


def test_coupled_pair_scores_every_token_exactly_once_and_t_is_drawn_per_call():
    batch = SimpleNamespace(attention_mask=torch.ones(8, 40, dtype=torch.long), prompt_length=10, block_size=None,
                            sequences=torch.zeros(8, 40, dtype=torch.long))
    g = torch.Generator().manual_seed(0)
    draws = [cg.sample_noise(batch, g, run_config("coupled_grpo")) for _ in range(20)]
    assert all(d.t.shape == (8,) and (d.t == d.t[0]).all() and d.t_at is None for d in draws)  # one t per call
    ts = torch.stack([d.t[0] for d in draws])
    assert ((ts >= 0.2) & (ts <= 0.8)).all() and ts.std() > 0.05  # a fresh t each call, in U(0.2, 0.8)
    for d in draws:
        m = d.masked
        assert not m[:, :10].any()  # the prompt is never masked
        assert abs(m[:, 10:].float().mean().item() - d.t[0].item()) < 0.15


def test_coupled_token_logps_is_eq13(tiny_model):
    mask_id = facts(tiny_model).mask_token_id
    seqs = torch.tensor([[1, 5, 9, 7, 10, 6, 11, 12, 13], [5, 14, 7, 15, 18, 6, 13, 12, 1]])
    am = torch.tensor([[0] + [1] * 8, [1] * 9])
    P = 5
    batch = SimpleNamespace(sequences=seqs, attention_mask=am, prompt_length=P, responses=seqs[:, P:],
                            compute=Compute(pack=True, chunk=3, min_padding=0.0))
    m = torch.tensor([[True, False, True, False], [False, False, True, True]])
    t = torch.full((2,), 0.3)  # one ratio a row (`Draw.t` is `masked`'s shape without the positions)
    masked = torch.cat([torch.zeros(2, P, dtype=torch.bool), m], dim=1)
    got = cg.token_logps(tiny_model, batch, Draw(masked, t), run_config("coupled_grpo"))

    def lp(masked):
        x = seqs.clone()
        x[:, P:] = torch.where(masked, mask_id, x[:, P:])
        return torch.log_softmax(token_logits(tiny_model, x, am)[:, P:], -1).gather(-1, seqs[:, P:, None])[..., 0]

    expect = 0.5 * (torch.where(m, lp(m) / 0.3, lp(~m) / 0.7) + lp(torch.ones_like(m)))
    torch.testing.assert_close(got, expect, atol=1e-5, rtol=1e-5)


def test_coupled_loss_ratio_one_at_old_policy_and_hand_values():
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.25]], requires_grad=True)
    batch = rl_batch([1.0, -1.0], [[True, True], [True, False]])
    loss, m = cg.loss(logps, logps.detach(), logps.detach(), batch, None, run_config("coupled_grpo"))
    assert loss.item() == pytest.approx(-(2 * 1.0 + 1 * -1.0) / 3)
    assert m["stats/clip_ratio"] == 0 and m["loss/kl"] == 0
    cfg = run_config("coupled_grpo", beta=0.0, epsilon=0.2)
    old = torch.tensor([[math.log(0.5), -2.0], [-0.5, -0.25]])
    lp = torch.tensor([[math.log(0.75), -2.0], [-0.5, -0.25]])  # ratio 1.5 on the first token
    loss, m = cg.loss(lp, old, None, batch, None, cfg)
    assert loss.item() == pytest.approx(-(1.2 * 1.0 + 1.0 * 1.0 + 1.0 * -1.0) / 3, rel=1e-6)
    assert m["stats/clip_ratio"] == pytest.approx(1 / 3)


def test_coupled_advantage_baselines():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert cg.advantages(r, run_config("coupled_grpo", baseline="mean")).tolist() == [[0.75, -0.25, -0.25, -0.25]]
    assert cg.advantages(r, run_config("coupled_grpo", baseline="loo"))[0].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    with pytest.raises(ConfigError, match="group_size=1"):
        resolve("coupled_grpo", None, ["rl.group_size=1"])


# ---------------------------------------------------------------------------------------------
# wd1
# ---------------------------------------------------------------------------------------------


def test_wd1_weights_and_loss_hand_computed():
    adv = torch.tensor([1.0, -1.0, 0.5, 0.5])  # two groups of 2; the second has equal advantages
    w = wd1.weights(adv, 2, psi=1.0)
    s = 1 / (1 + math.exp(-2))  # softmax([1, -1])[0]
    assert w.tolist() == pytest.approx([-s + (1 - s), -(1 - s) + s, 0.0, 0.0])
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -3.0], [-1.0, -1.0], [-2.0, -2.0]], requires_grad=True)
    batch = rl_batch(adv.tolist(), [[True, True], [True, False], [True, True], [True, True]])
    loss, _ = wd1.loss(logps, None, None, batch, None, run_config("wd1"))
    seq = [-3.0, -0.5, -2.0, -4.0]
    assert loss.item() == pytest.approx(sum(wi * si for wi, si in zip(w.tolist(), seq)) / 2, rel=1e-6)
    loss.backward()
    assert (logps.grad[2:] == 0).all()  # equal rewards in a group: no gradient
    assert logps.grad[1, 1] == 0  # tokens after EOS carry no loss
    hooks = bind(wd1)
    assert not hooks.uses_reference(run_config("wd1")) and not hooks.uses_old_logps(run_config("wd1"))


def test_wd1_never_computes_old_or_reference_log_probs(tmp_path, monkeypatch, sft_checkpoint):
    calls = []
    real = wd1.token_logps
    monkeypatch.setattr(wd1, "token_logps", lambda m, b, z, c: calls.append(torch.is_grad_enabled()) or real(m, b, z, c))
    train("wd1", None, [f"model.path={sft_checkpoint('llada')}", *RL, "train.steps=1", "rl.diag_every=0",
                        f"run.out_dir={tmp_path / 'wd1'}"])
    assert calls == [True, True]  # mu = 2 updates, nothing without grad (the noise diagnostic is off here)


# ---------------------------------------------------------------------------------------------
# sft (block diffusion) and peft
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_block_sft_loss_hand_computed(family):
    tok = char_tokenizer("0123456789+=", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0)
    f = facts(model)
    batch = sft_batch([[5, 9, 7, 10, 6], [5, 11, 6]], [[12, 13], [14]], f.eos_token_id, f.pad_token_id, 4)
    noise = sft.sample_noise(batch, torch.Generator().manual_seed(1), run_config("sft"))
    loss, _ = sft.loss(model, batch, noise, run_config("sft"))
    masked, p = noise.masked, noise.t
    noisy = torch.where(masked, f.mask_token_id, batch.input_ids)
    logits = model(torch.cat([noisy, batch.input_ids], 1), attention_mask=batch.attention_mask,
                   block_diffusion=True).logits
    lp = torch.log_softmax(logits.float(), -1).gather(-1, batch.input_ids[..., None])[..., 0]
    expect = sum((-(lp[b][masked[b]]).sum() / p[b] / 4) for b in range(2)) / 2
    assert masked.any() and loss.item() == pytest.approx(expect.item(), rel=1e-5)


def test_peft_loss_is_d1s_token_normalised_sft(tiny_model):
    f = facts(tiny_model)
    batch = sft_batch([[5, 9, 7, 10, 6], [5, 11, 6]], [[12, 13], [14]], f.eos_token_id, f.pad_token_id, 4)
    noise = peft_algo.sample_noise(batch, torch.Generator().manual_seed(2), run_config("peft"))
    loss, _ = peft_algo.loss(tiny_model, batch, noise, run_config("peft"))
    masked, t = noise.masked, noise.t
    noisy = torch.where(masked, f.mask_token_id, batch.input_ids)
    lp = torch.log_softmax(token_logits(tiny_model, noisy, batch.attention_mask), -1).gather(
        -1, batch.input_ids[..., None])[..., 0]
    expect = sum(-(lp[b][masked[b]]).sum() / t[b] for b in range(2)) / 8  # 2 rows x 4 response tokens
    assert masked.any() and loss.item() == pytest.approx(expect.item(), rel=1e-5)
    with pytest.raises(ConfigError, match="model.lora.rank must be > 0"):
        resolve("peft", None, ["model.lora.rank=0"])


def test_peft_follows_d1s_collator_truncation_and_schedule(tiny_model):
    """d1's SFT: t = (1 - eps) u + eps (not a clamp), prompt + response cut to 4096 tokens, and
    HF's default schedule (linear to 0, no warmup)."""
    from dare.train.sft import truncate

    g = torch.Generator().manual_seed(5)
    u = torch.rand(3, generator=torch.Generator().manual_seed(5))
    batch = sft_batch([[5, 9], [5], [6]], [[12], [13], [14]], 1, 1, 2)
    noise = peft_algo.sample_noise(batch, g, run_config("peft", eps=0.25))
    torch.testing.assert_close(noise.t, 0.75 * u + 0.25)  # u = 0.1 would give 0.325, a clamp 0.25
    kept, cut = truncate([[1, 2, 3], [1], [1, 2, 3, 4, 5]], [[7, 8, 9], [7], [7, 8]], 4)
    assert kept == [[7], [7], []] and cut == [True, False, True]
    cut_batch = sft_batch([[1, 2, 3], [1]], kept[:2], 0, 0, None, cut=cut[:2])
    # row 0 is cut: no EOS after its token, the rest hidden; row 1 ends with EOS padding
    assert cut_batch.input_ids.tolist() == [[1, 2, 3, 7, 0], [0, 0, 1, 7, 0]]
    assert cut_batch.attention_mask.tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert cut_batch.response_mask.tolist() == [[False, False, False, True, False], [False, False, False, True, True]]
    assert cut_batch.num_tokens == 3
    # a prompt as long as the limit keeps no response: the row adds nothing (d1: no loss terms), not NaN
    empty = sft_batch([[1, 2, 3, 4], [1]], [[], [7]], 0, 0, None, cut=[True, False])
    for algo, cfg in ((peft_algo, run_config("peft")), (sft, run_config("sft"))):
        noise = algo.sample_noise(empty, torch.Generator().manual_seed(0), cfg)
        value, metrics = algo.loss(tiny_model, empty, noise, cfg)
        assert torch.isfinite(value) and all(math.isfinite(v) for v in metrics.values())
    from baselines.peft.config import Config

    c = Config()
    assert (c.train.schedule, c.train.min_lr_ratio, c.train.warmup_steps, c.algo.max_length) == ("linear", 0.0, 0, 4096)


# ---------------------------------------------------------------------------------------------
# Two steps on a tiny model of every family each baseline applies to
# ---------------------------------------------------------------------------------------------


def _changed(before: str, after) -> bool:
    a, b = load_file(str(before / "model.safetensors")), load_file(str(after / "final" / "model.safetensors"))
    return any(not torch.equal(a[k], b[k]) for k in a)


def _check_run(out):
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    assert all(math.isfinite(v) for r in records for v in r.values() if isinstance(v, float))
    assert any(r["optim/grad_norm"] > 0 for r in records)


# Discovered (tests/conftest.py): every baselines/<name>/ with an algorithm.py, on every family its README
# front matter declares; what a tiny run of it needs beyond its recipe's overrides is its front matter's
# `tests: overrides:` (`tiny_overrides`). A new baseline is picked up without an edit here.
RL_RUNS = baseline_runs("rl")
SUPERVISED_RUNS = baseline_runs("sft", "preference")


def test_every_family_a_baseline_declares_is_run_here():
    from dare.app.baselines import front_matter, names

    tested = {}
    for name, family in RL_RUNS + SUPERVISED_RUNS:
        tested.setdefault(name, []).append(family)
    for name in names():
        assert tested.get(name) == front_matter(name)["families"], name


def test_every_baselines_folder_is_discovered():
    """A folder under baselines/ holding an algorithm.py is a baseline: it is run here on its families,
    with a recipe the runs know and a well-formed `tests:` front matter field (if any)."""
    from dare.app.baselines import front_matter, names

    folders = sorted(p.name for p in (REPO / "baselines").iterdir()
                     if p.is_dir() and not p.name.startswith(("_", ".")) and (p / "algorithm.py").is_file())
    assert folders and names() == folders
    assert sorted({n for n, _ in RL_RUNS + SUPERVISED_RUNS}) == folders
    for name in folders:
        assert baseline_recipe(name) in RECIPE_OVERRIDES, f"baselines/{name}: unknown RECIPE {baseline_recipe(name)!r}"
        for family in front_matter(name)["families"]:
            assert tiny_overrides(name, family)  # checks the `tests:` field


@pytest.mark.parametrize("name,family", RL_RUNS)
def test_rl_baselines_two_steps(name, family, tmp_path, monkeypatch, sft_checkpoint):
    """Rewards alternate 1/0 within each group so that a barely trained model gets a gradient."""
    from dare.data import TASKS

    ckpt = sft_checkpoint(family)
    monkeypatch.setattr(TASKS["addition"], "rewards", lambda texts, rows, style="default": [
        float(i % 2) for i in range(len(texts))])
    out = train(name, None, [f"model.path={ckpt}", f"model.family={family}", *tiny_overrides(name, family),
                             f"run.out_dir={tmp_path / name}"])
    _check_run(out)
    assert _changed(ckpt, out)


def test_a_step_whose_groups_are_all_filtered_makes_no_update(tmp_path, monkeypatch, sft_checkpoint):
    """TraceRL's accuracy filter (`kept_groups`) drops every group whose mean reward (here 0.5 in every
    group) lies outside [filter_low, filter_high]: the reference then trains on nothing, so the loop
    takes no optimizer step (Adam would move the weights on a zero gradient) and logs the share kept;
    with the default filter the same groups are kept and trained on."""
    from dare.data import TASKS

    ckpt = sft_checkpoint("sdar")
    monkeypatch.setattr(TASKS["addition"], "rewards", lambda texts, rows, style="default": [
        float(i % 2) for i in range(len(texts))])
    common = [f"model.path={ckpt}", "model.family=sdar", *RL]
    out = train("tracerl", None, [*common, "algo.filter_low=0.9", "algo.filter_high=1.0", f"run.out_dir={tmp_path / 'none'}"])
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/kept_groups"] for r in records] == [0.0, 0.0]
    assert not any("optim/grad_norm" in r or "loss/total" in r for r in records)
    assert not _changed(ckpt, out)
    out = train("tracerl", None, [*common, f"run.out_dir={tmp_path / 'all'}"])
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/kept_groups"] for r in records] == [1.0, 1.0] and _changed(ckpt, out)


@pytest.mark.parametrize("name,family", SUPERVISED_RUNS)
def test_supervised_baselines_two_steps(name, family, tmp_path, sft_checkpoint):
    ckpt = sft_checkpoint(family)
    out = train(name, None, [f"model.path={ckpt}", f"model.family={family}", *tiny_overrides(name, family),
                             f"run.out_dir={tmp_path / name}"])
    _check_run(out)
    assert _changed(ckpt, out)
