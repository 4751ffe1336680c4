"""The supervised recipe: batches of (prompt, response) -> `algorithm.loss` -> AdamW.

Batch layout (`SFTBatch`), as in LLaDA's SFT guideline: the chat-templated prompt, left-padded
(padding hidden from attention), then the response followed by EOS tokens up to the response
length; the EOS padding is part of the response and is trained on, which is how the model
learns to stop. `algo.max_length` (optional) cuts prompt + response to that many tokens from the
right, as a tokenizer's `truncation=True, max_length=...` does (d1's SFT: 4096): a cut response has
no EOS after it, and the rest of its row is hidden padding (not attended, not trained).

One step: every process draws the same rows and the same noise for the whole batch
(`sample_noise(batch, generator, cfg)`, see `dare.train.hooks`), then takes its own contiguous rows and
splits them into micro-batches; `loss(model, micro, noise, cfg)` returns a loss
normalized by the step's totals (`batch.num_sequences`), so the accumulated gradient does not
depend on the number of processes or micro-batches. Metrics follow the same rule (they add up).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dare.data import TASKS, load_split
from dare.models import encode_chat, facts
from dare.train.batches import take, updates
from dare.train.loop import Loop, build_model
from dare.train.dist import setup_dist
from dare.train.trainer import Trainer
from dare.train.estimators import Compute
from dare.train.hooks import SFTHooks
from dare.utils import UserError

@dataclass
class SFTBatch:
    input_ids: torch.Tensor
    """(B, L): left-padded prompt, then the response and its EOS padding."""
    attention_mask: torch.Tensor
    """(B, L): 0 on the prompt's left padding."""
    response_mask: torch.Tensor
    """(B, L) bool: response positions (answer + EOS padding); the prompt is never noised."""
    num_sequences: int = 0
    """Rows in the whole step (all processes, all micro-batches): the per-sequence normalizer."""
    compute: Compute = Compute()
    num_tokens: float = 0.0
    """Response tokens (response_mask) in the whole step: the token-level normalizer."""


def sft_batch(prompts: list[list[int]], responses: list[list[int]], eos_id: int, pad_id: int,
              response_length: int | None, compute: Compute = Compute(),
              cut: list[bool] | None = None) -> SFTBatch:
    """`cut[i]`: response i was truncated (`algo.max_length`): no EOS follows it and the rest of
    its row is hidden padding."""
    cut = cut or [False] * len(responses)
    R = response_length or max(len(r) + (0 if c else 1) for r, c in zip(responses, cut))
    P = max(len(p) for p in prompts)
    B = len(prompts)
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attention = torch.zeros((B, P + R), dtype=torch.long)
    response_mask = torch.zeros((B, P + R), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        end = P + len(r) if cut[i] else P + R
        ids[i, P:end] = torch.tensor(r + [eos_id] * (end - P - len(r)), dtype=torch.long)
        attention[i, P - len(p):end] = 1
        response_mask[i, P:end] = True
    return SFTBatch(ids, attention, response_mask, B, compute, float(response_mask.sum()))


def truncate(prompts: list[list[int]], responses: list[list[int]], max_length: int | None):
    """Cut each prompt + response to `max_length` tokens from the right (the response first; a
    prompt longer than the limit keeps it whole with an empty response). -> (responses, cut flags)"""
    if not max_length:
        return responses, [False] * len(responses)
    kept = [r[:max(0, max_length - len(p))] for p, r in zip(prompts, responses)]
    return kept, [len(k) < len(r) for k, r in zip(kept, responses)]


def train_step(trainer: Trainer, hooks: SFTHooks, batch: SFTBatch, noise, cfg) -> dict[str, float]:
    """This process's rows of `batch`, in micro-batches: accumulate gradients, then one optimizer
    step. Returns the step's metrics summed over micro-batches and processes."""
    n, dist = batch.input_ids.shape[0], trainer.dist
    mine = dist.shard(n)
    local, local_noise = take(batch, mine, n), take(noise, mine, n)
    m = local.input_ids.shape[0]
    return updates(trainer, [(slice(0, m), local)], [local_noise], cfg.train.micro_batch_size,
                   lambda micro, z, it, rows: hooks.loss(trainer.model, micro, z, cfg))


def run(cfg, hooks: SFTHooks, run_dir, label: str = "sft") -> dict:
    dist = setup_dist(cfg.train.sequence_parallel)
    task = TASKS[cfg.data.task]
    rows = load_split(cfg.data.task, cfg.data.split)
    model, tokenizer, model_name, init = build_model(cfg.model, task, cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    if cfg.train.batch_size % dist.world:
        raise UserError(f"train.batch_size={cfg.train.batch_size} must be divisible by the {dist.world} processes")
    f = facts(model)
    prompts = encode_chat(tokenizer, [r["prompt"] for r in rows])
    responses = tokenizer([task.target(r) for r in rows], add_special_tokens=False)["input_ids"]
    responses, cut = truncate(prompts, responses, getattr(cfg.algo, "max_length", None))  # optional field
    R = cfg.algo.response_length
    if R is not None:
        too_long = [i for i, r in enumerate(responses) if len(r) + (0 if cut[i] else 1) > R]
        if too_long:
            i = too_long[0]
            raise UserError(f"{cfg.data.task}/{cfg.data.split} row {i}: response of {len(responses[i])} tokens plus "
                             f"EOS exceeds algo.response_length={R} ({len(too_long)} rows do)")

    trainer = Trainer(model, cfg.model, cfg.train, dist, cfg.train.steps, seed=cfg.run.seed)
    compute = Compute(cfg.train.packing, cfg.train.logit_chunk)
    with Loop(cfg, run_dir, label, trainer, len(rows), streams=("noise",)) as loop:
        for step in loop.steps():
            tic = time.perf_counter()
            idx = loop.sampler.next(cfg.train.batch_size)
            batch = sft_batch([prompts[i] for i in idx], [responses[i] for i in idx], f.eos_token_id, f.pad_token_id,
                              R, compute, [cut[i] for i in idx])
            batch.input_ids, batch.attention_mask, batch.response_mask = (
                t.to(dist.device) for t in (batch.input_ids, batch.attention_mask, batch.response_mask))
            noise = hooks.sample_noise(batch, loop.generators["noise"], cfg)
            metrics = train_step(trainer, hooks, batch, noise, cfg)
            elapsed = time.perf_counter() - tic
            loop.end_step(step + 1, tokenizer, lambda: {
                **metrics, "optim/lr": trainer.lr, "data/epoch": loop.sampler.epoch,
                "perf/tokens_per_s": int(batch.attention_mask.sum()) / elapsed, "time/step_s": elapsed})
    return loop.outcome(tokenizer, model_name, init)
