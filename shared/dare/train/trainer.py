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

Checkpoints are sharded: `torch.distributed.checkpoint` writes the trained parameters (all, or the LoRA
adapter), the optimizer's state and a moving reference into `step_N/dcp/`, every rank its own shards (no
gather on rank 0: an 8B model with its optimizer state never passes through one host's memory), and
loads them back on any number of processes (resharded; tested 2 -> 1 and 1 -> 2). Rank 0 adds the small
files: the model's config, the tokenizer, `checkpoint.json`. A loadable `save_pretrained` folder is written
only at the end (`export`, the run's `final/`) or on demand from a checkpoint (`export_checkpoint`,
`dare export`). Checkpoints of the earlier format (full tensors in `model.safetensors` and
`trainer_state.pt`) still load. Losses are normalized by batch totals (see `dare.train.sft`/`rl`), and FSDP
averages gradients over ranks, so each rank's loss is multiplied by the world size before
backward (`Trainer.backward`).

Sequence parallelism (`train.sequence_parallel=P`, Ulysses: `dare.models.core.sequence_parallel`): the
processes form groups of P; a group shares one data-parallel share of every batch (`Dist.rank`/`world`
count shares, not processes), and the trained model's gradient-taking forwards run with each process
computing 1/P of the positions; forwards without gradients (rollouts and their caches, old and reference
log-probs) run whole. Packed log-prob passes are off under it (`train.packing=false`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from dare.utils import UserError
from dare.models import facts
from dare.models.tokenizer import save_tokenizer
from dare.utils import atomic_write, derive_seed, fingerprint

LORA_PREFIX = "base_model.model."


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


@dataclass
class Dist:
    """The processes, as the data sees them: `rank`/`world` say which share of every batch this process
    holds (its data-parallel rank and their number); with sequence parallelism over groups of `sp`
    processes, the processes of one group hold the same rows, seeds and totals, each computing 1/sp of
    the positions. `process`/`processes` count every process (FSDP shards over all of them)."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    process: int | None = None
    processes: int | None = None
    sp: int = 1
    sp_group: object = None
    """This process's sequence-parallel group (None: no sequence parallelism)."""
    dp_group: object = None
    """The processes at this one's place in every sequence-parallel group: `sum` reduces over them."""

    def __post_init__(self):
        self.process = self.rank if self.process is None else self.process
        self.processes = self.world if self.processes is None else self.processes

    @property
    def main(self) -> bool:
        return self.process == 0

    def shard(self, n: int) -> slice:
        """This rank's contiguous rows of an n-row batch (n divisible by the world size)."""
        k = n // self.world
        return slice(self.rank * k, (self.rank + 1) * k)

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Sum scalars over the data-parallel ranks (identity in one process): batch totals counted once
        per share of the data, however many processes of a sequence-parallel group hold it."""
        if self.world == 1 or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, group=self.dp_group)
        return dict(zip(keys, t.tolist()))

    def max(self, values: dict[str, float]) -> dict[str, float]:
        """The maximum of scalars over every process (identity in one process)."""
        if self.processes == 1 or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return dict(zip(keys, t.tolist()))

    def any(self, flag: bool) -> bool:
        return bool(self.max({"f": float(flag)})["f"]) if self.processes > 1 else flag

    def barrier(self) -> None:
        if self.processes > 1:
            torch.distributed.barrier()


def sequence_parallel_training(model, base, dist: Dist) -> list:
    """Run the trained model's (`model`, wrapping the transformers model `base`) gradient-taking forwards sequence-parallel over `dist.sp_group` (a forward
    hook: forwards without gradients, such as rollouts with their caches, run whole on every process); ->
    the parameters applied after the positions are gathered (output head, value head), whose gradients
    `Trainer.step` divides by the group size. Refuses what it cannot split: heads that do not divide by
    the group size, an output head tied to the input embedding (used before and after the gather)."""
    from dare.models.core import sequence_parallel

    config = base.config
    heads = sorted({getattr(config, k) for k in ("num_attention_heads", "n_heads", "num_key_value_heads", "n_kv_heads")
                    if getattr(config, k, None)})  # query and key/value heads
    bad = [h for h in heads if h % dist.sp]
    if bad:
        raise UserError(f"train.sequence_parallel={dist.sp}: the model's attention heads ({heads}) must divide by it")
    head = base.get_output_embeddings()
    if head.weight is base.get_input_embeddings().weight:
        raise UserError(f"train.sequence_parallel={dist.sp}: the model ties its output head to the input "
                        "embedding, which sequence parallelism splits differently; untie it or train without")
    active = []

    def enter(module, args, kwargs):
        plain = kwargs.get("past_key_values") is None and not kwargs.get("use_cache") and kwargs.get("cu_seqlens") is None
        context = sequence_parallel(dist.sp_group) if torch.is_grad_enabled() and plain else contextlib.nullcontext()
        context.__enter__()
        active.append(context)

    def leave(module, args, kwargs, output):
        active.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter, with_kwargs=True)
    model.register_forward_hook(leave, with_kwargs=True, always_call=True)
    value = getattr(base, "value_head", None)
    return [*head.parameters(), *(value.parameters() if value is not None else [])]


def setup_dist(sequence_parallel: int = 1) -> Dist:
    """Join the process group a launcher described in the environment (torchrun, Ray, SLURM set
    RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT); one process otherwise. `sequence_parallel` = P > 1
    groups the processes P by P (ranks 0..P-1, P..2P-1, ...): each group shares one share of the data."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes % sequence_parallel:
        raise UserError(f"train.sequence_parallel={sequence_parallel} must divide the number of processes "
                        f"({processes})")
    cuda = torch.cuda.is_available()
    if processes == 1:
        return Dist(0, 1, torch.device("cuda", 0) if cuda else torch.device("cpu"))
    process, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    P = sequence_parallel
    if P == 1:
        return Dist(process, processes, device)
    sp_group = dp_group = None
    for g in range(processes // P):  # every process creates every group, in the same order
        group = torch.distributed.new_group(list(range(g * P, (g + 1) * P)))
        sp_group = group if process // P == g else sp_group
    for j in range(P):
        group = torch.distributed.new_group(list(range(j, processes, P)))
        dp_group = group if process % P == j else dp_group
    return Dist(process // P, processes // P, device, process, processes, P, sp_group, dp_group)


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
        self.optimizer = make_optimizer(model, train_cfg)
        self.lr_scale = 1.0
        """A factor on the whole schedule: a guard's rollback halves it (`scale_lr`); checkpoints keep it."""
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, total_steps, train_cfg) * self.lr_scale)

    # --- compute
    def autocast(self):
        """bfloat16 compute around forwards when unsharded (FSDP casts parameters itself)."""
        if self.bf16 and self.dist.processes == 1:
            return torch.autocast(self.dist.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.dist.processes).backward()  # FSDP averages over processes; losses are batch-normalized

    def step(self) -> float:
        """Clip, step, schedule, zero; returns the gradient norm before clipping. A non-finite norm (a NaN or
        inf anywhere in the gradients, the same on every rank) skips the step: the gradients are dropped and
        the weights, the optimizer's moments and the schedule stay as they were."""
        params = [p for p in self.model.parameters() if p.grad is not None]
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
        offloaded = self.cfg.reference_offload and self.dist.processes == 1 and self.dist.device.type != "cpu"
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

    def _sharded_options(self, **kw):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(ignore_frozen_params=self.lora, strict=not self.lora, **kw)

    def _sharded_state(self) -> dict:
        """The state a checkpoint holds, as this rank's shards (DTensors under FSDP): model, optimizer, and a
        moving reference."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        model, optim = get_state_dict(self.model, self.optimizer, options=self._sharded_options())
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
            set_state_dict(self.model, self.optimizer, model_state_dict=target["model"],
                           optim_state_dict=target["optimizer"], options=self._sharded_options())
            if self.moving_reference:
                set_model_state_dict(self.ref, target["reference"])
        else:
            self._load_full(folder, state)
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
        expected = {n for n, p in self.model.named_parameters() if p.requires_grad or not self.lora}
        missing = sorted(expected - set(weights))
        if missing:
            raise RuntimeError(f"{folder}: checkpoint does not match the model (missing {missing[:5]})")
        set_model_state_dict(self.model, weights, options=self._options(strict=not self.lora))
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=self._options())
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


@contextlib.contextmanager
def _single_process_quiet():
    """torch.distributed.checkpoint warns that it assumes one process when no process group exists, which is
    what a one-process run means: that warning only is silenced."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def export_checkpoint(folder: str | Path, dest: str | Path | None = None) -> Path:
    """A loadable `save_pretrained` folder (`dest`, default `<folder>/export/`) from a sharded checkpoint
    folder (`step_N/`), in one process: the model built from the folder's config (LoRA: its base checkpoint
    with the adapter added), its trained tensors read from `dcp/`, LoRA merged into the weights (the adapter
    kept in `adapter/`). Only the model's tensors are read, not the optimizer's."""
    import json

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from transformers import AutoConfig, AutoModel

    from torch.distributed.checkpoint.state_dict import StateDictOptions

    from dare.config import LoraConfig
    from dare.models import load_pretrained, load_tokenizer, register_all
    from dare.utils import replace_dir

    folder = Path(folder)
    if not (folder / "dcp").is_dir() or not (folder / "checkpoint.json").is_file():
        raise UserError(f"{folder}: not a sharded checkpoint (no dcp/ and checkpoint.json); checkpoints are the "
                        "step_N/ folders under a run's checkpoints/")
    info = json.loads((folder / "checkpoint.json").read_text())
    register_all()
    if info.get("lora"):
        if not info.get("base") or not Path(info["base"]).is_dir():
            raise UserError(f"{folder}: a LoRA checkpoint needs its base model, {info.get('base')!r}, which is not a "
                            "folder here")
        lora = info["lora"]
        model = add_lora(load_pretrained(info["base"]), LoraConfig(rank=lora["rank"], alpha=lora["alpha"],
                                                                    dropout=lora["dropout"], targets=lora["targets"]))
    else:
        model = AutoModel.from_config(AutoConfig.from_pretrained(folder))
    options = StateDictOptions(ignore_frozen_params=bool(info.get("lora")))
    state = {"model": get_model_state_dict(model, options=options)}
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=str(folder / "dcp"), no_dist=True)
    model.load_state_dict(state["model"], strict=not info.get("lora"))
    dest = Path(dest) if dest else folder / "export"
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tokenizer = load_tokenizer(folder)
    if info.get("lora"):
        full = model.state_dict()
        save_adapter(model, {k: v for k, v in full.items() if ".lora_" in k}, tmp / "adapter")
        save_model(model.get_base_model(), tokenizer, tmp, state_dict=merge_lora(full, model.peft_config["default"]))
    else:
        save_model(model, tokenizer, tmp)
    replace_dir(tmp, dest)
    return dest


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
