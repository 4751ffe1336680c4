"""`dare plan`: the planner against measured peaks on the CPU (two float32 training steps of LLaDAs of several
sizes, with and without gradient checkpointing, in a fresh process each), its arithmetic, and the command."""

from __future__ import annotations

import pytest
import torch

from dare.app import probes
from dare.app.cli import main
from dare.app.probes.train_memory import config
from dare.models.llada import LLaDAModelLM
from dare.train import plan as planner


@pytest.mark.parametrize("d_model, layers, batch, length, checkpointing", [
    (256, 4, 4, 512, 0), (512, 6, 4, 512, 0), (512, 6, 4, 512, 1)])
def test_the_planned_update_peak_is_within_15_percent_of_the_measured_one(d_model, layers, batch, length,
                                                                          checkpointing):
    vocab = 32000
    cfg = config(d_model, layers, vocab)
    with torch.device("meta"):
        model = LLaDAModelLM(cfg)
    per_token, per_forward = planner.layer_activation_bytes(LLaDAModelLM, cfg, "float32")
    plan = planner.plan_training(planner.shapes_of(model), per_token, per_forward, dtype="float32",
                                 micro_batch=batch, length=length, scored=length // 2,
                                 gradient_checkpointing=bool(checkpointing), device="cpu")
    measured = probes.run("train_memory", d_model, layers, batch, length, vocab, checkpointing)["peak_kib"] * 1024
    assert abs(plan.peak("update") / measured - 1) <= 0.15, (plan.peak("update"), measured)


def test_activations_are_counted_per_token_and_grow_with_the_layer_widths():
    small, _ = planner.layer_activation_bytes(LLaDAModelLM, config(128, 2, 1000), "float32")
    large, _ = planner.layer_activation_bytes(LLaDAModelLM, config(256, 2, 1000), "float32")
    assert len(small) == 2 and small[0] == small[1] > 0
    assert 1.8 < large[0] / small[0] < 2.2  # every saved tensor is a multiple of the width here


def _shapes(**kw):
    base = dict(family="llada", params=8_000_000_000, layers=32, hidden=4096, vocab=126464, kv_heads=32,
                head_dim=128, largest_layer=218_000_000, block_size=None, lora_params=335_000_000)
    return planner.Shapes(**{**base, **kw})


def test_the_arithmetic_of_each_mode():
    per_token = [200_000] * 32
    full = planner.plan_training(_shapes(), per_token, dtype="float32", device="cpu")
    items = dict(full.phases["update"])
    assert items["weights (float32 master)"] == 32e9 and items["gradients (float32)"] == 32e9
    assert items["optimizer (AdamW moments)"] == 64e9
    lora = dict(planner.plan_training(_shapes(), per_token, lora=True, device="cpu").phases["update"])
    assert lora["weights (frozen base)"] == 16e9 and lora["optimizer (AdamW moments)"] == 335e6 * 8
    offload = dict(planner.plan_training(_shapes(), per_token, optimizer_offload=True, device="cpu").phases["update"])
    assert offload["weights (bfloat16; master on the CPU)"] == 16e9 and offload["optimizer (AdamW moments)"] == 0
    sharded = planner.plan_training(_shapes(), per_token, processes=8, rollout_rows=12, rollout_length=512,
                                    gather_rollout=True, device="cpu")
    rollout = dict(sharded.phases["rollout"])
    assert rollout["gathered model for the rollout"] == 16e9 and rollout["weights (float32 master)"] == 4e9
    masked = dict(planner.plan_training(_shapes(), per_token, length=512, device="cpu").phases["update"])
    block = dict(planner.plan_training(_shapes(block_size=4), per_token, length=512, device="cpu").phases["update"])
    assert block["activations"] > 1.9 * masked["activations"]  # [x_t ; x_0]: twice the length
    kept = dict(planner.plan_training(_shapes(), per_token, micro_batch=8, length=2048, fused_loss=False,
                                      device="cpu").phases["update"])
    assert kept["loss (every scored position's log-softmax)"] > 8 * 2048 * 126464 * 4  # the 8.3 GB of the issue


def test_dare_plan_prints_each_phase_and_what_would_make_a_run_fit(capsys):
    assert main(["plan", "d1", "model.path=/nowhere", "model.dtype=bfloat16", "train.gradient_checkpointing=true",
                 "train.micro_batch_size=6", "--released", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "rollout:" in out and "log-probs:" in out and "update:" in out and "fits: peak" in out
    assert main(["plan", "d1", "model.path=/nowhere", "--released", "--gpu-memory", "80"]) == 1  # full FT, fp32
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "train.gradient_checkpointing=true" in out


def test_dare_plan_without_a_model_says_what_to_give(capsys):
    assert main(["plan", "d1", "model.path=/nowhere"]) != 0
    assert "give --released" in capsys.readouterr().err
