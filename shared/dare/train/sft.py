"""The supervised recipe: batches of (prompt, response) -> `algorithm.loss` -> AdamW.

Batch layout (`SFTBatch`), as in LLaDA's SFT guideline: the chat-templated prompt, left-padded
(padding hidden from attention), then the response followed by EOS tokens up to the response
length; the EOS padding is part of the response and is trained on, which is how the model
learns to stop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dare.data import TASKS, load_split
from dare.models import encode_chat, facts
from dare.train.common import (EpochSampler, MetricsLog, build_model, clip_and_step, data_identity, lr_factor,
                               make_optimizer, resume, training_state, StopSignals)
from dare.utils import UserError, make_generator

REQUIRED = ("loss",)


@dataclass
class SFTBatch:
    input_ids: torch.Tensor
    """(B, L): left-padded prompt, then the response and its EOS padding."""
    attention_mask: torch.Tensor
    """(B, L): 0 on the prompt's left padding."""
    response_mask: torch.Tensor
    """(B, L) bool: response positions (answer + EOS padding); the prompt is never noised."""


def sft_batch(prompts: list[list[int]], responses: list[list[int]], eos_id: int, pad_id: int,
              response_length: int | None) -> SFTBatch:
    R = response_length or max(len(r) for r in responses) + 1
    P = max(len(p) for p in prompts)
    B = len(prompts)
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attention = torch.zeros((B, P + R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, P - len(p):P] = torch.tensor(p)
        ids[i, P:] = torch.tensor(r + [eos_id] * (R - len(r)))
        attention[i, P - len(p):] = 1
    response_mask = torch.zeros((B, P + R), dtype=torch.bool)
    response_mask[:, P:] = True
    return SFTBatch(ids, attention, response_mask)


def run(cfg, algo, run_dir, label: str = "sft") -> dict:
    task = TASKS[cfg.data.task]
    rows = load_split(cfg.data.task, cfg.data.split)
    model, tokenizer, model_name, init = build_model(cfg.model, task, cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    f = facts(model)
    prompts = encode_chat(tokenizer, [r["prompt"] for r in rows])
    responses = tokenizer([task.target(r) for r in rows], add_special_tokens=False)["input_ids"]
    R = cfg.algo.response_length
    if R is not None:
        too_long = [i for i, r in enumerate(responses) if len(r) + 1 > R]
        if too_long:
            i = too_long[0]
            raise UserError(f"{cfg.data.task}/{cfg.data.split} row {i}: response of {len(responses[i])} tokens plus "
                             f"EOS exceeds algo.response_length={R} ({len(too_long)} rows do)")

    total = cfg.train.steps
    optimizer = make_optimizer(model, cfg.train)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, cfg.train))
    sampler = EpochSampler(len(rows), make_generator(cfg.run.seed, "data"))
    noise_gen = make_generator(cfg.run.seed, "noise")

    generators = {"noise": noise_gen}
    ckpt, start, elapsed0 = resume(run_dir, model, optimizer, scheduler, sampler, generators, label)
    log = MetricsLog(run_dir, total, start, label)
    t0 = time.perf_counter()

    model.train()
    with StopSignals() as stop:
        for step in range(start, total):
            idx = sampler.next(cfg.train.batch_size)
            batch = sft_batch([prompts[i] for i in idx], [responses[i] for i in idx], f.eos_token_id, f.pad_token_id, R)
            loss, metrics = algo.loss(model, batch, cfg.algo, noise_gen)
            loss.backward()
            grad_norm = clip_and_step(model, optimizer, scheduler, cfg.train.max_grad_norm)
            done = step + 1
            if done % cfg.run.log_every == 0 or done == total:
                log.log(done, {"loss/total": loss.item(), **metrics, "optim/grad_norm": grad_norm,
                               "optim/lr": scheduler.get_last_lr()[0], "data/epoch": sampler.epoch})
            ckpt.after_step(done, total, cfg.run.save_every, stop, model, tokenizer, lambda: training_state(
                optimizer, scheduler, sampler, generators, elapsed0 + time.perf_counter() - t0))

    return {"model": model, "tokenizer": tokenizer, "model_name": model_name, "init": init, "steps": total,
            "data": data_identity(cfg.data.task, cfg.data.split), "elapsed_s": elapsed0 + time.perf_counter() - t0}
