"""The RL recipe (GRPO family). One step:

    prompts -> rollout (G completions each, `dare.rollout`) -> rewards (the task's reward)
      -> advantages                                   algorithm.advantages(rewards (P, G), cfg)
      -> mu noise draws                               algorithm.sample_noise(batch, cfg, generator)
      -> old and reference log-probs on those draws   algorithm.token_logps(model, batch, noise)
      -> mu policy updates                            algorithm.loss(logps, old, ref, batch, cfg)

The loop knows nothing about any particular algorithm: what noise an estimator needs, how
log-probs are estimated and what the loss is all come from the baseline's `algorithm.py`.
The same noise draw is used for the policy, old and reference log-probs of an update, so their
ratio compares like with like. With one update per batch (mu = 1) the old log-probs equal the
current ones by construction, so they are not recomputed: `old = logps.detach()` (ratio = 1).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from dare.data import TASKS, load_split
from dare.models import encode_chat, facts
from dare.rollout import decode_responses, generate, left_pad
from dare.train.common import (EpochSampler, MetricsLog, build_model, clip_and_step, data_identity, lr_factor,
                               make_optimizer, resume, training_state, StopSignals)
from dare.utils import UserError, make_generator

REQUIRED = ("advantages", "sample_noise", "token_logps", "loss", "uses_reference")


@dataclass
class RLBatch:
    sequences: torch.Tensor
    """(B, P + G) left-padded prompts and their sampled completions, B = prompts x group size."""
    attention_mask: torch.Tensor
    """(B, P + G) 0 on prompt padding."""
    prompt_length: int
    response_mask: torch.Tensor
    """(B, G) bool: completion tokens up to and including the first EOS (the loss mask)."""
    step_map: torch.Tensor
    """(B, G) the decoding step that committed each completion token."""
    rewards: torch.Tensor
    """(B,)"""
    advantages: torch.Tensor
    """(B,)"""
    group_size: int

    @property
    def responses(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_length:]

    @property
    def prompt_mask(self) -> torch.Tensor:
        return self.attention_mask[:, :self.prompt_length].bool()


def run(cfg, algo, run_dir, label: str = "rl") -> dict:
    if not cfg.model.path:
        raise UserError("RL starts from a trained checkpoint: set model.path=<folder>")
    task = TASKS[cfg.data.task]
    rows = load_split(cfg.data.task, cfg.data.split)
    model, tokenizer, model_name, init = build_model(cfg.model, task, cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if algo.uses_reference(cfg.algo) else None
    f = facts(model)
    prompts = encode_chat(tokenizer, [r["prompt"] for r in rows])
    n_prompts, G, mu = cfg.rl.prompts_per_step, cfg.rl.group_size, cfg.rl.num_iterations

    total = cfg.train.steps
    optimizer = make_optimizer(model, cfg.train)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total * mu, cfg.train))
    sampler = EpochSampler(len(rows), make_generator(cfg.run.seed, "data"))
    rollout_gen = make_generator(cfg.run.seed, "rollout")
    noise_gen = make_generator(cfg.run.seed, "noise")

    generators = {"rollout": rollout_gen, "noise": noise_gen}
    ckpt, start, elapsed0 = resume(run_dir, model, optimizer, scheduler, sampler, generators, label)
    log = MetricsLog(run_dir, total, start, label)
    t0 = time.perf_counter()

    with StopSignals() as stop:
        for step in range(start, total):
            # --- rollout: G completions per prompt, sampled by the current policy
            tic = time.perf_counter()
            row_of = [i for i in sampler.next(n_prompts) for _ in range(G)]  # each prompt G times, grouped
            ids, mask = left_pad([prompts[i] for i in row_of], f.pad_token_id)
            model.eval()
            out = generate(model, ids, mask, cfg.rl.rollout, rollout_gen)
            texts = decode_responses(tokenizer, out.responses, f.eos_token_id)
            rewards = torch.tensor(task.rewards(texts, [rows[i] for i in row_of], style=cfg.data.reward),
                                   dtype=torch.float32, device=out.sequences.device)
            advantages = algo.advantages(rewards.view(n_prompts, G), cfg.algo).reshape(-1)
            batch = RLBatch(out.sequences, out.attention_mask, out.prompt_length, out.response_mask, out.step_map,
                            rewards, advantages, G)
            t_rollout = time.perf_counter() - tic

            # --- old and reference log-probs, on the same noise draws the updates will use
            tic = time.perf_counter()
            noises = [algo.sample_noise(batch, cfg.algo, noise_gen) for _ in range(mu)]
            with torch.no_grad():
                old = [algo.token_logps(model, batch, z) for z in noises] if mu > 1 else None
                ref = [algo.token_logps(ref_model, batch, z) for z in noises] if ref_model is not None else None
            t_logp = time.perf_counter() - tic

            # --- mu policy updates on this batch
            tic = time.perf_counter()
            model.train()
            sums: dict[str, float] = {}
            for n in range(mu):
                logps = algo.token_logps(model, batch, noises[n])
                loss, metrics = algo.loss(logps, old[n] if old else logps.detach(), ref[n] if ref else None, batch, cfg.algo)
                loss.backward()
                metrics = {"loss/total": loss.item(), **metrics,
                           "optim/grad_norm": clip_and_step(model, optimizer, scheduler, cfg.train.max_grad_norm)}
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v / mu
            t_update = time.perf_counter() - tic

            done = step + 1
            if done % cfg.run.log_every == 0 or done == total:
                grouped = rewards.view(n_prompts, G)
                log.log(done, {"rollout/reward_mean": rewards.mean().item(), "rollout/reward_std": rewards.std().item(),
                               "rollout/zero_std_groups": (grouped.std(dim=1) == 0).float().mean().item(),
                               "rollout/response_tokens": out.response_mask.sum(1).float().mean().item(),
                               **sums, "optim/lr": scheduler.get_last_lr()[0],
                               "time/rollout_s": t_rollout, "time/logp_s": t_logp, "time/update_s": t_update})
            ckpt.after_step(done, total, cfg.run.save_every, stop, model, tokenizer, lambda: training_state(
                optimizer, scheduler, sampler, generators, elapsed0 + time.perf_counter() - t0))

    return {"model": model, "tokenizer": tokenizer, "model_name": model_name, "init": init, "steps": total,
            "data": data_identity(cfg.data.task, cfg.data.split), "elapsed_s": elapsed0 + time.perf_counter() - t0}
