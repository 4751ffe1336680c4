"""Where the trained model's tensors live and in which dtype: a LoRA run in bfloat16 keeps its frozen base in
bfloat16 (no per-forward cast of the base), with float32 adapters and optimizer state."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

from dare.app.runs import train
from dare.config import LoraConfig, ModelConfig, ScratchModelConfig, TrainConfig
from dare.models import new_model, token_logits
from dare.models.tokenizer import char_tokenizer
from dare.train.dist import Dist
from dare.train.trainer import Trainer

TINY = ["model.scratch.d_model=32", "model.scratch.n_heads=2", "model.scratch.n_layers=2",
        "model.scratch.mlp_hidden_size=64", "train.batch_size=16", "train.lr=1e-3", "train.warmup_steps=2",
        "algo.response_length=4", "run.log_every=1", "run.threads=1"]


def _losses(run_dir, key="loss/total"):
    return [json.loads(x)[key] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _float32_base(monkeypatch):
    """The path before the bf16 base: a float32 base that autocast casts on every forward."""
    import dare.train.loop
    import dare.train.trainer

    monkeypatch.setattr(dare.train.trainer, "bf16_base", lambda model_cfg: False)
    monkeypatch.setattr(dare.train.loop, "bf16_base", lambda model_cfg: False)


class CastsOf(TorchDispatchMode):
    """Counts the dtype casts and copies (`_to_copy`, `copy_`) that read any of `tensors`' storage."""

    def __init__(self, tensors):
        super().__init__()
        self.storages = {t.untyped_storage().data_ptr() for t in tensors}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            self.count += sum(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in self.storages
                              for a in args)
        return func(*args, **(kwargs or {}))


def _lora_trainer(dtype="bfloat16"):
    tok = char_tokenizer("0123456789+=", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=32, n_heads=2, n_layers=2, mlp_hidden_size=64), 0)
    model_cfg = ModelConfig(dtype=dtype, lora=LoraConfig(rank=4, alpha=8))
    return Trainer(model, model_cfg, TrainConfig(steps=2, lr=1e-2), Dist(), total_steps=2)


def _forward_backward(trainer, ids):
    with trainer.autocast():
        loss = token_logits(trainer.model, ids).float().logsumexp(-1).mean()
    trainer.backward(loss)


def test_bf16_lora_base_is_never_cast_and_trains_float32_adapters():
    trainer = _lora_trainer()
    frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    assert frozen and trained
    assert {p.dtype for p in frozen} == {torch.bfloat16} and {p.dtype for p in trained} == {torch.float32}
    ids = torch.randint(3, 12, (2, 9), generator=torch.Generator().manual_seed(0))
    with CastsOf(frozen) as casts:
        _forward_backward(trainer, ids)
        with torch.no_grad(), trainer.reference() as ref:
            token_logits(ref, ids)
    assert casts.count == 0
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trained)
    trainer.step()
    moments = [v for state in trainer.optimizer.state.values() for k, v in state.items() if k != "step"]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    assert {p.dtype for p in trained} == {torch.float32} and {p.dtype for p in frozen} == {torch.bfloat16}


def test_the_cast_counter_sees_autocast_casting_a_float32_base(monkeypatch):
    """The check above can fail: the float32 base that autocast casts is counted."""
    _float32_base(monkeypatch)
    trainer = _lora_trainer()
    frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
    assert {p.dtype for p in frozen} == {torch.float32}
    with CastsOf(frozen) as casts:
        _forward_backward(trainer, torch.randint(3, 12, (2, 9)))
    assert casts.count > 0


def test_bf16_lora_sft_matches_the_float32_base_and_exports(tmp_path, monkeypatch):
    """A LoRA SFT run in bfloat16 on a bf16 base: losses and the merged export equal those of the float32
    base cast by autocast within bf16 rounding (the base weights autocast used were those rounded to bf16
    already; the norms and embeddings now are too)."""
    base = train("sft", None, [*TINY, "train.steps=2", f"run.out_dir={tmp_path / 'base'}"])
    args = [*TINY, f"model.path={base / 'final'}", "train.steps=3", "train.lr=1e-2", "model.dtype=bfloat16",
            "model.lora.rank=4", "model.lora.alpha=8"]
    new = train("sft", None, [*args, f"run.out_dir={tmp_path / 'bf16'}"])
    with monkeypatch.context() as m:
        _float32_base(m)
        old = train("sft", None, [*args, f"run.out_dir={tmp_path / 'fp32'}"])
    assert _losses(new) == pytest.approx(_losses(old), rel=5e-3)
    a, b = load_file(str(new / "final" / "model.safetensors")), load_file(str(old / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k].float(), b[k].float(), atol=1e-2, rtol=1e-2)
    adapter = load_file(str(new / "final" / "adapter" / "adapter_model.safetensors"))
    assert adapter and {t.dtype for t in adapter.values()} == {torch.float32}


# ---------------------------------------------------------------------------------------------
# A full fine-tune on one device: bf16 weights and gradients, float32 master and moments on the CPU
# ---------------------------------------------------------------------------------------------


def test_offloaded_adamw_steps_its_float32_master_exactly_as_plain_adamw():
    """Given the same gradients (bf16-exact, as the device's are), the master weights, the moments and the
    gradient norm equal plain float32 AdamW's bit for bit, and the device's weights are the master's in bf16."""
    tok = char_tokenizer("0123456789+=", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=32, n_heads=2, n_layers=2, mlp_hidden_size=64), 0)
    cfg = TrainConfig(steps=3, lr=1e-2, weight_decay=0.1, warmup_steps=2, max_grad_norm=1.0)
    plain = Trainer(model, ModelConfig(), cfg, Dist(), total_steps=3)
    import copy
    from dataclasses import replace

    offload = Trainer(copy.deepcopy(model), ModelConfig(dtype="bfloat16"), replace(cfg, optimizer="adamw_offload"),
                      Dist(), total_steps=3)
    assert {p.dtype for p in offload.model.parameters()} == {torch.bfloat16}
    assert {(p.dtype, p.device.type) for p in offload.master.parameters()} == {(torch.float32, "cpu")}
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p, q in zip(plain.model.parameters(), offload.model.parameters(), strict=True):
            g = (torch.randn(p.shape, generator=generator) * 0.3).to(torch.bfloat16)
            p.grad, q.grad = g.float(), g
        assert plain.step() == offload.step()
        for p, m, q in zip(plain.model.parameters(), offload.master.parameters(), offload.model.parameters()):
            assert torch.equal(p, m) and torch.equal(p.to(torch.bfloat16), q)
            assert q.grad is None and m.grad is None
    states = list(plain.optimizer.state.values()), list(offload.optimizer.state.values())
    assert len(states[0]) == len(states[1]) > 0
    for a, b in zip(*states):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
        assert b["exp_avg"].dtype == torch.float32 and b["exp_avg"].device.type == "cpu"


def test_offloaded_adamw_sft_matches_plain_adamw_and_resumes_exactly(tmp_path):
    import shutil

    args = [*TINY, "train.steps=4", "model.dtype=bfloat16", "run.save_every=2"]
    plain = train("sft", None, [*args, f"run.out_dir={tmp_path / 'plain'}"])
    a = train("sft", None, [*args, "train.optimizer=adamw_offload", f"run.out_dir={tmp_path / 'a'}"])
    assert _losses(a) == pytest.approx(_losses(plain), rel=1e-2)
    wa, wp = load_file(str(a / "final" / "model.safetensors")), load_file(str(plain / "final" / "model.safetensors"))
    assert {t.dtype for t in wa.values()} == {torch.float32}  # the master copy is exported
    for k in wp:
        torch.testing.assert_close(wa[k], wp[k], atol=1e-2, rtol=1e-2)
    b = tmp_path / "b"  # resumed from step 2: the checkpoint holds the master weights and the moments
    shutil.copytree(a / "checkpoints", b / "checkpoints")
    assert [c.name for c in (b / "checkpoints").iterdir()] == ["step_0000002"]
    (b / "run.json").write_text(json.dumps({**json.loads((a / "run.json").read_text()), "status": "running"}))
    train("sft", None, [*args, "train.optimizer=adamw_offload", f"run.out_dir={b}"])
    assert [json.loads(x)["step"] for x in (b / "metrics.jsonl").read_text().splitlines()] == [3, 4]
    wb = load_file(str(b / "final" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_offloaded_adamw_is_refused_where_it_cannot_apply():
    from dare.app.runs import resolve
    from dare.config import ConfigError
    from dare.utils import UserError

    with pytest.raises(ConfigError, match=r"train.optimizer=adamw_offload \(from command line\) with "
                                          r"model.dtype=float32: .*set model.dtype=bfloat16"):
        resolve("sft", None, ["train.optimizer=adamw_offload"])
    with pytest.raises(ConfigError, match=r"with model.lora.rank=4: LoRA"):
        resolve("sft", None, ["train.optimizer=adamw_offload", "model.dtype=bfloat16", "model.lora.rank=4"])
    tok = char_tokenizer("0123456789+=", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=16, n_heads=2, n_layers=1, mlp_hidden_size=32), 0)
    with pytest.raises(UserError, match="trains on one process"):
        Trainer(model, ModelConfig(dtype="bfloat16"), TrainConfig(optimizer="adamw_offload"), Dist(world=2), 1)
