"""The execution trainer: FSDP2 over several processes (torchrun, Ray), gradient accumulation,
gradient checkpointing, LoRA through peft, and early errors for bad configs.

Multi-process tests launch the real launchers (torchrun, a local Ray cluster) with gloo on CPU."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import run_config
from dare.app.runs import resolve, train
from dare.config import ConfigError
from dare.utils import UserError

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.scratch.d_model=32", "model.scratch.n_heads=2", "model.scratch.n_layers=2",
        "model.scratch.mlp_hidden_size=64", "train.batch_size=16", "train.lr=1e-3", "train.warmup_steps=2",
        "algo.response_length=4", "run.log_every=1", "run.threads=1"]
D1_TINY = ["train.lr=1e-3", "rl.prompts_per_step=4", "rl.group_size=4", "rl.decoding.gen_length=4",
           "rl.decoding.block_length=4", "rl.decoding.steps=4", "run.log_every=1", "run.threads=1"]


def _weights(run_dir: Path, sub="final"):
    return load_file(str(run_dir / sub / "model.safetensors"))


def _losses(run_dir: Path, key="loss/total"):
    return [json.loads(x)[key] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _close(a: dict, b: dict, atol=1e-6):
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, f"largest weight difference {worst:.3g}"


def _torchrun(n: int, *args: str, timeout=300):
    exe = Path(sys.executable).parent / "torchrun"
    r = subprocess.run([str(exe), "--nproc-per-node", str(n), "-m", "dare.app.cli", *args], capture_output=True,
                       text=True, timeout=timeout, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_fsdp_two_processes_match_one_process_and_resume_on_one(tmp_path):
    """torchrun x 2 (FSDP2 over gloo, micro-batches of 3 rows, gradient checkpointing) trains to
    the same weights and losses as one plain process; its checkpoint resumes in one process."""
    one = train("sft", None, [*TINY, "train.steps=4", f"run.out_dir={tmp_path / 'one'}"])
    _torchrun(2, "train", "sft", *TINY, "train.steps=4", "run.save_every=2", "train.micro_batch_size=3",
              "train.gradient_checkpointing=true", f"run.out_dir={tmp_path / 'two'}")
    two = tmp_path / "two"
    assert json.loads((two / "run.json").read_text())["world_size"] == 2
    _close(_weights(one), _weights(two))
    assert _losses(two) == pytest.approx(_losses(one), rel=1e-5)
    # the 2-process checkpoint at step 2 (full tensors) resumes in a single process
    resumed = tmp_path / "resumed"
    shutil.copytree(two / "checkpoints", resumed / "checkpoints")
    run_json = json.loads((two / "run.json").read_text())
    (resumed / "run.json").write_text(json.dumps({**run_json, "status": "running"}))
    train("sft", None, [*TINY, "train.steps=4", "run.save_every=2", "train.micro_batch_size=3",
                        "train.gradient_checkpointing=true", f"run.out_dir={resumed}"])
    _close(_weights(one), _weights(resumed))


def test_sharded_checkpoints_resume_on_more_processes_and_export(tmp_path):
    """Checkpoints are written shard by shard (torch.distributed.checkpoint: each rank its own file, nothing
    gathered) and resharded on load: a one-process checkpoint resumes on 2 processes (the test above: 2 -> 1) to
    the uninterrupted run's weights, and `dare export` turns it into the model a 2-step run ends with, exactly."""
    one = train("sft", None, [*TINY, "train.steps=4", "run.save_every=2", f"run.out_dir={tmp_path / 'one'}"])
    ckpt = one / "checkpoints" / "step_0000002"
    assert len(list((ckpt / "dcp").glob("*.distcp"))) == 1 and not (ckpt / "model.safetensors").exists()
    resumed = tmp_path / "resumed"
    shutil.copytree(one / "checkpoints", resumed / "checkpoints")
    (resumed / "run.json").write_text(json.dumps({**json.loads((one / "run.json").read_text()), "status": "running"}))
    _torchrun(2, "train", "sft", *TINY, "train.steps=4", "run.save_every=2", f"run.out_dir={resumed}")
    assert [json.loads(x)["step"] for x in (resumed / "metrics.jsonl").read_text().splitlines()] == [3, 4]
    _close(_weights(one), _weights(resumed))
    r = subprocess.run([str(Path(sys.executable).parent / "dare"), "export", str(ckpt), "--to", str(tmp_path / "x")],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    two_steps = train("sft", None, [*TINY, "train.steps=2", f"run.out_dir={tmp_path / 'two_steps'}"])
    exported, expected = load_file(str(tmp_path / "x" / "model.safetensors")), _weights(two_steps)
    assert exported.keys() == expected.keys() and all(torch.equal(exported[k], expected[k]) for k in expected)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_sequence_parallel_training_matches_one_process(tmp_path, family):
    """train.sequence_parallel=2 on 2 processes (one data share, each process 1/2 of the positions; FSDP2
    over both): the same losses and weights as one process, for a bidirectional family and a block-causal
    one (its [x_t ; x_0] layout); the sequence lengths do not divide by 2 everywhere (padded inside)."""
    sp = [*TINY, "model.scratch.n_heads=4", "train.steps=3", "train.packing=false", f"model.family={family}"]
    one = train("sft", None, [*sp, f"run.out_dir={tmp_path / 'one'}"])
    _torchrun(2, "train", "sft", *sp, "train.sequence_parallel=2", f"run.out_dir={tmp_path / 'sp'}")
    assert json.loads((tmp_path / "sp" / "run.json").read_text())["world_size"] == 2
    assert _losses(tmp_path / "sp") == pytest.approx(_losses(one), rel=1e-5)
    _close(_weights(one), _weights(tmp_path / "sp"))


def test_sequence_parallel_rl_with_data_parallel_groups_matches_data_parallel_alone(tmp_path):
    """4 processes as 2 data shares x 2 sequence-parallel processes run d1 (rollouts whole, the update
    sequence-parallel) to the losses, rewards and weights of 2 plain data-parallel processes: the
    shares, seeds and batch totals are counted per share, not per process."""
    sft = train("sft", None, [*TINY, "model.scratch.n_heads=4", "train.steps=2", f"run.out_dir={tmp_path / 'sft'}"])
    d1 = ["d1", f"model.path={sft / 'final'}", *D1_TINY, "train.steps=2", "train.packing=false", "rl.eval_every=0"]
    _torchrun(2, "train", *d1, f"run.out_dir={tmp_path / 'dp'}")
    _torchrun(4, "train", *d1, "train.sequence_parallel=2", f"run.out_dir={tmp_path / 'dpsp'}", timeout=600)
    for key in ("loss/total", "rollout/reward_mean"):
        assert _losses(tmp_path / "dpsp", key) == pytest.approx(_losses(tmp_path / "dp", key), rel=1e-5, abs=1e-7)
    _close(_weights(tmp_path / "dp"), _weights(tmp_path / "dpsp"))


def test_sequence_parallel_refuses_what_it_cannot_split(tmp_path):
    with pytest.raises(ConfigError, match="set train.packing=false"):
        train("sft", None, [*TINY, "train.steps=2", "train.sequence_parallel=2", f"run.out_dir={tmp_path / 'a'}"])
    r = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "-m", "dare.app.cli",
                        "train", "sft", *TINY, "model.scratch.n_heads=1", "train.steps=2", "train.packing=false",
                        "train.sequence_parallel=2",
                        f"run.out_dir={tmp_path / 'b'}"], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode != 0 and "the model's attention heads ([1]) must divide by it" in r.stderr


def test_fsdp_bf16_lora_rl_runs_and_exports_merged(tmp_path):
    """2 processes, FSDP2 with bfloat16 mixed precision, LoRA on the sharded model, the adapter-
    disabled reference: a d1 run finishes and exports a merged plain checkpoint plus the adapter."""
    sft = train("sft", None, [*TINY, "train.steps=2", f"run.out_dir={tmp_path / 'sft'}"])
    out = tmp_path / "d1"
    _torchrun(2, "train", "d1", f"model.path={sft / 'final'}", *D1_TINY, "train.steps=2", "rl.num_iterations=2",
              "model.dtype=bfloat16", "model.lora.rank=4", "run.save_every=1", "rl.eval_every=2",
              "rl.eval_samples=8", f"run.out_dir={out}")
    assert (out / "final" / "adapter" / "adapter_model.safetensors").is_file()
    # the checkpoint is sharded (each rank wrote its own file of the adapter and optimizer state), and exports
    ckpt = out / "checkpoints" / "step_0000001"
    assert len(list((ckpt / "dcp").glob("*.distcp"))) == 2 and not (ckpt / "model.safetensors").exists()
    info = json.loads((ckpt / "checkpoint.json").read_text())
    assert info["lora"]["rank"] == 4 and info["fingerprint"]["hardware"]["cpu_capability"]
    from dare.train.checkpoint import export_checkpoint

    exported = export_checkpoint(ckpt)
    assert (exported / "adapter" / "adapter_model.safetensors").is_file()
    assert load_file(str(exported / "model.safetensors")).keys() == _weights(sft).keys()
    merged = _weights(out)
    assert merged.keys() == _weights(sft).keys() and all(v.dtype == torch.float32 for v in merged.values())
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(math.isfinite(r["loss/total"]) for r in records)
    assert "val/accuracy" not in records[0] and 0 <= records[1]["val/accuracy"] <= 1  # collective validation


def test_fsdp_two_processes_run_tracerl_with_its_value_model(tmp_path):
    """The value model's collectives under FSDP2 over gloo (its forward and backward, the companion
    checkpoint's shards, the export): a 2-process TraceRL run with micro-batches finishes, writes
    `step_1/value/` and `<run>/value/`, and its checkpoint resumes in one process. (A model this
    tiny rarely solves a sum, so its rewards and the value targets may all be 0: this checks the
    distributed plumbing; tests/test_value_model.py checks the training itself.)"""
    sft = train("sft", None, [*TINY, "model.family=sdar", "train.steps=2", f"run.out_dir={tmp_path / 'sft'}"])
    args = [f"model.path={sft / 'final'}", "model.family=sdar", *D1_TINY, "train.steps=2", "rl.num_iterations=2",
            "algo.value_model=true",
            "algo.filter_low=0", "algo.filter_high=1", "train.micro_batch_size=5", "run.save_every=1"]
    _torchrun(2, "train", "tracerl", *args, f"run.out_dir={tmp_path / 'two'}")
    two = tmp_path / "two"
    assert len(list((two / "checkpoints" / "step_0000001" / "value" / "dcp").glob("*.distcp"))) == 2  # sharded
    assert "value_head.weight" in _weights(two, "value")
    records = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(math.isfinite(r["value/loss"]) for r in records)
    resumed = tmp_path / "resumed"
    shutil.copytree(two / "checkpoints" / "step_0000001", resumed / "checkpoints" / "step_0000001")
    (resumed / "run.json").write_text(json.dumps({**json.loads((two / "run.json").read_text()), "status": "running"}))
    train("tracerl", None, [*args, f"run.out_dir={resumed}"])
    assert [json.loads(x)["step"] for x in (resumed / "metrics.jsonl").read_text().splitlines()] == [2]


def test_micro_batches_and_checkpointing_do_not_change_the_step(tmp_path):
    """Losses are normalized by the step's totals, so accumulating over micro-batches (with
    gradient checkpointing) gives the whole-batch gradient."""
    whole = train("sft", None, [*TINY, "train.steps=3", f"run.out_dir={tmp_path / 'whole'}"])
    parts = train("sft", None, [*TINY, "train.steps=3", "train.micro_batch_size=5", "train.gradient_checkpointing=true",
                                f"run.out_dir={tmp_path / 'parts'}"])
    _close(_weights(whole), _weights(parts))
    assert _losses(parts) == pytest.approx(_losses(whole), rel=1e-5)


def test_rl_micro_batches_match_the_whole_batch(tmp_path):
    sft = train("sft", None, [*TINY, "train.steps=2", f"run.out_dir={tmp_path / 'sft'}"])
    # the same loss path on both sides (full logits): AdamW turns float32 rounding differences of near-zero
    # gradients into steps of the learning rate's size, so two loss paths that agree to rounding (the fused loss
    # against full logits: tests/test_fused_loss.py) cannot be compared by their weights after training
    common = [f"model.path={sft / 'final'}", *D1_TINY, "train.steps=2", "rl.num_iterations=2", "train.logit_chunk=0"]
    whole = train("d1", None, [*common, f"run.out_dir={tmp_path / 'whole'}"])
    parts = train("d1", None, [*common, "train.micro_batch_size=3", "train.packing=false",
                               f"run.out_dir={tmp_path / 'parts'}"])
    _close(_weights(whole), _weights(parts), atol=1e-5)
    assert _losses(parts, "loss/kl") == pytest.approx(_losses(whole, "loss/kl"), rel=1e-4, abs=1e-7)


@pytest.mark.slow
def test_ray_worker_group_of_two_runs_an_rl_step(tmp_path):
    """`dare train d1 --workers 2`: a local Ray cluster, two actors forming a gloo process group
    with FSDP2; one RL step (rollout, rewards, reference log-probs, update) completes."""
    sft = train("sft", None, [*TINY, "train.steps=2", f"run.out_dir={tmp_path / 'sft'}"])
    out = tmp_path / "d1"
    exe = Path(sys.executable).parent / "dare"
    r = subprocess.run([str(exe), "train", "d1", f"model.path={sft / 'final'}", *D1_TINY, "train.steps=1",
                        f"run.out_dir={out}", "--workers", "2"], capture_output=True, text=True, timeout=300,
                       cwd=REPO, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "done" and status["world_size"] == 2
    (record,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and record["rollout/response_tokens"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(_weights(sft).values(), _weights(out).values()))


# ---------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------


def test_lora_trains_the_adapter_and_exports_a_merged_model(tmp_path):
    from peft import PeftModel

    from dare.models import load_pretrained, token_logits

    base_run = train("sft", None, [*TINY, "train.steps=2", f"run.out_dir={tmp_path / 'base'}"])
    lora = train("sft", None, [*TINY, f"model.path={base_run / 'final'}", "train.steps=3", "train.lr=1e-2",
                               "model.lora.rank=4", "model.lora.alpha=8", f"run.out_dir={tmp_path / 'lora'}"])
    final = lora / "final"
    assert (final / "adapter" / "adapter_config.json").is_file()
    base, merged = _weights(base_run), _weights(lora)
    assert base.keys() == merged.keys()  # a plain checkpoint, base names only
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    # only the family's declared targets inside the blocks moved (never embeddings, norms or the head)
    assert changed and all(re.fullmatch(r".*\.blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)"
                                        r"\.weight", k) for k in changed), changed
    # peft's own merge of the saved adapter gives the same model
    peft_model = PeftModel.from_pretrained(load_pretrained(base_run / "final"), str(final / "adapter"))
    ids = torch.randint(3, peft_model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    want = token_logits(peft_model, ids)
    torch.testing.assert_close(token_logits(load_pretrained(final), ids), want, atol=1e-5, rtol=1e-5)
    reference = peft_model.merge_and_unload().state_dict()
    _close({k: reference[k] for k in merged}, merged, atol=1e-6)


def test_lora_resume_reaches_identical_adapter(tmp_path):
    base_run = train("sft", None, [*TINY, "train.steps=2", f"run.out_dir={tmp_path / 'base'}"])
    args = [*TINY, f"model.path={base_run / 'final'}", "train.steps=4", "train.lr=1e-2", "model.lora.rank=4",
            "model.lora.dropout=0.1", "run.save_every=2"]
    a = train("sft", None, [*args, f"run.out_dir={tmp_path / 'a'}"])
    ckpt = a / "checkpoints" / "step_0000002"  # the adapter only (frozen base weights are not checkpointed)
    assert json.loads((ckpt / "checkpoint.json").read_text())["lora"]["rank"] == 4
    from torch.distributed.checkpoint import FileSystemReader

    keys = [k for k in FileSystemReader(str(ckpt / "dcp")).read_metadata().state_dict_metadata if k.startswith("model.")]
    assert keys and all(".lora_" in k for k in keys)
    b = tmp_path / "b"
    shutil.copytree(a / "checkpoints", b / "checkpoints")
    (b / "run.json").write_text(json.dumps({**json.loads((a / "run.json").read_text()), "status": "running"}))
    train("sft", None, [*args, f"run.out_dir={b}"])
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # bitwise, dropout RNG included


def test_lora_rl_uses_the_adapter_disabled_base_as_reference(tmp_path, monkeypatch):
    """No frozen copy is made; at the first update the policy IS the base (LoRA's B starts at 0),
    so the KL to the reference is exactly 0, and positive once the adapter has moved. (Rewards
    alternate 1/0 within each group so that the barely trained model gets a gradient.)"""
    import copy

    from dare.data import TASKS

    monkeypatch.setattr(TASKS["addition"], "rewards", lambda texts, rows, style="default": [
        float(i % 2) for i in range(len(texts))])

    copies = []
    real = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda x, *a: (
        copies.append(type(x).__name__) if isinstance(x, torch.nn.Module) else None) or real(x, *a))
    sft = train("sft", None, [*TINY, "train.steps=2", f"run.out_dir={tmp_path / 'sft'}"])
    copies.clear()
    out = train("d1", None, [f"model.path={sft / 'final'}", *D1_TINY, "train.steps=2", "model.lora.rank=4",
                             "rl.num_iterations=1", "algo.beta=0.5", f"run.out_dir={tmp_path / 'd1'}"])
    assert not copies, copies  # no module copied (a config's defaults are copied: `dare.config.recipe`)
    kls = _losses(out, "loss/kl")
    assert kls[0] == 0.0 and kls[1] > 0.0


def test_rollout_options_hook_records_trajectories(tmp_path, monkeypatch):
    """An algorithm that needs the decoding trajectory (CJ-GRPO, TraceRL, ...) asks for it with
    `rollout_options`; the loop passes it to the rollout and the batch carries it row-major."""
    from baselines.d1 import algorithm as d1

    sft = train("sft", None, [*TINY, "train.steps=2", f"run.out_dir={tmp_path / 'sft'}"])
    seen = []
    real = d1.token_logps

    def spy(model, batch, noise, cfg):
        seen.append(batch)
        return real(model, batch, noise, cfg)

    monkeypatch.setattr(d1, "rollout_options", lambda cfg: {"record": ("states",)}, raising=False)
    monkeypatch.setattr(d1, "token_logps", spy)
    train("d1", None, [f"model.path={sft / 'final'}", *D1_TINY, "train.steps=1", "rl.num_iterations=2",
                       "train.micro_batch_size=5", f"run.out_dir={tmp_path / 'd1'}"])
    for batch in seen:
        B, steps, G = batch.trajectory.shape
        assert B == batch.sequences.shape[0] and G == batch.responses.shape[1] and steps == 4
        assert torch.equal(batch.trajectory[:, -1], batch.responses)  # the last state is the response
    assert sorted(b.sequences.shape[0] for b in seen[:4]) == [1, 5, 5, 5]  # 16 rows in micro-batches of 5
    assert all(b.num_sequences == 16 for b in seen)


# ---------------------------------------------------------------------------------------------
# Bad configs fail before any model is built
# ---------------------------------------------------------------------------------------------


def test_group_size_one_is_refused_for_every_rl_baseline():
    """One rule in RLConfig, not a check_config copy per baseline: every RL baseline's advantages are relative to
    its group, so a group of one leaves nothing to learn from."""
    from dare.app import baselines

    rl = [name for name in baselines.names() if baselines.load(name).algorithm.RECIPE == "rl"]
    assert len(rl) >= 17
    refused = r"rl.group_size: must be >= 2.*\[rl.group_size=1 \(from command line\)\]"
    for name in rl:
        with pytest.raises(ConfigError, match=refused):
            resolve(name, None, ["rl.group_size=1"])


def test_std_scaling_needs_two_completions():
    from dare.train.objectives import group_advantages

    with pytest.raises(ValueError, match="std scaling need at least 2"):
        group_advantages(torch.tensor([[1.0], [0.0]]), "mean", "sample")
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    assert group_advantages(r, "loo")[0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert group_advantages(r, "mean", "population", eps=0).tolist() == [[1.0, -1.0, -1.0, 1.0]]


@pytest.mark.parametrize("setting, per_step", [("per_update", 2), ("once", 1)])
def test_the_number_of_noise_draws_comes_from_the_config(setting, per_step, sft_checkpoint, tmp_path, monkeypatch):
    """rl.noise_draws: a fresh draw for each of the mu updates (d1's random masking, the default: its config hash
    is the one before the option existed) or one draw for all (d1's fixed-masking ablation)."""
    from baselines.d1 import algorithm as d1
    from dare.config import config_hash

    calls = []
    real = d1.sample_noise
    monkeypatch.setattr(d1, "sample_noise", lambda *a: calls.append(1) or real(*a))
    train("d1", None, [f"model.path={sft_checkpoint('llada')}", *D1_TINY, "train.steps=2", "rl.num_iterations=2",
                       f"rl.noise_draws={setting}", "rl.diag_every=0", f"run.out_dir={tmp_path}"])
    assert len(calls) == 2 * per_step
    hashes = {config_hash(resolve("d1", None, over)[1]) for over in ([], ["rl.noise_draws=per_update"])}
    assert len(hashes) == 1 and config_hash(resolve("d1", None, ["rl.noise_draws=once"])[1]) not in hashes


def test_an_algorithm_can_forbid_inner_iterations(monkeypatch):
    """`check_config` is the plug-in's hook for its own rules (here: mu must be 1)."""
    from baselines.d1 import algorithm as d1

    def one_update_only(cfg):
        if cfg.rl.num_iterations != 1:
            raise ValueError(f"rl.num_iterations={cfg.rl.num_iterations}: this objective takes one update per batch")

    monkeypatch.setattr(d1, "check_config", one_update_only, raising=False)
    with pytest.raises(ConfigError, match="rl.num_iterations=4: this objective takes one update"):
        resolve("d1", None, ["rl.num_iterations=4"])
    resolve("d1", None, ["rl.num_iterations=1"])


def test_missing_metric_sink_is_a_clear_error(tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed here")
    with pytest.raises(UserError, match="'tensorboard' package is not installed"):
        train("sft", None, [*TINY, "train.steps=2", "run.report_to=[tensorboard]", f"run.out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="unknown metric sink"):
        resolve("sft", None, ["run.report_to=[mlflow]"])


# ---------------------------------------------------------------------------------------------
# The preference recipe (with the vrpo baseline)
# ---------------------------------------------------------------------------------------------


def test_preference_recipe_shares_noise_between_policy_and_reference(tmp_path, monkeypatch):
    """VRPO's antithetic sampling by construction: the reference and the policy ELBOs of a
    micro-batch are computed on the very same timesteps and masks; pairs are never split."""
    from baselines.vrpo import algorithm as vrpo

    sft = train("sft", None, [*TINY, "train.steps=2", f"run.out_dir={tmp_path / 'sft'}"])
    calls = []
    real = vrpo.logps

    def spy(model, batch, noise, cfg):
        calls.append((torch.is_grad_enabled(), noise, batch.input_ids.shape))
        return real(model, batch, noise, cfg)

    monkeypatch.setattr(vrpo, "logps", spy)
    out = train("vrpo", None, [f"model.path={sft / 'final'}", "data.task=addition_pairs", "train.steps=2",
                               "train.batch_size=6", "train.micro_batch_size=4", "train.lr=1e-3",
                               "train.warmup_steps=0", "algo.n_t=2", "run.log_every=1", "algo.memory_bounded=false",
                               f"run.out_dir={tmp_path / 'vrpo'}"])
    assert [grad for grad, _, _ in calls] == [False, True, False, True] * 2  # ref then policy, 2 micro x 2 steps
    for (_, ref_noise, shape), (_, pol_noise, _) in zip(calls[::2], calls[1::2]):
        assert shape[1] == 2  # (pairs, [chosen, rejected], L)
        assert torch.equal(ref_noise.masked, pol_noise.masked) and torch.equal(ref_noise.t, pol_noise.t)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # step 1: policy == reference, so the DPO term is exactly log 2 per pair
    assert records[0]["loss/dpo"] == pytest.approx(0.6931471805599453, abs=1e-6)
    assert records[1]["loss/dpo"] != pytest.approx(0.6931471805599453, abs=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(_weights(sft).values(), _weights(out).values()))


def test_vrpo_memory_bounded_backward_gives_the_same_loss_and_gradient(tmp_path):
    """VRPO's policy ELBO backpropagated one timestep's draw at a time (`draw_parts` -> the recipe's
    `replayed_loss`) against all n_t graphs at once: the same loss, the same gradient of every weight."""
    from baselines.vrpo import algorithm as vrpo
    from dare.config import ModelConfig, ScratchModelConfig, TrainConfig
    from dare.models import facts, new_model
    from dare.models.tokenizer import char_tokenizer
    from dare.train.hooks import bind
    from dare.train.preference import preference_batch, replayed_loss
    from dare.train.dist import Dist
    from dare.train.trainer import Trainer

    tok = char_tokenizer("0123456789+=", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_hidden_size=64), 0)
    f = facts(model)
    batch = preference_batch([[5, 6, 10], [7, 11]], [[[3, 4, 2], [1]], [[3, 3], [2, 2, 9]]], f.eos_token_id,
                             f.pad_token_id)
    ref = torch.tensor([[-6.0, -7.0], [-3.0, -5.0]])
    grads, losses = [], []
    for bounded in (False, True):
        cfg = run_config("vrpo", n_t=4, memory_bounded=bounded)
        draw = vrpo.sample_noise(batch, torch.Generator().manual_seed(0), cfg)
        trainer = Trainer(model, ModelConfig(), TrainConfig(), Dist(), 1)
        parts = vrpo.draw_parts(draw, cfg)
        if parts is None:
            loss, _ = vrpo.loss(vrpo.logps(model, batch, draw, cfg), ref, batch, draw, cfg)
            loss.backward()
        else:
            assert len(parts) == 4
            loss, _ = replayed_loss(trainer, bind(vrpo), batch, draw, parts, ref, cfg)
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-6, rtol=1e-5, msg=name)


def test_vrpo_update_memory_is_flat_in_the_number_of_draws():
    """`dare bench train`'s VRPO row on a small model (fresh processes, peak resident memory above the start of the
    update): all graphs alive grows with n_t (79 -> 285 MiB from 2 to 8 draws when measured), one draw at a time
    stays flat (47 -> 59 MiB), the loss and gradient unchanged."""
    from dare.app.bench import vrpo_memory

    mem = vrpo_memory((2, 8), pairs=2, length=128, width=128)
    assert mem["8"]["bounded_mib"] < 1.5 * mem["2"]["bounded_mib"]
    assert mem["8"]["full_mib"] > 3 * mem["8"]["bounded_mib"]
    assert all(r["loss_difference"] < 1e-6 and r["grad_norm_difference"] < 1e-5 for r in mem.values())


def test_vrpo_loss_hand_computed():
    from types import SimpleNamespace

    from baselines.vrpo import algorithm as vrpo

    cfg = run_config("vrpo", beta=0.5, sft_weight=0.1)
    policy = torch.tensor([[-3.0, -5.0], [-2.0, -1.0]])
    ref = torch.tensor([[-4.0, -4.0], [-2.0, -2.0]])
    resp = torch.zeros(2, 2, 6, dtype=torch.bool)
    resp[0, 0, :3] = True
    resp[1, 0, :2] = True
    batch = SimpleNamespace(response_mask=resp, num_pairs=2)
    loss, m = vrpo.loss(policy, ref, batch, None, cfg)
    margins = [0.5 * ((-3 + 4) - (-5 + 4)), 0.5 * ((-2 + 2) - (-1 + 2))]  # 1.0 and -0.5
    dpo = [math.log1p(math.exp(-x)) for x in margins]
    sft = [3.0 / 3, 2.0 / 2]
    assert loss.item() == pytest.approx((dpo[0] + 0.1 * sft[0] + dpo[1] + 0.1 * sft[1]) / 2, rel=1e-6)
    assert m["rewards/accuracy"] == 0.5
    same, _ = vrpo.loss(ref, ref, batch, None, run_config("vrpo", sft_weight=0.0))
    assert same.item() == pytest.approx(math.log(2))  # policy == reference


def test_vrpo_noise_is_stratified_and_never_masks_the_prompt():
    from types import SimpleNamespace

    from baselines.vrpo import algorithm as vrpo

    resp = torch.zeros(64, 2, 12, dtype=torch.bool)
    resp[..., 5:] = True
    batch = SimpleNamespace(input_ids=torch.zeros(64, 2, 12, dtype=torch.long), response_mask=resp)
    z = vrpo.sample_noise(batch, torch.Generator().manual_seed(0), run_config("vrpo", n_t=4))
    t = z.t
    for j in range(4):  # one timestep in each stratum [j/4, (j+1)/4)
        assert ((t[..., j] >= j / 4) & (t[..., j] < (j + 1) / 4 + 1e-9)).all()
    assert not z.masked[..., :5].any()
    rate = z.masked[..., 5:].float().mean(dim=(0, 1, 3))
    assert torch.allclose(rate, torch.tensor([0.125, 0.375, 0.625, 0.875]), atol=0.05)


def test_reference_sync_mixes_the_policy_into_the_reference_every_n_steps():
    """TRL's SyncRefModelCallback (coupled-GRPO's `sync_ref_model`, every 64 steps, alpha 0.6):
    after optimizer steps N, 2N, ... ref <- (1 - a) ref + a policy; in between it is untouched."""
    from dare.config import ModelConfig, ScratchModelConfig, TrainConfig
    from dare.models import new_model
    from dare.models.tokenizer import char_tokenizer
    from dare.train.dist import Dist
    from dare.train.trainer import Trainer

    tok = char_tokenizer("0123456789+=", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=16, n_heads=2, n_layers=1, mlp_hidden_size=32), 0)
    cfg = TrainConfig(steps=4, lr=0.1, max_grad_norm=0, reference_sync_every=2, reference_mix=0.6)
    trainer = Trainer(model, ModelConfig(), cfg, Dist(), total_steps=4, reference=True)
    start = {n: p.detach().clone() for n, p in trainer.ref.named_parameters()}

    def step():
        loss = sum((p ** 2).sum() for p in trainer.model.parameters())
        trainer.backward(loss)
        trainer.step()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    step()
    for n, p in trainer.ref.named_parameters():
        assert torch.equal(p, start[n])  # step 1: untouched
    policy2 = step()
    expected = {n: 0.4 * start[n] + 0.6 * policy2[n] for n in start}
    for n, p in trainer.ref.named_parameters():
        torch.testing.assert_close(p, expected[n], rtol=0, atol=1e-7)
    step()
    policy4 = step()
    for n, p in trainer.ref.named_parameters():
        torch.testing.assert_close(p, 0.4 * expected[n] + 0.6 * policy4[n], rtol=0, atol=1e-7)
    with pytest.raises(ConfigError, match=r"train.reference_sync_every=2 \(from command line\) with "
                                          r"model.lora.rank=4: under LoRA"):
        resolve("coupled_grpo", None, ["model.lora.rank=4", "train.reference_sync_every=2"])


def test_coupled_grpo_syncs_its_reference_as_diffucoders_config():
    from baselines.coupled_grpo.config import Config

    train_cfg = Config().train
    assert (train_cfg.reference_sync_every, train_cfg.reference_mix) == (64, 0.6)
