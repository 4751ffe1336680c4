"""The execution trainer every recipe trains through: the wrapped model, the optimizer step, the
reference model, and saving through the checkpoint format (`dare.train.checkpoint`).

- several processes (`dare.train.dist`) shard the model with FSDP2 (`fully_shard` on every decoder layer,
  the output head, then the root), which also makes them data parallel.
- precision: float32, or bfloat16 mixed precision with float32 master weights (FSDP2's
  `MixedPrecisionPolicy` when sharded, `torch.autocast` otherwise; gradients reduce in float32).
- LoRA through peft (`dare.train.lora`); the reference model is then the same network with the adapter
  disabled, otherwise a frozen copy (optionally kept on the CPU). Under LoRA with bfloat16 the frozen base is
  stored in bfloat16 (`bf16_base`): autocast then has no base weight to cast (it casts only the float32
  adapters, r x d each), and the adapters and their AdamW state stay float32; peft adds an adapter's output to
  the base layer's and casts the sum back to the layer's dtype.
- a full fine-tune on one device (`train.optimizer=adamw_offload`): the model's parameters and gradients in
  bfloat16 on the device, its float32 master copy (`master`) and AdamW's moments on the CPU, where the optimizer
  steps; the new weights are copied back after each step. Checkpoints and the export hold the master copy.
  (Not FSDP2's `CPUOffloadPolicy`: that keeps the weights on the CPU and copies them up on every forward, ~130
  per rollout.) Bytes per parameter of each mode: `dare.train.optim`.
- gradient checkpointing of every decoder layer (non-reentrant).

Losses are normalized by batch totals (see `dare.train.sft`/`rl`), and FSDP averages gradients over ranks, so
each rank's loss is multiplied by the world size before backward (`Trainer.backward`)."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch

from dare.models.tokenizer import save_tokenizer
from dare.train.checkpoint import _single_process_quiet, save_model
from dare.train.dist import Dist, sequence_parallel_training
from dare.train.lora import adapter_to_module_names, add_lora, merge_lora, save_adapter
from dare.utils import UserError, fingerprint


class Trainer:
    """`model` as trained (peft / FSDP wrapped), its optimizer and schedule, and its reference."""

    def __init__(self, model, model_cfg, train_cfg, dist: Dist, total_steps: int, reference: bool = False,
                 seed: int = 0):
        from dare.train.optim import lr_factor, make_optimizer

        self.dist, self.cfg = dist, train_cfg
        self.lora = model_cfg.lora.rank > 0
        self.bf16 = model_cfg.dtype == "bfloat16"
        self.master = None
        """`train.optimizer=adamw_offload`: the float32 master copy on the CPU that the optimizer steps."""
        if train_cfg.optimizer == "adamw_offload":
            if dist.processes > 1:
                raise UserError("train.optimizer=adamw_offload trains on one process (several shard the optimizer "
                                "state with FSDP2): set train.optimizer=adamw")
            self.master = copy.deepcopy(model).to("cpu")
        if bf16_base(model_cfg) or self.master is not None:  # before peft adds the (float32) adapters
            cast_parameters(model, torch.bfloat16)
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
            if train_cfg.reference_offload and dist.processes == 1:
                ref.to("cpu")
        if self.lora:
            model = add_lora(model, model_cfg.lora, seed)
        if dist.processes > 1:
            shard(model, self.bf16)
            if ref is not None:
                # FSDP's CPU offload needs an accelerator; on a CPU-only run everything is on the CPU already
                shard(ref, self.bf16, offload=train_cfg.reference_offload and dist.device.type != "cpu")
        self.model, self.ref = model, ref
        self.replicated = []  # parameters every rank of a sequence-parallel group computes in full (the heads)
        if dist.sp > 1:
            self.replicated = sequence_parallel_training(model, self.base, dist)
        self.optimizer = make_optimizer(self.stepped, train_cfg)
        self.lr_scale = 1.0
        """A factor on the whole schedule: a guard's rollback halves it (`scale_lr`); checkpoints keep it."""
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, total_steps, train_cfg) * self.lr_scale)

    @property
    def stepped(self):
        """The module whose parameters the optimizer steps and checkpoints hold: the model, or its master copy."""
        return self.model if self.master is None else self.master

    # --- compute
    def autocast(self):
        """bfloat16 compute around forwards when unsharded (FSDP casts parameters itself). Parameters already
        in bfloat16 (a LoRA base) are used as they are; what autocast keeps in float32 stays so."""
        if self.bf16 and self.dist.processes == 1:
            return torch.autocast(self.dist.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.dist.processes).backward()  # FSDP averages over processes; losses are batch-normalized

    def step(self) -> float:
        """Clip, step, schedule, zero; returns the gradient norm before clipping. A non-finite norm (a NaN or
        inf anywhere in the gradients, the same on every rank) skips the step: the gradients are dropped and
        the weights, the optimizer's moments and the schedule stay as they were."""
        if self.master is not None:  # the bfloat16 gradients, to the master copy in float32
            for p, m in zip(self.model.parameters(), self.master.parameters(), strict=True):
                m.grad, p.grad = (None if p.grad is None else p.grad.to("cpu").float()), None
        params = [p for p in self.stepped.parameters() if p.grad is not None]
        for p in self.replicated:  # summed over the sequence-parallel group: P times the gradient
            if p.grad is not None:
                p.grad.div_(self.dist.sp)
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
        self._copy_master()
        every = self.cfg.reference_sync_every
        if self.ref is not None and every and self.scheduler.last_epoch % every == 0:
            self.sync_reference(self.cfg.reference_mix)
        return float(norm)

    @torch.no_grad()
    def sync_reference(self, mix: float) -> None:
        """TR-DPO's update (TRL `SyncRefModelCallback`): ref <- (1 - mix) ref + mix policy, parameter
        by parameter (shard by shard under FSDP: both models are sharded alike)."""
        for ref_p, p in zip(self.ref.parameters(), self.stepped.parameters(), strict=True):
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
        offloaded = self.cfg.reference_offload and self.dist.processes == 1 and self.dist.device.type != "cpu"
        if offloaded:
            self.ref.to(self.dist.device)
        try:
            with self.autocast():
                yield self.ref
        finally:
            if offloaded:
                self.ref.to("cpu")

    @torch.no_grad()
    def _copy_master(self) -> None:
        """The master copy's weights onto the model's bfloat16 parameters (cast on the CPU: 2 bytes each move)."""
        if self.master is not None:
            for p, m in zip(self.model.parameters(), self.master.parameters(), strict=True):
                p.copy_(m.to(p.dtype))

    # --- state
    def _options(self, **kw):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=self.lora, **kw)

    def _sharded_options(self, **kw):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(ignore_frozen_params=self.lora, strict=not self.lora, **kw)

    def _sharded_state(self) -> dict:
        """The state a checkpoint holds, as this rank's shards (DTensors under FSDP): model, optimizer, and a
        moving reference."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        model, optim = get_state_dict(self.stepped, self.optimizer, options=self._sharded_options())
        state = {"model": model, "optimizer": optim}
        if self.moving_reference:
            state["reference"] = get_model_state_dict(self.ref)
        return state

    def optimizer_state(self) -> dict:
        """What `trainer_state.pt` holds besides the loop's state: the schedule (the optimizer's tensors are
        in the sharded checkpoint)."""
        return {"scheduler": self.scheduler.state_dict(), "lr_scale": self.lr_scale}

    @property
    def moving_reference(self) -> bool:
        """The reference changes during training (TR-DPO sync), so checkpoints carry it."""
        return self.ref is not None and self.cfg.reference_sync_every > 0

    def save(self, folder: Path, tokenizer) -> None:
        """A checkpoint's tensors into `folder/dcp/` (`torch.distributed.checkpoint`, every rank writing its
        own shards), and from rank 0 the model's config, the tokenizer and `checkpoint.json` (the LoRA
        settings and the base checkpoint they apply to), so that `export_checkpoint` can rebuild a loadable
        model from the folder alone. Collective."""
        import torch.distributed.checkpoint as dcp

        from dare.utils import atomic_write_json

        folder = Path(folder)
        with _single_process_quiet():
            dcp.save(self._sharded_state(), checkpoint_id=str(folder / "dcp"), no_dist=self.dist.processes == 1)
        if self.dist.main:
            self.base.config.save_pretrained(folder)
            save_tokenizer(tokenizer, folder)
            lora = self.model.peft_config["default"] if self.lora else None
            atomic_write_json(folder / "checkpoint.json", {
                "format": "dcp", "lora": None if lora is None else {
                    "rank": lora.r, "alpha": lora.lora_alpha, "dropout": lora.lora_dropout,
                    "targets": lora.target_modules if isinstance(lora.target_modules, str)
                    else sorted(lora.target_modules)},
                "base": getattr(self.base, "name_or_path", None) or None, "fingerprint": fingerprint()})

    def load(self, folder: Path, state: dict) -> None:
        """Restore weights, optimizer and schedule from a checkpoint folder (`save`; resharded to this run's
        processes), or from one of the earlier full-tensor format."""
        folder = Path(folder)
        if (folder / "dcp").is_dir():
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

            target = self._sharded_state()
            with _single_process_quiet():
                dcp.load(target, checkpoint_id=str(folder / "dcp"), no_dist=self.dist.processes == 1)
            set_state_dict(self.stepped, self.optimizer, model_state_dict=target["model"],
                           optim_state_dict=target["optimizer"], options=self._sharded_options())
            if self.moving_reference:
                set_model_state_dict(self.ref, target["reference"])
        else:
            self._load_full(folder, state)
        self._copy_master()
        self.lr_scale = state.get("lr_scale", 1.0)
        self.scheduler.load_state_dict(state["scheduler"])

    def _load_full(self, folder: Path, state: dict) -> None:
        """The earlier checkpoint format: full tensors (`model.safetensors` or the adapter, the optimizer in
        `trainer_state.pt`, `reference.safetensors`)."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        if self.lora:
            weights = adapter_to_module_names(self.model, load_file(str(folder / "adapter_model.safetensors")))
        else:
            weights = load_file(str(folder / "model.safetensors"))
        expected = {n for n, p in self.stepped.named_parameters() if p.requires_grad or not self.lora}
        missing = sorted(expected - set(weights))
        if missing:
            raise RuntimeError(f"{folder}: checkpoint does not match the model (missing {missing[:5]})")
        set_model_state_dict(self.stepped, weights, options=self._options(strict=not self.lora))
        set_optimizer_state_dict(self.stepped, self.optimizer, state["optimizer"], options=self._options())
        if self.moving_reference:
            if not (folder / "reference.safetensors").is_file():
                raise RuntimeError(f"{folder}: train.reference_sync_every is set but the checkpoint holds no "
                                   "reference.safetensors (it was written by a run without reference sync)")
            set_model_state_dict(self.ref, load_file(str(folder / "reference.safetensors")), options=self._options())

    def export(self, folder: Path, tokenizer, meta: dict) -> None:
        """The final model as a plain checkpoint any tool loads (LoRA merged into the weights,
        the adapter kept beside it in `adapter/`). Collective; rank 0 writes."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.stepped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.dist.main:
            return
        if self.lora:
            save_adapter(self.model, {k: v for k, v in full.items() if ".lora_" in k}, Path(folder) / "adapter")
            full = merge_lora(full, self.model.peft_config["default"])
        save_model(self.base if not self.lora else self.model.get_base_model(), tokenizer, folder,
                   meta=meta, state_dict=full)


def bf16_base(model_cfg) -> bool:
    """Whether the model's frozen base is stored in bfloat16: under LoRA (`model.lora.rank > 0`) with
    `model.dtype=bfloat16` (a LoRA run loads its checkpoint so, `dare.train.loop.build_model`)."""
    return model_cfg.lora.rank > 0 and model_cfg.dtype == "bfloat16"


def cast_parameters(model, dtype: torch.dtype) -> None:
    """Store every floating-point parameter of `model` in `dtype`, in place (tied ones once); buffers (rotary
    tables, routers' biases) keep theirs."""
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)


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
