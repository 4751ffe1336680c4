"""The memory a training run needs per GPU, computed before any GPU is used (`dare plan`).

What it counts, per phase of a step, in bytes per process (`Plan.phases`):

    weights       the parameters as the trainer keeps them: float32 master weights (sharded over the processes
                  under FSDP); under LoRA the frozen base in the run's dtype and the adapters in float32
    gradients     float32, of the trainable parameters (sharded)
    optimizer     AdamW's two float32 moments of the trainable parameters (sharded)
    reference     a second copy of the weights where the baseline keeps a reference model (not under LoRA, where
                  the reference is the base with the adapters off; none when `train.reference_offload`)
    gathered      FSDP's unsharded layers in the compute dtype: two layers (the one running and the one prefetched)
    rollout       the static KV cache of the rollout's rows at prompt + generation, one forward's float32 logits
                  over the queried positions (and the sampler's softmax of them), one layer's intermediates
    activations   what the update's backward keeps: per token and layer, the bytes one decoder layer of this
                  architecture saves for backward, measured by running that layer on the CPU at its real widths
                  (`layer_activation_bytes`) with the fused attention kernels' saved state (q, k, v, output,
                  log-sum-exp; no attention matrix); with gradient checkpointing, each layer's input plus one
                  layer's recompute; block-diffusion models run [x_t ; x_0], twice the length
    loss          the chunked cross-entropy's float32 logits, log-softmax and gradient of one chunk
                  (`train.logit_chunk` positions x vocabulary; all scored positions when 0)

Each phase's peak is the sum of what is alive in it: rollout (weights, reference, gathered, the rollout), log-probs
(weights, reference, gathered, one micro-batch's forward and a loss chunk without gradients) and update
(weights, gradients, optimizer, reference, gathered, activations, the loss chunk). The largest is the run's peak.
What it does not count: the CUDA context and allocator fragmentation (`OVERHEAD_GIB` is added for them on a
GPU), baselines that keep several draws' graphs alive at once (`draw_parts` splits them), a value model.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

from dare.utils import UserError

GIB = 2**30
OVERHEAD_GIB = 2.0  # CUDA context, cuBLAS workspaces, the caching allocator's fragmentation (a GPU only)
ADAM_BYTES = 8  # two float32 moments per trainable parameter


@dataclass
class Shapes:
    """What the arithmetic needs of a model, read from its config on the meta device."""

    family: str
    params: int
    layers: int
    hidden: int
    vocab: int
    kv_heads: int
    head_dim: int
    largest_layer: int  # parameters of the largest decoder layer
    block_size: int | None
    lora_params: int = 0


@dataclass
class Plan:
    phases: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    capacity: int | None = None  # bytes per GPU, when known

    def peak(self, phase: str) -> int:
        return sum(b for _, b in self.phases[phase])

    @property
    def worst(self) -> tuple[str, int]:
        return max(((p, self.peak(p)) for p in self.phases), key=lambda t: t[1])

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.worst[1] <= self.capacity


def shapes_of(model, lora_rank: int = 0, lora_targets: str | None = None) -> Shapes:
    """Shapes of a model built on the meta device (`dare.models.api.meta_model`, or a released config)."""
    import re

    from dare.models import facts

    f = facts(model)
    embed, layers, _, _, _ = model.decoder_parts()
    c = model.config
    heads = getattr(c, "num_attention_heads", None) or c.n_heads
    kv = getattr(c, "num_key_value_heads", None) or getattr(c, "n_kv_heads", None) or heads
    hidden = embed.weight.shape[1]
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    lora = 0
    if lora_rank:
        pattern = re.compile(lora_targets or f.lora_targets)
        for name, module in model.named_modules():
            if pattern.fullmatch(name) and hasattr(module, "in_features"):
                lora += lora_rank * (module.in_features + module.out_features)
    return Shapes(family=f.family, params=sum(p.numel() for p in model.parameters()), layers=len(layers),
                  hidden=hidden, vocab=embed.weight.shape[0], kv_heads=kv, head_dim=head_dim,
                  largest_layer=max(sum(p.numel() for p in layer.parameters()) for layer in layers),
                  block_size=f.block_size, lora_params=lora)


class _FusedSaved:
    """While active, SDPA saves what the fused kernels save for backward (q, k, v, the output and a float32
    log-sum-exp per query and head; k and v repeated to q's heads where a mask is given, as on CUDA) instead of
    what the CPU's math kernel would (the attention matrix)."""

    def __enter__(self):
        import torch
        import torch.nn.functional as F

        original = F.scaled_dot_product_attention

        class Attention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, mask):
                with torch.no_grad():
                    out = original(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
                if mask is not None and q.shape[1] != k.shape[1]:
                    g = q.shape[1] // k.shape[1]
                    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
                ctx.save_for_backward(q, k, v, out, q.new_empty(q.shape[:-1], dtype=torch.float32))
                return out

            @staticmethod
            def backward(ctx, grad):
                raise RuntimeError("the memory probe's attention has no backward")

        def fused(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False, **kw):
            return Attention.apply(q, k, v, attn_mask)

        self.original, F.scaled_dot_product_attention = original, fused
        return self

    def __exit__(self, *exc):
        import torch.nn.functional as F

        F.scaled_dot_product_attention = self.original


def layer_activation_bytes(model_class, config, dtype: str, tokens: int = 64) -> tuple[list[int], list[int]]:
    """(bytes per token, bytes per forward) that each decoder layer of `model_class(config)` saves for backward in
    `dtype` (bfloat16 runs under autocast, as the trainer does; its per-forward bytes are the weights' bfloat16
    copies autocast keeps for backward): the layers are built on the CPU at their real widths (a MoE layer with
    fewer routed experts: what a token saves depends on its top-k, not on how many experts exist), random
    sequences of `tokens` and `2 * tokens` go through each, and the saved tensors' storages (not the parameters'
    own) are counted once each; the difference is the per-token part."""
    import copy

    import torch

    from dare.models.core import make_layout

    config = copy.deepcopy(config)
    if getattr(config, "num_experts", None):
        groups = getattr(config, "n_group", None) or 1
        config.num_experts = max(2 * config.num_experts_per_tok, groups) // groups * groups
    with torch.device("meta"):
        model = model_class(config)
    embed, layers, _, _, rope = model.decoder_parts()
    hidden = embed.weight.shape[1]
    largest, limit = max(sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in layers), probe_bytes()
    if largest > limit:  # before any layer is allocated (a width of 2^20 asked for terabytes)
        raise UserError(f"one decoder layer of {model_class.__name__} holds {largest / 2**30:,.1f} GiB of weights at its "
                        f"widths (hidden size {hidden:,}); dare plan builds one on the CPU to measure it, and allows "
                        f"{limit / 2**30:,.1f} GiB (`probe_bytes`: half this machine's memory)")
    seen: dict[int, int] = {}

    def count(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    def saved(layer, i: int, n: int) -> int:
        layout = make_layout(model, torch.zeros(1, n, dtype=torch.long))
        x = torch.randn(1, n, hidden, requires_grad=True)
        seen.clear()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()
        with _FusedSaved(), autocast, torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            layer(x, rope(layout.positions, torch.float32), layout, i)
        own = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        return sum(b for ptr, b in seen.items() if ptr not in own)

    per_token, per_forward = [], []
    for i, layer in enumerate(layers):
        if i and _same_layer(layer, layers[i - 1]):
            per_token.append(per_token[-1])
            per_forward.append(per_forward[-1])
            continue
        real = copy.deepcopy(layer).to_empty(device="cpu")
        with torch.no_grad():
            for p in real.parameters():
                p.normal_(0.0, 0.02)
            for b in real.buffers():
                b.zero_()
        one, two = saved(real, i, tokens), saved(real, i, 2 * tokens)
        per_token.append(max(0, (two - one) // tokens))
        per_forward.append(max(0, one - per_token[-1] * tokens))
        del real
    return per_token, per_forward


def probe_bytes() -> int:
    """The most bytes of weights one decoder layer built on the CPU by `layer_activation_bytes` may hold: half of this
    machine's memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def _same_layer(a, b) -> bool:
    return [(n, tuple(p.shape)) for n, p in a.named_parameters()] == [(n, tuple(p.shape)) for n, p in b.named_parameters()]


def plan_training(shapes: Shapes, per_token_layer: list[int], per_forward_layer: list[int] | None = None, *,
                  processes: int = 1, dtype: str = "bfloat16", lora: bool = False, micro_batch: int = 1,
                  length: int = 512, scored: int | None = None, gradient_checkpointing: bool = False,
                  logit_chunk: int = 1024, reference: bool = False, reference_offload: bool = False,
                  rollout_rows: int = 0, rollout_length: int = 0, rollout_queries: int = 0, rollout_logits: int = 0,
                  rollout_cache: bool = True,
                  gather_rollout: bool = False, optimizer_offload: bool = False, fused_loss: bool = True,
                  device: str = "cuda", capacity_gib: float | None = None) -> Plan:
    """The arithmetic of the module docstring. `length` is one training row's length (prompt + completion; block
    models' doubled layout is applied here), `scored` the positions per row the loss scores (default: all);
    `rollout_*`: rows per process, prompt + generation, positions queried per forward (the block on a cache,
    everything without one); `gather_rollout`: the rollout runs on the gathered model (one FSDP gather)."""
    P, N = shapes.params, processes
    sharded = N > 1
    act = 2 if dtype == "bfloat16" else 4
    plan = Plan(capacity=None if capacity_gib is None else int(capacity_gib * GIB))
    if lora:  # the frozen base in the run's dtype, the adapters (and their gradients and moments) in float32
        static = [("weights (frozen base)", P * act // N), ("weights (adapters)", shapes.lora_params * 4 // N)]
        trainable = shapes.lora_params
    elif optimizer_offload:  # bfloat16 weights on the device; the float32 master and moments on the CPU
        static = [("weights (bfloat16; master on the CPU)", P * 2)]
        trainable = P
    else:
        static = [("weights (float32 master)", P * 4 // N)]
        trainable = P
    if reference and not lora and not reference_offload:
        static.append(("reference model", P * 4 // N))
    if sharded:
        static.append(("gathered layers (2)", 2 * shapes.largest_layer * act))
    grads = ("gradients" + (" (bfloat16)" if optimizer_offload and not lora else " (float32)"),
             trainable * (2 if optimizer_offload and not lora else 4) // N)
    optim = ("optimizer (AdamW moments)", 0 if optimizer_offload else trainable * ADAM_BYTES // N)
    if optimizer_offload:
        plan.assumptions.append("train.optimizer=adamw_offload: the float32 master and AdamW's moments on the CPU "
                                "(12-16 bytes a parameter there)")

    L = length * (2 if shapes.block_size else 1)
    tokens = micro_batch * L
    if gradient_checkpointing:
        acts = shapes.layers * tokens * shapes.hidden * act + tokens * max(per_token_layer)
    else:
        acts = tokens * sum(per_token_layer)
    acts += tokens * shapes.hidden * 4 * 2  # the final norm's input and output (float32)
    update = [grads, optim, ("activations" + (" (checkpointed)" if gradient_checkpointing else ""), acts)]
    if per_forward_layer and dtype == "bfloat16" and not lora and not sharded and not optimizer_offload:
        # autocast keeps each layer's bfloat16 weight copies until the backward has used them
        update.append(("autocast's bfloat16 weight copies", max(per_forward_layer) if gradient_checkpointing
                       else sum(per_forward_layer)))
    n_scored = micro_batch * (scored if scored is not None else length)
    chunk = min(logit_chunk, n_scored) if logit_chunk > 0 else n_scored
    if fused_loss and logit_chunk > 0:  # one chunk's logits, softmax and gradient at a time, in backward too
        update.append(("loss chunk (recomputed in backward)", chunk * shapes.vocab * 4 * 3))
    else:  # each chunk's float32 log-softmax is kept for backward
        update.append(("loss (every scored position's log-softmax)", n_scored * shapes.vocab * 4
                       + chunk * shapes.vocab * 4 * 2))

    if rollout_rows:
        phase = list(static)
        if gather_rollout and sharded:
            phase.append(("gathered model for the rollout", P * act))
        if rollout_cache:
            phase.append(("rollout KV cache", 2 * shapes.layers * rollout_rows * shapes.kv_heads * rollout_length
                          * shapes.head_dim * act))
        q = rollout_queries or rollout_length
        # the head runs on the positions the sampler reads (`token_logits(..., at=)`), not on every query
        phase.append(("rollout logits and softmax (float32)", rollout_rows * (rollout_logits or q) * shapes.vocab * 4 * 2))
        phase.append(("rollout layer intermediates", rollout_rows * q * max(per_token_layer)))
        plan.phases["rollout"] = phase
    plan.phases["log-probs"] = static + [("one micro-batch's layer intermediates", tokens * max(per_token_layer)),
                                        ("loss chunk (no gradient)", chunk * shapes.vocab * 4 * 2)]
    plan.phases["update"] = static + update
    if device.startswith("cuda"):
        for phase in plan.phases.values():
            phase.append(("CUDA context and fragmentation", int(OVERHEAD_GIB * GIB)))
    return plan


def advice(plan: Plan, *, lora: bool, gradient_checkpointing: bool, micro_batch: int, processes: int,
           reference_offload: bool, optimizer_offload: bool) -> list[str]:
    """The knobs that shrink the largest items of the worst phase, biggest saving first."""
    phase, peak = plan.worst
    items = dict(plan.phases[phase])
    out = []
    acts = next((v for k, v in items.items() if k.startswith("activations")), 0)
    if acts and not gradient_checkpointing:
        out.append(("train.gradient_checkpointing=true", acts * 0.8))
    if acts and micro_batch > 1:
        out.append((f"train.micro_batch_size={max(1, micro_batch // 2)}", acts / 2))
    if items.get("reference model") and not reference_offload:
        out.append(("train.reference_offload=true", items["reference model"]))
    opt = items.get("optimizer (AdamW moments)", 0)
    master = items.get("weights (float32 master)", 0)
    if opt and not lora:
        out.append(("model.lora.rank=128 (LoRA: a frozen base, adapters trained)",
                    opt + items.get("gradients (float32)", 0)))
    if opt and not optimizer_offload and not lora and processes == 1:
        # the moments leave the device, and bf16 weights and gradients take half the float32 ones' bytes
        halved = (master + items.get("gradients (float32)", 0)) / 2 if master else 0
        out.append(("train.optimizer=adamw_offload model.dtype=bfloat16 (master and moments on the CPU)", opt + halved))
    gathered = items.get("gathered model for the rollout", 0)
    if gathered:
        out.append(("rl.gather_rollout=false (FSDP gathers per forward: slower rollouts)", gathered))
    logits = items.get("rollout logits and softmax (float32)", 0)
    if logits:
        out.append(("rl.decoding.masked.cache=dual (a block of queries per forward, not the whole canvas)",
                    logits * 0.85))
        out.append(("rl.prompts_per_step halved (fewer rollout rows per GPU)", logits / 2))
    if master:
        out.append((f"--gpus {processes * 2} (FSDP shards weights, gradients and optimizer)", (master + opt) / 2))
    out.sort(key=lambda t: -t[1])
    return [f"{k}  (saves about {v / GIB:.1f} GiB)" for k, v in out]


def format_plan(plan: Plan, tips: list[str]) -> str:
    lines = []
    for phase, items in plan.phases.items():
        lines.append(f"{phase}:")
        for name, b in items:
            lines.append(f"  {name:42s} {b / GIB:9.2f} GiB")
        lines.append(f"  {'peak':42s} {plan.peak(phase) / GIB:9.2f} GiB")
    phase, peak = plan.worst
    if plan.capacity is not None:
        spare = (plan.capacity - peak) / GIB
        verdict = "fits" if spare >= 0 else "does NOT fit"
        lines.append(f"{verdict}: peak {peak / GIB:.1f} GiB in {phase} of {plan.capacity / GIB:.0f} GiB "
                     f"({abs(spare):.1f} GiB {'spare' if spare >= 0 else 'over'})")
        if spare < 0 or spare < 0.1 * plan.capacity / GIB:
            lines += ["what would make it fit, biggest saving first:"] + [f"  {t}" for t in tips]
    else:
        lines.append(f"peak {peak / GIB:.1f} GiB in {phase}")
    lines += [f"assumed: {a}" for a in plan.assumptions]
    return "\n".join(lines)




def plan_run(cfg, uses_reference: bool, shapes: Shapes, per_token: list[int], per_forward: list[int], *,
             recipe: str, gpus: int = 1, gpu_memory_gib: float | None = None, prompt_length: int = 256,
             length: int = 1024, device: str = "cuda") -> Plan:
    """`plan_training` for a run config (`cfg`, the baseline's whole config): its micro-batch, lengths, LoRA,
    dtype, checkpointing, chunk, reference, offloads and, for RL, its rollout (rows per process, the cache the
    decoding uses, the block it queries), with `prompt_length` for RL prompts and `length` for SFT and
    preference rows (what the data's longest row would be)."""
    from dare.train.trainer import bf16_base

    t, m = cfg.train, cfg.model
    lora = m.lora.rank > 0
    dtype = "bfloat16" if m.dtype == "bfloat16" else "float32"
    if lora and not bf16_base(m):
        dtype = "float32"
    kw = dict(processes=gpus, dtype=dtype, lora=lora, gradient_checkpointing=t.gradient_checkpointing,
              logit_chunk=t.logit_chunk, reference=uses_reference, reference_offload=t.reference_offload,
              optimizer_offload=getattr(t, "optimizer", "adamw") == "adamw_offload",
              fused_loss=gpus == 1, device=device, capacity_gib=gpu_memory_gib)
    if recipe == "rl":
        d = cfg.rl.decoding
        rows = cfg.rl.prompts_per_step * cfg.rl.group_size // gpus
        L = prompt_length + d.gen_length
        block_model = shapes.block_size is not None
        cache = (d.block.cache != "none") if block_model else d.masked.cache in ("prefix", "dual")
        queries = (shapes.block_size if block_model else d.block_length) if cache else L
        sampler = d.sampler if d.sampler != "auto" else "block" if block_model else "masked"
        read = {"block": shapes.block_size, "truncated": d.block_length, "maskgit": d.gen_length, "dream": L,
                "masked": d.gen_length if d.masked.cache == "prefix" else d.block_length}[sampler]  # logits read
        plan = plan_training(shapes, per_token, per_forward, micro_batch=t.micro_batch_size or rows, length=L,
                             scored=d.gen_length, rollout_rows=rows, rollout_length=L, rollout_queries=queries,
                             rollout_logits=min(read, queries),
                             rollout_cache=cache, gather_rollout=getattr(cfg.rl, "gather_rollout", True), **kw)
        plan.assumptions.append(f"prompts of {prompt_length} tokens (--prompt-length), gen {d.gen_length}; "
                                f"{rows} rollout rows per GPU")
    else:
        rows = max(1, t.batch_size // gpus) * (2 if recipe == "preference" else 1)
        plan = plan_training(shapes, per_token, per_forward, micro_batch=t.micro_batch_size or rows, length=length,
                             **kw)
        plan.assumptions.append(f"rows of {length} tokens (--length)")
        if recipe not in ("rl", "preference"):  # SFT: no log-probs pass before the update
            del plan.phases["log-probs"]
    return plan
