"""The execution trainer every recipe trains through: processes, the wrapped model, the optimizer,
the reference model and the checkpoint format.

One code path from a laptop to a cluster; only the launch differs:

- one process (`dare train ...`), or several (`torchrun --nproc-per-node N -m dare.app.cli train ...`,
  `dare train ... --workers N` for a Ray worker group, or SLURM). Several processes form a torch
  process group (NCCL on GPU, gloo on CPU) and the model is sharded with FSDP2 (`fully_shard`
  on every decoder layer, the output head, then the root), which also makes them data parallel:
  each rank takes its contiguous slice of every batch.
- precision: float32, or bfloat16 mixed precision with float32 master weights (FSDP2's
  `MixedPrecisionPolicy` when sharded, `torch.autocast` otherwise; gradients reduce in float32).
- LoRA through peft on the family's declared target modules; the reference model is then the
  same network with the adapter disabled, otherwise a frozen copy (optionally kept on the CPU).
- gradient checkpointing of every decoder layer (non-reentrant).

Checkpoints hold full (unsharded) tensors written by rank 0: the model (`save_pretrained`, or
the peft adapter under LoRA), the optimizer and schedule, so a run can resume on another number
of processes. Losses are normalized by batch totals (see `dare.train.sft`/`rl`), and FSDP
averages gradients over ranks, so each rank's loss is multiplied by the world size before
backward (`Trainer.backward`).
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dare.utils import UserError
from dare.models import facts
from dare.models.tokenizer import save_tokenizer
from dare.utils import atomic_write, derive_seed

LORA_PREFIX = "base_model.model."


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> slice:
        """This rank's contiguous rows of an n-row batch (n divisible by the world size)."""
        k = n // self.world
        return slice(self.rank * k, (self.rank + 1) * k)

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Sum scalars over ranks (identity in one process)."""
        if self.world == 1 or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return dict(zip(keys, t.tolist()))

    def max(self, values: dict[str, float]) -> dict[str, float]:
        """The maximum of scalars over ranks (identity in one process)."""
        if self.world == 1 or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return dict(zip(keys, t.tolist()))

    def any(self, flag: bool) -> bool:
        return bool(self.sum({"f": float(flag)})["f"]) if self.world > 1 else flag

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def setup_dist() -> Dist:
    """Join the process group a launcher described in the environment (torchrun, Ray, SLURM set
    RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT); one process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world == 1:
        return Dist(0, 1, torch.device("cuda", 0) if cuda else torch.device("cpu"))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    return Dist(rank, world, torch.device("cuda", local) if cuda else torch.device("cpu"))


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------


class Trainer:
    """`model` as trained (peft / FSDP wrapped), its optimizer and schedule, and its reference."""

    def __init__(self, model, model_cfg, train_cfg, dist: Dist, total_steps: int, reference: bool = False,
                 seed: int = 0):
        from dare.train.common import lr_factor, make_optimizer

        self.dist, self.cfg = dist, train_cfg
        self.lora = model_cfg.lora.rank > 0
        self.bf16 = model_cfg.dtype == "bfloat16"
        model = model.to(dist.device)
        self.base = model  # the unwrapped transformers model (configs, save_pretrained)
        if train_cfg.gradient_checkpointing:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ref = None  # with LoRA the reference is the adapter-disabled base (no sync: config.check_across_sections)
        if reference and not self.lora:
            ref = copy.deepcopy(model).eval().requires_grad_(False)
            if train_cfg.reference_offload and dist.world == 1:
                ref.to("cpu")
        if self.lora:
            model = add_lora(model, model_cfg.lora, seed)
        if dist.world > 1:
            shard(model, self.bf16)
            if ref is not None:
                # FSDP's CPU offload needs an accelerator; on a CPU-only run everything is on the CPU already
                shard(ref, self.bf16, offload=train_cfg.reference_offload and dist.device.type != "cpu")
        self.model, self.ref = model, ref
        self.optimizer = make_optimizer(model, train_cfg)
        self.lr_scale = 1.0
        """A factor on the whole schedule: a guard's rollback halves it (`scale_lr`); checkpoints keep it."""
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, total_steps, train_cfg) * self.lr_scale)

    # --- compute
    def autocast(self):
        """bfloat16 compute around forwards when unsharded (FSDP casts parameters itself)."""
        if self.bf16 and self.dist.world == 1:
            return torch.autocast(self.dist.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.dist.world).backward()  # FSDP averages over ranks; losses are already batch-normalized

    def step(self) -> float:
        """Clip, step, schedule, zero; returns the gradient norm before clipping. A non-finite norm (a NaN or
        inf anywhere in the gradients, the same on every rank) skips the step: the gradients are dropped and
        the weights, the optimizer's moments and the schedule stay as they were."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        limit = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return float(norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        every = self.cfg.reference_sync_every
        if self.ref is not None and every and self.scheduler.last_epoch % every == 0:
            self.sync_reference(self.cfg.reference_mix)
        return float(norm)

    @torch.no_grad()
    def sync_reference(self, mix: float) -> None:
        """TR-DPO's update (TRL `SyncRefModelCallback`): ref <- (1 - mix) ref + mix policy, parameter
        by parameter (shard by shard under FSDP: both models are sharded alike)."""
        for ref_p, p in zip(self.ref.parameters(), self.model.parameters(), strict=True):
            ref_local = ref_p.to_local() if hasattr(ref_p, "to_local") else ref_p
            local = p.to_local() if hasattr(p, "to_local") else p
            ref_local.mul_(1.0 - mix).add_(local.to(ref_local.device, ref_local.dtype), alpha=mix)

    def scale_lr(self, factor: float) -> None:
        """Multiply the learning rate from now on (the schedule's factor, and the current step's rate)."""
        self.lr_scale *= factor
        for group, base, fn in zip(self.optimizer.param_groups, self.scheduler.base_lrs, self.scheduler.lr_lambdas):
            group["lr"] = base * fn(self.scheduler.last_epoch)
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    @contextlib.contextmanager
    def reference(self):
        """The reference policy: the LoRA-disabled base, or the frozen copy (moved to the device
        for the call when offloaded)."""
        if self.lora:
            with self.model.disable_adapter(), self.autocast():
                yield self.model
            return
        if self.ref is None:
            raise RuntimeError("this run was built without a reference model")
        offloaded = self.cfg.reference_offload and self.dist.world == 1 and self.dist.device.type != "cpu"
        if offloaded:
            self.ref.to(self.dist.device)
        try:
            with self.autocast():
                yield self.ref
        finally:
            if offloaded:
                self.ref.to("cpu")

    # --- state
    def _options(self, **kw):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=self.lora, **kw)

    def trainable_state(self) -> dict:
        """Full tensors of the trained parameters (all of them, or the LoRA adapter). Collective."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model, options=self._options())

    def optimizer_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return {"optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=self._options()),
                "scheduler": self.scheduler.state_dict(), "lr_scale": self.lr_scale}

    @property
    def moving_reference(self) -> bool:
        """The reference changes during training (TR-DPO sync), so checkpoints carry it."""
        return self.ref is not None and self.cfg.reference_sync_every > 0

    def save(self, folder: Path, tokenizer) -> None:
        """The weights of a checkpoint (rank 0 writes): a loadable model, or the peft adapter; and
        `reference.safetensors` when the reference is synced (it is no longer the initial model)."""
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = self.trainable_state()
        ref = get_model_state_dict(self.ref, options=self._options()) if self.moving_reference else None
        if not self.dist.main:
            return
        if self.lora:
            save_adapter(self.model, state, folder)
        else:
            save_model(self.base, tokenizer, folder, state_dict=state)
        if ref is not None:
            save_file({k: v.contiguous() for k, v in ref.items()}, str(Path(folder) / "reference.safetensors"))

    def load(self, folder: Path, state: dict) -> None:
        """Restore weights (from `save`) and optimizer/schedule (from `optimizer_state`)."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        if self.lora:
            weights = adapter_to_module_names(self.model, load_file(str(folder / "adapter_model.safetensors")))
        else:
            weights = load_file(str(folder / "model.safetensors"))
        expected = {n for n, p in self.model.named_parameters() if p.requires_grad or not self.lora}
        missing = sorted(expected - set(weights))
        if missing:
            raise RuntimeError(f"{folder}: checkpoint does not match the model (missing {missing[:5]})")
        set_model_state_dict(self.model, weights, options=self._options(strict=not self.lora))
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=self._options())
        self.lr_scale = state.get("lr_scale", 1.0)
        self.scheduler.load_state_dict(state["scheduler"])
        if self.moving_reference:
            if not (folder / "reference.safetensors").is_file():
                raise RuntimeError(f"{folder}: train.reference_sync_every is set but the checkpoint holds no "
                                   "reference.safetensors (it was written by a run without reference sync)")
            set_model_state_dict(self.ref, load_file(str(folder / "reference.safetensors")), options=self._options())

    def export(self, folder: Path, tokenizer, meta: dict) -> None:
        """The final model as a plain checkpoint any tool loads (LoRA merged into the weights,
        the adapter kept beside it in `adapter/`). Collective; rank 0 writes."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.dist.main:
            return
        if self.lora:
            save_adapter(self.model, {k: v for k, v in full.items() if ".lora_" in k}, Path(folder) / "adapter")
            full = merge_lora(full, self.model.peft_config["default"])
        save_model(self.base if not self.lora else self.model.get_base_model(), tokenizer, folder,
                   meta=meta, state_dict=full)


def shard(model, bf16: bool, offload: bool = False) -> None:
    """FSDP2: every decoder layer, the output head and the root are their own units."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    kw = {"offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy()}
    if bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    _, layers, _, _, _ = model.decoder_parts()
    for layer in layers:
        fully_shard(layer, **kw)
    fully_shard(model.get_output_embeddings(), **kw)
    fully_shard(model, **kw)


# ---------------------------------------------------------------------------------------------
# LoRA (peft)
# ---------------------------------------------------------------------------------------------


def add_lora(model, lora_cfg, seed: int = 0):
    """Wrap `model` in a peft LoRA model on the family's declared targets (or `lora.targets`). The
    adapters' random initialisation draws from the global RNG, forked and seeded from the run seed
    (the same run starts from the same adapters; the caller's RNG is left as it was)."""
    from peft import LoraConfig, get_peft_model

    targets = lora_cfg.targets or facts(model).lora_targets
    if not targets:
        raise UserError(f"{model.config.model_type}: the family declares no LoRA target modules; "
                        "set model.lora.targets")
    config = LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                        target_modules=targets, bias="none")
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(derive_seed(seed, "lora-init"))
        peft_model = get_peft_model(model, config)
    if not any(p.requires_grad for p in peft_model.parameters()):
        raise UserError(f"model.lora.targets={targets!r} matched no module of {model.config.model_type}")
    return peft_model


def adapter_to_module_names(model, adapter: dict) -> dict:
    """peft's saved adapter names (`...lora_A.weight`) -> the live module names (`...lora_A.default.weight`)."""
    live = {n.replace(".default", ""): n for n, p in model.named_parameters() if p.requires_grad}
    unknown = sorted(set(adapter) - set(live))
    if unknown:
        raise RuntimeError(f"adapter weights not in the model: {unknown[:5]}")
    return {live[k]: v for k, v in adapter.items()}


def save_adapter(model, state: dict, folder: Path) -> None:
    """A peft adapter folder (adapter_config.json + adapter_model.safetensors) from full tensors;
    `PeftModel.from_pretrained(base, folder)` loads it."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    adapter = get_peft_model_state_dict(model, state_dict=state)
    save_file({k: v.contiguous() for k, v in adapter.items()}, str(folder / "adapter_model.safetensors"))
    model.peft_config["default"].save_pretrained(str(folder))


def merge_lora(state: dict, lora_config) -> dict:
    """A peft model's full state dict -> the base model's, with W + (alpha / r) B A merged in
    (what `merge_and_unload` computes, on plain tensors so it also works on gathered FSDP shards)."""
    if lora_config.use_rslora or lora_config.use_dora:
        raise NotImplementedError("merging rsLoRA/DoRA adapters")
    scale = lora_config.lora_alpha / lora_config.r
    merged = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        name = key.removeprefix(LORA_PREFIX)
        if ".base_layer." in name:
            prefix, _, leaf = key.rpartition(".base_layer.")
            name = name.replace(".base_layer.", ".")
            if leaf == "weight":
                a, b = state[f"{prefix}.lora_A.default.weight"], state[f"{prefix}.lora_B.default.weight"]
                value = (value.float() + scale * (b.float() @ a.float())).to(value.dtype)
        merged[name] = value
    return merged


def save_model(model, tokenizer, folder: Path, meta: dict | None = None, state_dict: dict | None = None) -> None:
    import json

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(folder, state_dict=state_dict)
    save_tokenizer(tokenizer, folder)
    if meta is not None:
        atomic_write(Path(folder) / "dare.json", json.dumps(meta, indent=2) + "\n")
