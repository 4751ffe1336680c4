"""Rollout outputs, padding/response helpers and the commit rules shared by every sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from dare.config import DecodingConfig


@dataclass
class RolloutOutput:
    sequences: torch.Tensor
    """(B, P + G): the left-padded prompt followed by the generated tokens."""
    attention_mask: torch.Tensor
    """(B, P + G): 0 on prompt padding, 1 elsewhere."""
    prompt_length: int
    """P, the padded prompt length; the response is `sequences[:, P:]`."""
    response_mask: torch.Tensor
    """(B, G) bool: generated tokens up to and including the first EOS."""
    step_map: torch.Tensor
    """(B, G) long: the decoding step at which each generated position was (last) committed."""
    nfe: int
    """Forward passes of the model (a CFG step counts once)."""
    sampler: str = "masked"
    trajectory: torch.Tensor | None = None
    """(B, steps, G): the response after every step, with `record` states (row-major, as every
    field: `dare.train.batches.take` slices a rollout's rows)."""
    predictions: torch.Tensor | None = None
    """(B, steps, G): the sampler's full prediction x0-hat after every step (masked positions filled
    with their predictions), with `record` predictions (maskgit)."""
    confidences: torch.Tensor | None = None
    """(B, steps, G) float32: the confidence of each position at every step, beside `predictions`."""
    entropies: torch.Tensor | None = None
    """(B, G) float32: the entropy of the distribution each token was drawn from (truncated sampler: its truncated
    distribution; masked sampler, with `record` entropies: the model's own untempered distribution at the step that
    committed it, as `commit_logps`), 0 where nothing was committed."""
    greedy: torch.Tensor | None = None
    """(B, steps, G) long: the masked sampler's argmax completion of the canvas before every step (every masked
    position filled with its most probable token, the rest as they stand), with `record` greedy (EGSPO's one-step
    denoising completions)."""
    supports: torch.Tensor | None = None
    """(B, G, V) bool: the top-k/top-p support each token was drawn from, with `record` supports (truncated)."""
    logps: torch.Tensor | None = None
    """(B, G) float32: the log-probability of each generated token under the distribution it was
    drawn from at the step that (last) committed it, 0 where nothing was committed (block sampler)."""
    commit_logps: torch.Tensor | None = None
    """(B, G) float32: log softmax(logits) of each generated token under the model's own, untempered
    distribution at the step that (last) committed it, the distribution the trainer's log-probs estimate
    (no temperature, top-k/p or forbidden tokens), 0 where nothing was committed; the sampler's side of
    the rollout/trainer agreement (`dare.train.diagnostics`). The masked and block samplers record it."""
    steps_done: int = 0
    """Decoding steps made (the masked sampler; a partial rollout continues from here)."""
    segments: torch.Tensor | None = None
    """(B, G) long: the block of each generated position, 0 = the response's first (dynamic blocks,
    `decoding.block.dynamic`: each row's own layout; None where the blocks are the model's fixed ones)."""
    block_reward: torch.Tensor | None = None
    """(B,) float32: b1's block-entropy reward of each row (dynamic blocks; `dare.rollout.dynamic`)."""
    given: torch.Tensor | None = None
    """(B, G) bool: the positions given to the sampler and never sampled (inpainting, `generate(fixed=)`; IGPO's
    hints); None where every position was sampled."""
    decoding: DecodingConfig | None = None
    """The settings it was decoded with (`dare.rollout.generate` records them)."""

    @property
    def responses(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_length:]


def sharded(model) -> bool:
    """The model's forwards are collective: its parameters are FSDP2 shards (DTensors) of a process group."""
    return any(hasattr(p, "device_mesh") for p in model.parameters())


def any_rank(flag, device, collective: bool) -> bool:
    """`flag` on any process (all-reduce MAX) when the forwards are `collective` (a sharded model, `sharded`),
    `flag` itself otherwise: every data-dependent decision of a sampler (go on while a block has masked
    tokens, stop early, skip a block) goes through it, so that under FSDP every rank makes the same number
    of forwards while any rank still has work; a rank whose rows are done runs forwards that commit nothing.
    An unsharded model (evaluation on one rank, a process per GPU) decides alone."""
    return bool(max_rank(int(bool(flag)), device, collective))


def max_rank(value: int, device, collective: bool) -> int:
    """The largest `value` over the processes when the forwards are `collective`, `value` otherwise."""
    if not collective:
        return value
    import torch.distributed as dist

    t = torch.tensor([float(value)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def any_left(flag: torch.Tensor, collective: bool) -> torch.Tensor:
    """`flag` (a 0-d bool tensor) or-ed over the processes when the forwards are `collective`, kept on the
    device (an all-reduce, no host sync): whether a step does anything anywhere, which the samplers add to
    their step counters instead of asking the host."""
    if not collective:
        return flag
    import torch.distributed as dist

    t = flag.reshape(1).to(torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t[0].bool()


LOOK_EVERY = 4
"""Loops that run until a block is clean (a threshold or factor rule, token editing) look at the canvas (a host
sync) every this many steps, not after each: the steps run after a block is clean commit nothing and are not
counted (step map, `nfe`, trajectory, `steps_done` count the steps that had work, as a look after every step
would). Loops whose step count the schedule fixes look once per block, or not at all."""


# ------------------------------------------------------------------------------------------------
# The captured step


BACKEND: str | None = None
"""torch.compile's backend for the captured step (None: inductor); tests set "eager" or "aot_eager"."""


def compiles(decoding, device, static: bool = True) -> bool:
    """Whether the samplers capture their step: `decoding.compile`; None (auto) = on CUDA where the step's shapes
    are `static` (the dual cache, the block sampler's cache; the prefix cache's window shrinks block by block, so
    it would compile once per block)."""
    setting = getattr(decoding, "compile", None)
    return torch.device(device).type == "cuda" and static if setting is None else bool(setting)


BUCKET = 64
"""A captured step's prompt widths are multiples of this: the prompts are left-padded (the padding hidden, as any
row's; `dare.rollout.bucketed`, the block sampler's canvas) so that a new prompt length reuses the compiled step of
its bucket instead of compiling again."""

KEPT_CACHES = 2  # cache shapes a captured step keeps on the model (an RL run's rollouts have one or two)


class StepForward:
    """The forward of one denoising step on a static `KVCache` (`dare.models.core`): `(ids, mask, cache,
    replace_position=None) -> logits`, the model's own (Dream's are shifted: callers align them).

    With `compiled`, the call runs `torch.compile(fullgraph=True, dynamic=False)` of the model's forward,
    made once per model (kept on the model) and specialised by torch per shape (a rollout's step shapes: one
    for the dual cache and the block sampler, one per block for the prefix cache, whose window shrinks); on
    CUDA in mode "reduce-overhead" (CUDA graphs): the cache's tensors are marked as static addresses (their
    in-place writes are part of the graph, no copy) and each call starts a new graph step, so the logits it
    returns are valid until the next call. The step never syncs with the host, which capture needs. Eager:
    when not compiled, while the cache has no buffers yet (its first write makes them), and after compile
    raises (one line on stderr, then eager for this model: a step is idempotent, so rerunning it is safe)."""

    def __init__(self, model, compiled: bool):
        from dare.models.core import _SEQUENCE_GROUP

        # eager for FSDP shards and inside `sequence_parallel` (collectives in the forward are not captured)
        self.model, self.compiled = model, compiled and not sharded(model) and _SEQUENCE_GROUP.get() is None
        self.cuda = next(model.parameters()).device.type == "cuda"
        self.marked: set[int] = set()

    def cache(self, capacity: int, batch: int):
        """The rollout's static `KVCache`, empty: a new one, or where the step is captured on CUDA the model's
        own cache of this (capacity, batch), kept from rollout to rollout so that its addresses, and with them
        the CUDA graphs, stay the same (torch records a graph again when a static input moves, and stops
        capturing after 128 times). Kept, it holds `KVCache.nbytes(...)` while the model lives, for at most the
        `KEPT_CACHES` most recent shapes."""
        from dare.models.core import KVCache

        if not (self.compiled and self.cuda):
            return KVCache(capacity=capacity)
        kept = self.model.__dict__.setdefault("_dare_caches", {})
        cache = kept.pop((capacity, batch), None) or KVCache(capacity=capacity)
        kept[(capacity, batch)] = cache  # the most recent last; at most KEPT_CACHES shapes are kept
        while len(kept) > KEPT_CACHES:
            kept.pop(next(iter(kept)))
        return cache.truncate(0)

    def __call__(self, ids, mask, cache, replace_position=None) -> torch.Tensor:
        fn = _compiled_step(self.model, self.cuda) if self.compiled and cache.keys else None
        if fn is None:
            return self.model(ids, mask, past_key_values=cache, replace_position=replace_position).logits
        if id(cache) not in self.marked:
            for t in cache.tensors():
                torch._dynamo.mark_static_address(t)
            self.marked.add(id(cache))
        try:
            if self.cuda:
                torch.compiler.cudagraph_mark_step_begin()
            with torch._dynamo.config.patch(recompile_limit=64):
                return fn(ids, mask, cache, replace_position)
        except Exception as e:  # noqa: BLE001 - any failure of the capture: the eager step is the same step
            import sys

            print(f"dare: the captured step failed ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
                  "decoding eagerly", file=sys.stderr)
            self.model.__dict__["_dare_steps"][BACKEND] = False
            return self.model(ids, mask, past_key_values=cache, replace_position=replace_position).logits


def _compiled_step(model, cuda: bool):
    """The model's compiled step forward for `BACKEND`, made at its first use (False once it failed: eager)."""
    steps = model.__dict__.setdefault("_dare_steps", {})
    if BACKEND not in steps:
        def step(ids, mask, cache, replace_position):
            return model(ids, mask, past_key_values=cache, replace_position=replace_position).logits

        kw = {"mode": "reduce-overhead"} if cuda and BACKEND is None else {}  # CUDA graphs (inductor only)
        steps[BACKEND] = torch.compile(step, fullgraph=True, dynamic=False, backend=BACKEND or "inductor", **kw)
    return steps[BACKEND] or None


def canvas(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, gen_length: int, mask_id: int):
    """[prompt | MASK * gen_length] on the model's device, with its attention mask (pads hidden,
    generated positions real). -> (x, attention_mask, prompt_ids, prompt_mask), all (B, .)"""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    B, P = prompt_ids.shape
    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long, device=device)
    x[:, :P] = prompt_ids
    ones = torch.ones(B, gen_length, dtype=torch.long, device=device)
    return x, torch.cat([prompt_mask.long(), ones], dim=1), prompt_ids, prompt_mask


def place_prompts(x: torch.Tensor, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, starts: torch.Tensor):
    """Writes each row's prompt tokens (its `prompt_mask` positions, in order) into the canvas `x` (B, W) from column
    `starts[r]` (the block samplers' left padding by whole blocks), in place, without a host read."""
    B, W = x.shape
    cols = torch.where(prompt_mask, starts[:, None] + prompt_mask.long().cumsum(dim=1) - 1, W)  # W: a spare column
    wide = torch.cat([x, x[:, :1]], dim=1).scatter_(1, cols, prompt_ids)
    x.copy_(wide[:, :W])
    return x


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (ids, mask), both (B, max_len)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def response_mask(responses: torch.Tensor, stop_ids) -> torch.Tensor:
    """True for tokens up to and including the first stop token (EOS or end of turn: the model's
    `facts(model).stop_ids`); all tokens when there is none. (B, G)"""
    is_stop = torch.isin(responses, torch.tensor(_ids(stop_ids), device=responses.device)).long()
    return torch.cumsum(is_stop, dim=1) - is_stop == 0


def decode_responses(tokenizer, responses: torch.Tensor, stop_ids) -> list[str]:
    """Text of each response cut at its first stop token (`facts(model).stop_ids`), special
    tokens removed."""
    stops, texts = set(_ids(stop_ids)), []
    for row in responses.tolist():
        end = next((i for i, t in enumerate(row) if t in stops), len(row))
        texts.append(tokenizer.decode(row[:end], skip_special_tokens=True))
    return texts


def _ids(stop_ids) -> list[int]:
    return [int(stop_ids)] if isinstance(stop_ids, int) else [int(i) for i in stop_ids]


# ------------------------------------------------------------------------------------------------
# Sampling and commit rules


def num_transfer_tokens(masked_count: torch.Tensor, steps: int) -> torch.Tensor:
    """(B,) masked tokens of a block -> (B, steps) tokens to commit per step: an even split, the
    remainder going to the first steps (LLaDA's `get_num_transfer_tokens`)."""
    base = masked_count // steps
    remainder = masked_count % steps
    k = base[:, None].repeat(1, steps)
    k += (torch.arange(steps, device=masked_count.device)[None, :] < remainder[:, None]).long()
    return k


def gumbel_argmax(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """A sample from softmax(logits / T) by Gumbel-max in float64 (argmax at T = 0)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    return (logits.to(torch.float64) - temperature * torch.log(-torch.log(u))).argmax(dim=-1)


def predict(logits, masked, decoding, generator, eos_id=None, eot_id=None,
            forbid: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA's prediction and confidence on a span: x0 (Gumbel-max sample) and the untempered
    probability of x0 ("low_confidence"), the top-1 minus the top-2 probability ("margin", TraceRL's
    `margin_confidence`), U(0,1) ("random") or minus the position in the span ("left_to_right"); -inf
    where not masked.

    `logits_eos_inf` sets the EOS logit to -inf before sampling. `confidence_eos_eot_inf` does
    what the reference does (`logits_with_noise[..., EOS] = logits[..., EoT] = -inf` after x0 is
    chosen, then the confidence is softmax(logits)[x0]): at temperature 0 the noised copy IS the
    logits tensor, so both EOS and EoT logits become -inf and an EOS or EoT prediction gets
    confidence 0 (the others renormalised without them); at T > 0 only EoT is removed, so an EoT
    prediction gets 0 and EOS is unaffected (a quirk of the original, kept for fidelity).
    `forbid` (the mask id) is never predicted: loops that run until a block is clean would
    otherwise never end on a model that predicts MASK (trained checkpoints do not). It is removed from
    the choice of x0 only; the confidence is the probability of x0 among all tokens, as in the
    references, so a model that never predicts MASK decodes exactly as they do."""
    o = decoding.masked  # the masked sampler's options (`dare.decoding.masked`)
    if o.logits_eos_inf and eos_id is not None:
        logits = logits.clone()
        logits[..., eos_id] = -torch.inf
    choice = logits
    if forbid is not None:
        choice = logits.clone()
        choice[..., forbid] = -torch.inf
    x0 = gumbel_argmax(choice, decoding.temperature, generator)
    if o.remasking == "low_confidence":
        if o.confidence_eos_eot_inf:
            removed = [t for t in ([eot_id] + ([eos_id] if decoding.temperature == 0 else [])) if t is not None]
            logits = logits.clone()
            logits[..., removed] = -torch.inf
        probs = F.softmax(logits.to(torch.float64), dim=-1)
        conf = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
    elif o.remasking == "margin":
        top2 = F.softmax(logits.to(torch.float64), dim=-1).topk(2, dim=-1).values
        conf = top2[..., 0] - top2[..., 1]
    elif o.remasking == "left_to_right":  # the leftmost masked positions first
        conf = -torch.arange(x0.shape[-1], dtype=torch.float64, device=logits.device).expand(x0.shape)
    else:
        conf = torch.rand(x0.shape, dtype=torch.float64, device=logits.device, generator=generator)
    return x0, conf.masked_fill(~masked, -torch.inf)  # (a scalar fill: no host-to-device copy per step)


REFERENCE_TIES = ("cpu",)
"""Device types on which the commit rules break ties among equal confidences exactly as the references' calls
do: `topk(k_j)` row by row (quotas that differ between rows), `topk(k=n)[0]` (the threshold rule's forced
pick), a row's own sort (the factor rule), which costs a host sync per row and step, free on a CPU. Elsewhere
(CUDA) the rules run batched without a host sync: a row keeps the first k_j of one `topk(max quota)` for the
batch, the forced pick is the first most confident (`argmax`); where confidences differ the two agree."""


def _rowwise(t: torch.Tensor) -> bool:
    return t.device.type in REFERENCE_TIES


def commit_quota(conf: torch.Tensor, k: torch.Tensor, kmax: int | None = None) -> torch.Tensor:
    """The k[j] most confident positions of each row j (`torch.topk`, whose choice among equal
    confidences depends on the row it runs over: callers pass the span the reference ranks). (B, L) bool
    `kmax`: a bound on k known on the host (the step's quota), which lets the batched rule run with no host
    sync (one topk of that size, each row keeping its first k[j]; `REFERENCE_TIES`)."""
    if kmax is not None and not _rowwise(conf):
        kmax = min(kmax, conf.shape[1])
        if kmax <= 0:
            return torch.zeros(conf.shape, dtype=torch.bool, device=conf.device)
        keep = torch.arange(kmax, device=conf.device)[None, :] < k[:, None]
        commit = torch.zeros(conf.shape, dtype=torch.bool, device=conf.device).scatter(
            1, conf.topk(kmax, dim=1).indices, keep)
        return commit & torch.isfinite(conf)
    commit = torch.zeros(conf.shape, dtype=torch.bool, device=conf.device)
    kmax = int(k.max()) if k.numel() else 0
    if kmax > 0 and bool((k == kmax).all()):  # one topk for the batch (rows share their quota in a block)
        commit.scatter_(1, conf.topk(kmax, dim=1).indices, True)
    elif kmax > 0:  # the reference's per-row topk(k_j): its pick among ties depends on k
        for j, kj in enumerate(k.tolist()):
            if kj > 0:
                commit[j, conf[j].topk(kj).indices] = True
    return commit & torch.isfinite(conf)


def commit_threshold(conf: torch.Tensor, threshold: float) -> torch.Tensor:
    """Every masked position with confidence >= threshold, and always each row's most confident
    one (Fast-dLLM `get_transfer_index` with `threshold`)."""
    finite = torch.isfinite(conf)
    commit = (conf >= threshold) & finite
    if not _rowwise(conf):  # batched: the first most confident (`REFERENCE_TIES`)
        return commit | torch.zeros_like(commit).scatter(1, conf.argmax(dim=1, keepdim=True),
                                                         finite.any(dim=1, keepdim=True))
    for j, n in enumerate(finite.sum(dim=1).tolist()):
        if n:  # the reference ranks all n masked positions (`topk(k=n)`) and keeps the first
            commit[j, conf[j].topk(n).indices[0]] = True
    return commit


def commit_factor(conf: torch.Tensor, factor: float) -> torch.Tensor:
    """Fast-dLLM's factor rule (`get_transfer_index_dynamic`): with the masked confidences sorted
    c_1 >= c_2 >= ..., commit the top n where n is the first m (m >= 2) with c_m < 1 - f/(m+1),
    at least one; as in the original, when the first failure is the last position, all go."""
    if _rowwise(conf):
        return _commit_factor_rows(conf, factor)
    B, W = conf.shape
    n_masked = torch.isfinite(conf).sum(dim=1, keepdim=True)  # (B, 1)
    ranked = conf.sort(dim=1, descending=True)
    i = torch.arange(W, device=conf.device)[None, :]
    fail = (ranked.values < _factor_thresholds(factor, W, conf.dtype, conf.device)) & (i < n_masked)
    top = torch.where(fail.any(dim=1, keepdim=True), fail.int().argmax(dim=1, keepdim=True), n_masked - 1)
    top = torch.where((top == 0) | (top == n_masked - 1), top + 1, top)
    top = torch.where(n_masked == 0, 0, top)
    return torch.zeros(conf.shape, dtype=torch.bool, device=conf.device).scatter(1, ranked.indices, i < top)


def _commit_factor_rows(conf: torch.Tensor, factor: float) -> torch.Tensor:
    commit = torch.zeros(conf.shape, dtype=torch.bool, device=conf.device)
    for j in range(conf.shape[0]):
        n_masked = int(torch.isfinite(conf[j]).sum())
        if n_masked == 0:
            continue
        ranked = conf[j].sort(descending=True)
        thresholds = [-1.0] + [1 - factor / (n + 1) for n in range(2, n_masked + 1)]
        top = n_masked - 1
        for i, t in enumerate(thresholds):
            if float(ranked.values[i]) < t:
                top = i
                break
        if top == 0 or top == n_masked - 1:
            top += 1
        commit[j, ranked.indices[:top]] = True
    return commit


_THRESHOLDS: dict = {}


def _factor_thresholds(factor: float, width: int, dtype, device) -> torch.Tensor:
    """(1, width): the factor rule's bar for the i-th most confident, -1 for the first, 1 - f/(i+2) after
    (computed on the host, as the original does, and kept: no copy per step)."""
    key = (factor, width, dtype, str(device))
    if key not in _THRESHOLDS:
        bars = [-1.0] + [1 - factor / (n + 1) for n in range(2, width + 1)]
        _THRESHOLDS[key] = torch.tensor(bars, dtype=dtype, device=device)[None, :]
    return _THRESHOLDS[key]


def commit_rule(conf: torch.Tensor, decoding, quota: torch.Tensor, kmax: int | None = None) -> torch.Tensor:
    """The masked sampler's commit: its threshold or factor rule (`decoding.masked`), else the quota
    (`kmax`: its bound known on the host, `commit_quota`)."""
    o = decoding.masked
    if o.threshold > 0:
        return commit_threshold(conf, o.threshold)
    if o.factor > 0:
        return commit_factor(conf, o.factor)
    return commit_quota(conf, quota, kmax)
