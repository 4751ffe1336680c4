"""RL runs that explain themselves (`dare.train.diagnostics`): rollout/trainer agreement, estimator noise,
diversity, compute accounting and the guards, on real runs of tiny models (no mocks; the NaN and the
collapse are injected through a test algorithm and a collapse threshold, as a user would set one)."""

import json
import math
import types

import pytest
import torch
from safetensors.torch import load_file

from conftest import RL
from dare.app.runs import resolve, train
from dare.config import DecodingConfig, ModelConfig, TrainConfig
from dare.data import load_split
from dare.models import encode_chat, facts
from dare.rollout import generate, left_pad
from dare.train import diagnostics as diag
from dare.train.estimators import Compute
from dare.train.fit import fit
from dare.train.diagnostics import replay_agreement
from dare.train.rl import RLBatch, Totals
from dare.train.dist import Dist
from dare.train.trainer import Trainer
from dare.utils import UserError


def _lines(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _rl(sft_checkpoint, tmp_path, name, *extra, family="llada"):
    return train(name, None, [*RL, f"model.family={family}", f"model.path={sft_checkpoint(family)}",
                              f"run.out_dir={tmp_path / name}", *extra])


# --- 1. rollout/trainer agreement

def _agreement(model, tokenizer, decoding) -> float:
    rows = load_split("addition", "test")[:16]
    ids, mask = left_pad(encode_chat(tokenizer, [r["prompt"] for r in rows]), facts(model).pad_token_id)
    out = generate(model, ids, mask, decoding, torch.Generator().manual_seed(0))
    B = out.sequences.shape[0]
    batch = RLBatch(rollout=out, facts=facts(model), rewards=torch.zeros(B), advantages=torch.zeros(B),
                    totals=Totals(num_tokens=float(out.response_mask.sum()), num_sequences=B))
    trainer = Trainer(model, ModelConfig(), TrainConfig(), Dist(), 1)
    sums = replay_agreement(model, trainer, batch, B)
    assert sums["replay/n"] >= B  # every row committed tokens, and they were all compared
    return sums["replay/abs"] / sums["replay/n"]


def test_the_trainer_replays_the_reference_sampler_exactly_and_the_dual_cache_measurably_not(trained_tiny, char_tok):
    """The trainer's log-prob of each committed token, in the state the sampler decoded it from, equals the
    sampler's for LLaDA's reference sampler (no cache, fixed quota), and with a threshold alone (the states
    are the same); the dual cache with threshold decoding (stale keys) moves it by ~2e-2 nats per token on
    this trained tiny model (measured 0.023 vs 8e-8), so the logged gap tells them apart."""
    common = dict(gen_length=8, block_length=4, steps=8, temperature=0.9)
    reference = _agreement(trained_tiny, char_tok, DecodingConfig(**common))
    threshold = _agreement(trained_tiny, char_tok, DecodingConfig(**common, masked={"threshold": 0.9}))
    dual = _agreement(trained_tiny, char_tok, DecodingConfig(**common, masked={"cache": "dual", "threshold": 0.9}))
    assert reference < 1e-5 and threshold < 1e-5
    assert dual > 5e-3 and dual > 1000 * reference


def test_a_d1_run_logs_agreement_noise_diversity_and_compute_and_its_result_records_the_compute(
        sft_checkpoint, tmp_path, capsys):
    run = _rl(sft_checkpoint, tmp_path, "d1", "rl.diag_every=1")
    lines = _lines(run)
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        # mu = 2: the old log-probs come from their own pass on the same draw; at the first update the ratio is 1
        assert m["agree/ratio_mean"] == 1.0 and m["agree/ratio_max_dev"] == 0.0
        assert m["agree/logp_abs_gap"] < 1e-5  # the reference sampler, replayed exactly
        assert m["agree/estimate_abs_gap"] > m["agree/logp_abs_gap"]  # d1's one-step estimate is not the policy's
        assert m["diag/logp_std"] > 0 and m["train/nonfinite_logps"] == 0 and m["rollout/nonfinite"] == 0
        assert 0 <= m["rollout/identical_groups"] <= 1 and 0 < m["rollout/distinct_ratio"] <= 1
        # hand count (4 prompts x 4 completions = 16 rows, 4 decoding steps, mu = 2 draws): rollout 16 x 4 forwards;
        # training: old log-probs 2 x 16, reference 2 x 16, updates 2 x 16; tokens: 16 x gen_length 4
        assert (m["compute/rollout_forwards"], m["compute/train_forwards"], m["compute/rollout_tokens"]) == (64, 96, 64)
        assert m["compute/rollout_nfe"] == 4 and m["compute/update_tokens"] == 2 * 16 * m["rollout/response_tokens"]
        # diagnostics apart: the agreement replays 8 rows x 4 rounds, the noise 4 draws x 8 rows
        assert m["compute/diag_forwards"] == 64
    assert lines[1]["compute/total_forwards"] == 2 * (64 + 96)
    assert lines[1]["compute/total_update_tokens"] == lines[0]["compute/update_tokens"] + lines[1]["compute/update_tokens"]
    shown = capsys.readouterr().err
    assert "logp_gap=" in shown and "identical_groups=" in shown and "total_forwards=320" in shown
    meta = json.loads((run / "final" / "dare.json").read_text())
    assert meta["compute"]["rollout_forwards"] == 128 and meta["compute"]["train_forwards"] == 192
    # the evaluation's result carries it (schema 3)
    from dare.app.cli import main
    assert main(["eval", str(run / "final"), "eval.n_samples=8", "eval.batch_size=8"]) == 0
    result = json.loads(next((run / "eval").glob("*/result_addition.json")).read_text())
    assert result["schema_version"] == "3" and result["training"]["compute"]["train_forwards"] == 192


def test_diagnostics_leave_the_training_unchanged(sft_checkpoint, tmp_path):
    """The diagnostics draw their own noise and run eval-mode forwards: the same run without them ends with
    the same weights, bit for bit."""
    on = _rl(sft_checkpoint, tmp_path / "on", "d1", "rl.diag_every=1", "rl.agreement_rows=16")
    off = _rl(sft_checkpoint, tmp_path / "off", "d1", "rl.diag_every=0", "rl.agreement_rows=0")
    a, b = load_file(str(on / "final" / "model.safetensors")), load_file(str(off / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "diag/logp_std" not in _lines(off)[0] and "agree/logp_gap" not in _lines(off)[0]


@pytest.mark.parametrize("family,name", [("sdar", "tracerl"), ("llada", "spg")])
def test_block_models_and_multi_draw_estimators_log_them_too(sft_checkpoint, tmp_path, family, name):
    """The block sampler's committed tokens replay exactly through the block layout (its cache is exact);
    TraceRL's estimator has no noise (a trajectory replay), SPG's draws several masks per row."""
    m = _lines(_rl(sft_checkpoint, tmp_path, name, "rl.diag_every=1", family=family))[-1]
    assert m["agree/logp_abs_gap"] < 1e-5 and m["compute/rollout_forwards"] > 0
    # a step whose groups TraceRL's filter all drops (rewards all 0 here) trains on nothing, and counts nothing
    assert (m["compute/train_forwards"] > 0) == (m["rollout/kept_groups"] > 0)
    assert (m["diag/logp_std"] == 0) == (name == "tracerl")


# --- 3. diversity and degeneration

def test_diversity_sums_by_hand():
    eos = 9
    responses = torch.tensor([[1, 2, eos, 5], [1, 2, eos, 6], [3, 3, 3, 3], [1, eos, eos, eos]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    s = diag.diversity_sums(responses, mask, 2, [eos])
    # group 1: both "1 2 EOS" (identical: the tokens after EOS do not count); group 2: distinct
    assert (s["groups"], s["identical"], s["distinct"]) == (2, 1, 0.5 + 1.0)
    assert (s["stop_rows"], s["stop_pos"]) == (3, 2 + 2 + 1)
    assert (s["repeat"], s["pairs"]) == (3, 2 + 2 + 3 + 1)  # "3 3 3 3" repeats 3 times
    m = diag.ratios(s, diag.DIVERSITY)
    assert m == {"rollout/identical_groups": 0.5, "rollout/distinct_ratio": 0.75, "rollout/eos_position": 5 / 3,
                 "rollout/repeat_rate": 3 / 8}


def test_a_run_without_sampling_diversity_warns(sft_checkpoint, tmp_path, capsys):
    """Greedy rollouts make every group's completions identical: the log says so after N steps."""
    run = _rl(sft_checkpoint, tmp_path, "d1", "rl.decoding.temperature=0", "rl.warn_no_diversity=2")
    assert all(m["rollout/identical_groups"] == 1.0 for m in _lines(run))
    assert "warning: no sampling diversity for 2 steps" in capsys.readouterr().err


# --- 4. guards

def _nan_once_d1(at_step: int, times: int = 1):
    """d1 whose loss is NaN in the first `times` updates of step `at_step` (1-based): a real run with a
    real non-finite loss, whatever its cause."""
    import baselines.d1.algorithm as d1

    module = types.ModuleType("nan_once_d1")
    module.__dict__.update({k: v for k, v in vars(d1).items() if not k.startswith("__")})
    left = {"n": times}

    def loss(logps, old, ref, batch, noise, cfg):
        value, metrics = d1.loss(logps, old, ref, batch, noise, cfg)
        if round(batch.progress * cfg.train.steps) + 1 == at_step and left["n"] > 0:
            left["n"] -= 1
            value = value * float("nan")
        return value, metrics

    module.loss = loss
    return module


def _fit(module, sft_checkpoint, run_dir, *extra):
    _, cfg, _ = resolve("d1", None, [*RL, "model.family=llada", f"model.path={sft_checkpoint('llada')}",
                                     "train.steps=3", "run.save_every=1", "train.schedule=constant", *extra])
    return fit(module, cfg, run_dir, name="d1")


def test_a_nan_loss_rolls_back_to_the_last_checkpoint_and_halves_the_learning_rate(sft_checkpoint, tmp_path):
    run = _fit(_nan_once_d1(at_step=2), sft_checkpoint, tmp_path / "nan")
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "done"
    [event] = status["guards"]
    assert (event["step"], event["action"], event["restored_step"], event["lr_scale"]) == (2, "rollback", 1, 0.5)
    assert "non-finite loss/total" in event["reason"]
    lines = _lines(run)
    assert [m["step"] for m in lines] == [1, 2, 3]  # the bad step's line is gone, the rerun's is there
    assert lines[0]["optim/lr"] == 1e-3 and lines[1]["optim/lr"] == lines[2]["optim/lr"] == 5e-4
    assert all(math.isfinite(m["loss/total"]) for m in lines)
    weights = load_file(str(run / "final" / "model.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())
    # the compute of the rolled-back step counts: 4 steps' rollouts were made for 3 kept steps
    assert lines[-1]["compute/total_rollout_forwards"] == 4 * 64


def test_a_nan_with_on_collapse_stop_exits_with_the_reason_in_run_json(sft_checkpoint, tmp_path):
    with pytest.raises(UserError, match="non-finite loss/total.*rl.on_collapse=stop"):
        _fit(_nan_once_d1(at_step=2), sft_checkpoint, tmp_path / "stop", "rl.on_collapse=stop")
    status = json.loads((tmp_path / "stop" / "run.json").read_text())
    assert status["status"] == "collapsed" and [e["action"] for e in status["guards"]] == ["stop"]


def test_a_synthetic_collapse_rolls_back_then_stops_when_rollbacks_run_out(sft_checkpoint, tmp_path):
    """A collapse floor no real reward reaches (2.0) makes every 2-step window a collapse: step 2 rolls back to
    the checkpoint before the window (step 1: halved learning rate), step 3 collapses again and, with one
    rollback allowed, stops."""
    import baselines.d1.algorithm as d1

    with pytest.raises(UserError, match=r"after 1 rollback\(s\)"):
        _fit(d1, sft_checkpoint, tmp_path / "collapse", "rl.collapse_metric=rollout/reward_mean",
             "rl.collapse_below=2.0", "rl.collapse_window=2", "rl.max_rollbacks=1")
    status = json.loads((tmp_path / "collapse" / "run.json").read_text())
    first, second = status["guards"]
    assert (first["step"], first["action"], first["restored_step"]) == (2, "rollback", 1)
    assert (second["step"], second["action"]) == (3, "stop") and "below rl.collapse_below=2.0" in second["reason"]


def test_collapse_guard_by_hand():
    g = diag.CollapseGuard("val/accuracy", window=2, below=None, drop=0.5)
    seq = [0.2, 0.6, 0.8, 0.5, 0.1]  # window means: -, 0.4, 0.7, 0.65, 0.3 (< (1 - 0.5) x best 0.7)
    verdicts = [g.check({"val/accuracy": v}) for v in seq]
    assert verdicts[:4] == [None, None, None, None] and "averaged 0.3 " in verdicts[4]
    assert "below its best 0.7" in verdicts[4]
    assert diag.CollapseGuard("val/accuracy", 2, None, 0.5).check({"val/accuracy": 0.2}) is None
    floor = diag.CollapseGuard("rollout/reward_mean", 1, 0.1, None)
    assert floor.check({"rollout/reward_mean": 0.1}) is None and floor.check({"rollout/reward_mean": 0.05})
    assert g.check({"rollout/reward_mean": 0.0}) is None  # a step that does not log the metric is skipped


def test_a_non_finite_gradient_never_reaches_the_weights(tiny_model):
    model = tiny_model
    trainer = Trainer(model, ModelConfig(), TrainConfig(lr=1e-2), Dist(), 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 10, (2, 6))
    (model(input_ids=ids).logits.sum() * float("nan")).backward()
    assert math.isnan(trainer.step())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert trainer.scheduler.last_epoch == 0 and not trainer.optimizer.state


def test_sequence_estimates_of_every_shape_an_estimator_returns():
    """Per-token (b, G), per-draw per-token (b, n, G), sequence-level (b,) (ESPO, GDPO, EBPO) and per-draw
    sequence terms (b, n): one number per sequence, by hand."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    tokens = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
    assert diag.sequence_estimate(tokens, mask).tolist() == [-3.0, -3.0]
    draws = torch.stack([tokens, 2 * tokens], dim=1)  # (2, 2, 3): the second draw doubles every value
    assert diag.sequence_estimate(draws, mask).tolist() == [-4.5, -4.5]
    assert diag.sequence_estimate(torch.tensor([-5.0, -7.0]), mask).tolist() == [-5.0, -7.0]
    assert diag.sequence_estimate(torch.tensor([[-1.0, -3.0], [-2.0, -2.0]]), mask).tolist() == [-2.0, -2.0]
