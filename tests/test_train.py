"""The training engine: schedules, sampler, discovery, checkpoint/resume, run reuse."""

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from dare.app import baselines
from dare.config import ConfigError, TrainConfig
from dare.app.runs import resolve, train
from dare.train.optim import lr_factor
from dare.train.sampler import EpochSampler
from dare.utils import UserError

SFT_TINY = ["model.scratch.d_model=32", "model.scratch.n_heads=2", "model.scratch.n_layers=1",
            "model.scratch.mlp_hidden_size=64", "train.batch_size=16", "train.lr=1e-3", "train.warmup_steps=2",
            "algo.response_length=4", "run.log_every=1"]


def test_lr_schedules():
    t = TrainConfig(steps=10, warmup_steps=2, schedule="linear", min_lr_ratio=0.1)
    # warmup over steps 0-1, then linear from 1.0 at step 2 towards the floor, HF's progress (s - 2) / 8
    assert [round(lr_factor(s, 10, t), 4) for s in (0, 1, 2, 5, 9)] == [
        0.5, 1.0, 1.0, round(0.1 + 0.9 * 5 / 8, 4), round(0.1 + 0.9 / 8, 4)]
    t.schedule = "cosine"
    assert lr_factor(2, 10, t) == pytest.approx(1.0)
    assert lr_factor(9, 10, t) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 7 / 8)))
    t.schedule = "constant"
    assert lr_factor(9, 10, t) == 1.0


@pytest.mark.parametrize("schedule, floor", [("linear", 0.0), ("cosine", 0.1)])
def test_decay_equals_transformers_schedules(schedule, floor):
    """peft (d1's SFT: HF's default linear decay, no warmup) and coupled-GRPO (cosine_with_min_lr,
    min_lr_rate 0.1) follow transformers' own schedule functions step for step."""
    from transformers import optimization

    t = TrainConfig(steps=37, schedule=schedule, min_lr_ratio=floor)
    if schedule == "linear":
        hf = [optimization._get_linear_schedule_with_warmup_lr_lambda(s, num_warmup_steps=0, num_training_steps=37)
              for s in range(37)]
    else:
        hf = [optimization._get_cosine_schedule_with_warmup_lr_lambda(
            s, num_warmup_steps=0, num_training_steps=37, num_cycles=0.5, min_lr_rate=0.1) for s in range(37)]
    assert [lr_factor(s, 37, t) for s in range(37)] == pytest.approx(hf, abs=1e-12)


def test_epoch_sampler_covers_each_epoch_and_resumes_exactly():
    s = EpochSampler(10, torch.Generator().manual_seed(0))
    first = s.next(10)
    assert sorted(first) == list(range(10))
    s.next(3)
    state = s.state_dict()
    rest = s.next(25)
    s2 = EpochSampler(10, torch.Generator().manual_seed(123))
    s2.load_state_dict(state)
    assert s2.next(25) == rest


def test_discovery_by_convention():
    assert {"sft", "d1"} <= set(baselines.names())
    assert baselines.front_matter("d1")["arxiv"] == "2504.12216"
    with pytest.raises(UserError, match=r"unknown baseline 'd11' \(did you mean 'd1'\?\)"):
        baselines.load("d11")


def test_config_typo_fails_before_any_compute():
    with pytest.raises(ConfigError, match=r"unknown key 'train.lrr' \(did you mean 'train.lr'\?\)"):
        resolve("sft", None, ["train.lrr=1"])
    with pytest.raises(ConfigError, match="gen_length"):
        resolve("d1", None, ["rl.decoding.gen_length=100"])


def test_baseline_key_in_yaml_must_match(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("baseline: d1\n")
    with pytest.raises(ConfigError, match="does not match"):
        resolve("sft", p)


def _weights(run_dir):
    return load_file(str(run_dir / "final" / "model.safetensors"))


def test_resume_from_checkpoint_reaches_identical_weights(tmp_path):
    """Train 6 steps straight; separately, start from the step-3 checkpoint of that run and
    finish: the final weights must be bitwise equal."""
    a = train("sft", None, [*SFT_TINY, "train.steps=6", "run.save_every=3", f"run.out_dir={tmp_path / 'a'}"])
    ckpts = sorted((a / "checkpoints").glob("step_*"))
    assert [c.name for c in ckpts] == ["step_0000003"]
    b = tmp_path / "b"
    b.mkdir()
    shutil.copytree(ckpts[0], b / "checkpoints" / ckpts[0].name)
    status = json.loads((a / "run.json").read_text())
    (b / "run.json").write_text(json.dumps({**status, "status": "running"}))  # as if killed after step 3
    metrics_a = (a / "metrics.jsonl").read_text().splitlines()
    (b / "metrics.jsonl").write_text("\n".join(metrics_a) + "\n")  # lines after step 3 get dropped on resume
    train("sft", None, [*SFT_TINY, "train.steps=6", "run.save_every=3", f"run.out_dir={b}"])
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    steps_b = [json.loads(line)["step"] for line in (b / "metrics.jsonl").read_text().splitlines()]
    assert steps_b == [1, 2, 3, 4, 5, 6]


def test_periodic_checkpoints_are_kept_as_asked_and_evaluate_like_final(tmp_path):
    """run.keep_checkpoints: the latest N periodic checkpoints stay (0: all), and each is a model
    folder that `dare eval` takes like final/ (how a learning curve is measured after the run)."""
    from dare.eval import evaluate_checkpoint
    from dare.results import read_result

    kept = {}
    for keep in (0, 2):
        out = train("sft", None, [*SFT_TINY, "train.steps=8", "run.save_every=2", f"run.keep_checkpoints={keep}",
                                  f"run.out_dir={tmp_path / str(keep)}"])
        kept[keep] = [c.name for c in sorted((out / "checkpoints").glob("step_*"))]
    assert kept == {0: ["step_0000002", "step_0000004", "step_0000006"], 2: ["step_0000004", "step_0000006"]}
    with pytest.raises(ConfigError, match="run.keep_checkpoints"):
        resolve("sft", None, ["run.keep_checkpoints=-1"])
    [path] = evaluate_checkpoint(tmp_path / "0" / "checkpoints" / "step_0000004", None,
                                 ["eval.n_samples=8", "eval.decoding.gen_length=4", "eval.decoding.block_length=4",
                                  "eval.decoding.steps=4"], out_dir=tmp_path / "eval")
    assert read_result(path).benchmark.n_samples.effective == 8


def test_finished_run_is_reused_and_config_mismatch_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    train("sft", None, [*SFT_TINY, "train.steps=2", f"run.out_dir={out}"])
    stamp = (out / "final" / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    train("sft", None, [*SFT_TINY, "train.steps=2", f"run.out_dir={out}", "run.log_every=5"])  # NOHASH change
    assert "reusing finished run" in capsys.readouterr().out
    assert (out / "final" / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(ConfigError, match=r"holds a run with another config \(config hash \w{12}, this one \w{12}"):
        train("sft", None, [*SFT_TINY, "train.steps=3", f"run.out_dir={out}"])
    with pytest.raises(ConfigError, match=r"another starting checkpoint .*starting checkpoint none \(from scratch\), this one \w{12}\)"):
        train("sft", None, [*SFT_TINY, "train.steps=2", f"run.out_dir={out}", f"model.path={out / 'final'}"])
    meta = json.loads((out / "final" / "dare.json").read_text())
    assert meta["baseline"] == "sft" and meta["init"] is None and meta["steps"] == 2
    import torch

    from dare.utils import environment_lock
    made_by = meta["fingerprint"]  # which machine and environment made the checkpoint
    assert made_by["hardware"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert made_by["packages"]["torch"] == torch.__version__ and made_by["lock"] == environment_lock()
    assert (out / "config.yaml").read_text().count("config_hash: sha256:" + meta["config_hash"]) == 1


D1_ON_SFT = ["rl.prompts_per_step=4", "rl.group_size=4", "rl.decoding.gen_length=4", "rl.decoding.block_length=4",
             "rl.decoding.steps=4", "run.log_every=1"]


def _sft_then_d1(tmp_path, *overrides: str):
    """A 3-step tiny SFT run, then d1 from it with 4 prompts x 4 completions of 4 tokens and `overrides`."""
    sft_run = train("sft", None, [*SFT_TINY, "train.steps=3", f"run.out_dir={tmp_path / 'sft'}"])
    return sft_run, train("d1", None, [f"model.path={sft_run / 'final'}", *D1_ON_SFT, *overrides,
                                       f"run.out_dir={tmp_path / 'd1'}"])


def test_d1_two_steps_change_parameters_and_stay_finite(tmp_path):
    sft_run, d1_run = _sft_then_d1(tmp_path, "train.steps=2", "train.lr=1e-3", "rl.num_iterations=2")
    before, after = _weights(sft_run), _weights(d1_run)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    records = [json.loads(line) for line in (d1_run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for r in records:
        assert all(torch.isfinite(torch.tensor(float(v))) for k, v in r.items() if isinstance(v, float))
    meta = json.loads((d1_run / "final" / "dare.json").read_text())
    assert meta["init"]["baseline"] == "sft" and meta["model_name"] == json.loads(
        (sft_run / "final" / "dare.json").read_text())["model_name"]


def test_rl_validation_logs_what_dare_eval_measures_on_the_same_rows(tmp_path):
    """rl.eval_every: the embedded evaluator on held-out prompts during training, greedy with the
    rollout's lengths; after the last step it equals `dare eval` of the exported checkpoint."""
    from dare.eval import evaluate_checkpoint
    from dare.results import read_result

    sft_run = train("sft", None, [*SFT_TINY, "train.steps=3", f"run.out_dir={tmp_path / 'sft'}"])
    d1_run = train("d1", None, [f"model.path={sft_run / 'final'}", "train.steps=3", "train.lr=1e-3",
                                "rl.prompts_per_step=4", "rl.group_size=4", "rl.decoding.gen_length=4",
                                "rl.decoding.block_length=4", "rl.decoding.steps=4", "rl.eval_every=2",
                                "rl.eval_samples=64", "run.log_every=10", "run.seed=1", f"run.out_dir={tmp_path / 'd1'}"])
    records = [json.loads(line) for line in (d1_run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if "val/accuracy" in r]
    assert [r["step"] for r in val] == [2, 3]  # every 2 steps and after the last, whatever log_every says
    [path] = evaluate_checkpoint(d1_run / "final", None, ["eval.n_samples=64", "eval.decoding.gen_length=4",
                                                          "eval.decoding.block_length=4", "eval.decoding.steps=4"],
                                 out_dir=tmp_path / "eval")
    assert val[-1]["val/accuracy"] > 0  # one lucky sum in 64 for this 3-step model: not a trivial 0 == 0
    assert read_result(path).metric("accuracy").value == pytest.approx(val[-1]["val/accuracy"], abs=1e-12)
    with pytest.raises(UserError, match="rl.eval_split='dev'"):
        train("d1", None, [f"model.path={sft_run / 'final'}", "rl.eval_every=1", "rl.eval_split=dev",
                           f"run.out_dir={tmp_path / 'bad'}"])


def test_validation_on_a_schedule_of_forward_budgets():
    """rl.eval_every_forwards: a step validates when the run's forwards pass a multiple of the budget during it,
    and after the last step; the step schedule stays as it was beside it."""
    from types import SimpleNamespace

    from dare.train.validation import validation_due

    rl = SimpleNamespace(eval_every=0, eval_every_forwards=300)
    totals = [0, 160, 320, 480, 640, 800]  # 160 forwards a step
    assert [s for s in range(1, 6) if validation_due(rl, s, 5, totals[s - 1], totals[s])] == [2, 4, 5]
    rl = SimpleNamespace(eval_every=2, eval_every_forwards=0)
    assert [s for s in range(1, 6) if validation_due(rl, s, 5, totals[s - 1], totals[s])] == [2, 4, 5]
    rl = SimpleNamespace(eval_every=0, eval_every_forwards=0)
    assert not any(validation_due(rl, s, 5, totals[s - 1], totals[s]) for s in range(1, 6))


def test_rl_validates_at_forward_budgets_and_counts_its_forwards_in_its_step(tmp_path):
    _, d1_run = _sft_then_d1(tmp_path, "train.steps=3", "rl.eval_every_forwards=200", "rl.eval_samples=16")
    records = [json.loads(line) for line in (d1_run / "metrics.jsonl").read_text().splitlines()]
    per_step = records[0]["compute/total_forwards"]
    assert per_step > 100  # a budget of 200 is passed during steps 2 and 3 whatever d1 spends in [100, 200)
    due = [r["step"] for r in records if r["step"] * per_step // 200 > (r["step"] - 1) * per_step // 200 or r["step"] == 3]
    assert [r["step"] for r in records if "val/accuracy" in r] == due
    assert all((r["compute/eval_forwards"] > 0) == ("val/accuracy" in r) for r in records)


def test_rl_needs_a_checkpoint(tmp_path):
    with pytest.raises(UserError, match="model.path"):
        train("d1", None, [f"run.out_dir={tmp_path / 'x'}"])


def test_rl_loop_uses_shared_noise_and_skips_recompute_when_mu_is_one(tmp_path, monkeypatch):
    """With mu = 1 the loop must not recompute old log-probs; with mu = 2 the old/ref log-probs
    are computed on exactly the noise the update then uses."""
    from baselines.d1 import algorithm as d1

    sft_run = train("sft", None, [*SFT_TINY, "train.steps=2", f"run.out_dir={tmp_path / 'sft'}"])
    calls = []
    real = d1.token_logps

    def spy(model, batch, noise, cfg):
        calls.append((torch.is_grad_enabled(), noise.masked.clone()))
        return real(model, batch, noise, cfg)

    monkeypatch.setattr(d1, "token_logps", spy)
    common = [f"model.path={sft_run / 'final'}", "train.steps=1", "rl.prompts_per_step=2", "rl.group_size=2",
              "rl.decoding.gen_length=4", "rl.decoding.block_length=4", "rl.decoding.steps=4"]
    train("d1", None, [*common, "rl.num_iterations=1", "algo.beta=0", f"run.out_dir={tmp_path / 'mu1'}"])
    assert [grad for grad, _ in calls] == [True]  # one forward: the update itself
    calls.clear()
    train("d1", None, [*common, "rl.num_iterations=2", f"run.out_dir={tmp_path / 'mu2'}"])
    # old x2, ref x2 (no grad), then the two updates (grad), each update on its own noise
    assert [grad for grad, _ in calls] == [False, False, False, False, True, True]
    old0, old1, ref0, ref1, upd0, upd1 = (n for _, n in calls)
    assert torch.equal(old0, ref0) and torch.equal(old0, upd0)
    assert torch.equal(old1, ref1) and torch.equal(old1, upd1)


@pytest.mark.parametrize("sync", [[], ["train.reference_sync_every=3"]], ids=["frozen-ref", "synced-ref"])
def test_rl_resume_reaches_identical_weights(tmp_path, sync):
    """As for SFT, with the rollout and noise generators in the checkpoint too; with a TR-DPO
    reference (synced at optimizer steps 3 and 6, the checkpoint after step 4) the checkpoint
    must carry the moved reference."""
    sft_run = train("sft", None, [*SFT_TINY, "train.steps=2", f"run.out_dir={tmp_path / 'sft'}"])
    args = [f"model.path={sft_run / 'final'}", "train.steps=4", "train.lr=1e-3", "rl.prompts_per_step=2",
            "rl.group_size=3", "rl.num_iterations=2", "rl.decoding.gen_length=4", "rl.decoding.block_length=4",
            "rl.decoding.steps=4", "run.save_every=2", *sync]
    a = train("d1", None, [*args, f"run.out_dir={tmp_path / 'a'}"])
    b = tmp_path / "b"
    shutil.copytree(a / "checkpoints", b / "checkpoints")
    (b / "run.json").write_text(json.dumps({**json.loads((a / "run.json").read_text()), "status": "running"}))
    train("d1", None, [*args, f"run.out_dir={b}"])
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], _weights(sft_run)[k]) for k in wa)
    from torch.distributed.checkpoint import FileSystemReader

    [ckpt] = (b / "checkpoints").glob("step_*")
    keys = FileSystemReader(str(ckpt / "dcp")).read_metadata().state_dict_metadata
    assert any(k.startswith("reference.") for k in keys) == bool(sync)  # the moved reference is in the checkpoint


def test_force_starts_over(tmp_path):
    out = tmp_path / "run"
    train("sft", None, [*SFT_TINY, "train.steps=4", "run.save_every=2", f"run.out_dir={out}"])
    first = _weights(out)
    train("sft", None, [*SFT_TINY, "train.steps=4", "run.save_every=2", f"run.out_dir={out}"], force=True)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]  # retrained from step 0, not resumed
    assert all(torch.equal(first[k], _weights(out)[k]) for k in first)  # and deterministic


def test_a_changed_starting_checkpoint_is_not_reused(tmp_path, capsys):
    """d1 runs are keyed by their config AND the contents of model.path."""
    sft_dir = tmp_path / "sft"
    train("sft", None, [*SFT_TINY, "train.steps=2", f"run.out_dir={sft_dir}"])
    d1 = [f"model.path={sft_dir / 'final'}", "train.steps=1", "rl.prompts_per_step=2", "rl.group_size=2",
          "rl.decoding.gen_length=4", "rl.decoding.block_length=4", "rl.decoding.steps=4"]
    first = train("d1", None, d1)
    assert train("d1", None, d1) == first  # same checkpoint: reused
    train("sft", None, [*SFT_TINY, "train.steps=2", f"run.out_dir={sft_dir}"], force=True)  # rewritten in place
    assert train("d1", None, d1) != first


def test_bf16_mixed_precision_keeps_fp32_master_weights(tmp_path):
    """model.dtype=bfloat16 computes in bfloat16 but keeps (and saves) float32 weights, so small
    updates are not rounded away; the loss stays close to the float32 run's."""
    f32 = train("sft", None, [*SFT_TINY, "train.steps=3", "run.log_every=1", f"run.out_dir={tmp_path / 'f32'}"])
    b16 = train("sft", None, [*SFT_TINY, "train.steps=3", "run.log_every=1", "model.dtype=bfloat16",
                              f"run.out_dir={tmp_path / 'b16'}"])
    w32, w16 = _weights(f32), _weights(b16)
    assert all(v.dtype == torch.float32 for v in w16.values())
    assert any(not torch.equal(w32[k], w16[k]) for k in w32)  # bf16 compute really happened
    l32, l16 = ([json.loads(x)["loss/total"] for x in (r / "metrics.jsonl").read_text().splitlines()]
                for r in (f32, b16))
    assert l16 == pytest.approx(l32, rel=0.05)
