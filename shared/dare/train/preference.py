"""The preference recipe (DPO family: VRPO; KTO: ELBO-KTO): batches of (prompt, chosen, rejected), or of
unpaired (prompt, response, label) examples (`data.unpaired`) -> sequence log-likelihood estimates of the policy and
the reference on the SAME noise -> `algorithm.loss`.

    noise   = sample_noise(batch, generator, cfg)               drawn once for the whole step
    ref     = logps(reference, micro, noise, cfg)               (B, K), no grad
    policy  = logps(model, micro, noise, cfg)                   (B, K)
    loss    = loss(policy, ref, micro, noise, cfg)              normalized by batch.num_pairs
(the hooks of the baseline's algorithm.py; their contract is `dare.train.hooks`)

Batch layout (`PreferenceBatch`): pairs are rows, so splitting over processes and micro-batches
never separates a chosen response from its rejected one: (B, 2, L) with index 0 = chosen and
1 = rejected, each the left-padded prompt then the response and EOS (one EOS; pairs share the
prompt and are padded to a common length with attention 0 after the EOS). Unpaired examples are rows of one
response, (B, 1, L), with `labels` (B,): each pair of the task gives two (`unpaired`).

Sharing the noise between policy and reference is the variance reduction every ELBO-based DPO
needs (VRPO's antithetic sampling); the recipe guarantees it by construction.

An algorithm whose estimate sums over many draws (VRPO's n_t masks) can name parts of its draw
(`draw_parts`): the policy's gradient is then backpropagated one part at a time (`replayed_loss`),
so the activations of one part are alive instead of all n_t; the loss and gradient are the same, at
the cost of one more forward per part.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dare.data import TASKS, load_split
from dare.models import encode_chat, facts
from dare.train.batches import backward_by_parts, take, updates
from dare.train.loop import Loop, build_model
from dare.train.dist import setup_dist
from dare.train.trainer import Trainer
from dare.train.estimators import Compute
from dare.train.hooks import PreferenceHooks
from dare.utils import UserError

@dataclass
class PreferenceBatch:
    input_ids: torch.Tensor
    """(B, K, L): the K responses of each row, [chosen, rejected] for a pair (K = 2), the one response of an
    unpaired example (K = 1, `data.unpaired`): left-padded prompt, response, EOS, right padding."""
    attention_mask: torch.Tensor
    """(B, K, L): 0 on padding (left of the prompt, right of the EOS)."""
    response_mask: torch.Tensor
    """(B, K, L) bool: response tokens and their EOS."""
    num_pairs: int = 0
    """Rows in the whole step (pairs, or unpaired examples; all processes, all micro-batches): the loss normalizer."""
    compute: Compute = Compute()
    labels: torch.Tensor | None = None
    """(B,) unpaired examples only: 1 where the response is desirable, 0 where it is not."""


def preference_batch(prompts, responses, eos_id: int, pad_id: int, compute: Compute = Compute(), labels=None):
    """A batch of B rows from `responses`, a list of K lists of B token lists ([chosen, rejected] for pairs, [one]
    with `labels` for unpaired examples), each after its row's prompt."""
    P = max(len(p) for p in prompts)
    R = max(len(r) for side in responses for r in side) + 1
    B, K = len(prompts), len(responses)
    ids = torch.full((B, K, P + R), pad_id, dtype=torch.long)
    attention = torch.zeros((B, K, P + R), dtype=torch.long)
    response = torch.zeros((B, K, P + R), dtype=torch.bool)
    for i, p in enumerate(prompts):
        for j, side in enumerate(responses):
            r = side[i]
            ids[i, j, P - len(p):P] = torch.tensor(p)
            ids[i, j, P:P + len(r) + 1] = torch.tensor(r + [eos_id])
            attention[i, j, P - len(p):P + len(r) + 1] = 1
            response[i, j, P:P + len(r) + 1] = True
    return PreferenceBatch(ids, attention, response, B, compute,
                           None if labels is None else torch.tensor(labels, dtype=torch.long))


def unpaired(prompts: list, chosen: list, rejected: list) -> tuple[list, list, list]:
    """`data.unpaired`: n pairs -> 2n examples (prompts, responses, labels): pair i's chosen response is example
    2i (label 1), its rejected one example 2i + 1 (label 0); the step's sampler shuffles them apart."""
    return ([p for p in prompts for _ in (0, 1)], [r for pair in zip(chosen, rejected) for r in pair],
            [label for _ in prompts for label in (1, 0)])


def run(cfg, hooks: PreferenceHooks, run_dir, label: str = "preference") -> dict:
    dist = setup_dist(cfg.train.sequence_parallel)
    if cfg.train.batch_size % dist.world:
        raise UserError(f"train.batch_size={cfg.train.batch_size} must be divisible by the {dist.world} processes")
    task = TASKS[cfg.data.task]
    rows = load_split(cfg.data.task, cfg.data.split)
    missing = [i for i, r in enumerate(rows[:100]) if not {"chosen", "rejected"} <= set(r.get("extra") or {})]
    if missing:
        raise UserError(f"{cfg.data.task}/{cfg.data.split} row {missing[0]}: no extra.chosen/extra.rejected; "
                        "the preference recipe needs a preference task (e.g. ultrafeedback)")
    model, tokenizer, model_name, init = build_model(cfg.model, task, cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    f = facts(model)
    prompts = encode_chat(tokenizer, [r["prompt"] for r in rows])
    chosen = tokenizer([r["extra"]["chosen"] for r in rows], add_special_tokens=False)["input_ids"]
    rejected = tokenizer([r["extra"]["rejected"] for r in rows], add_special_tokens=False)["input_ids"]

    if cfg.data.unpaired:
        prompts, responses, labels = unpaired(prompts, chosen, rejected)
        sides = [responses]
    else:
        sides, labels = [chosen, rejected], None

    trainer = Trainer(model, cfg.model, cfg.train, dist, cfg.train.steps, reference=True, seed=cfg.run.seed)
    compute = Compute(cfg.train.packing, cfg.train.logit_chunk)
    with Loop(cfg, run_dir, label, trainer, len(prompts), streams=("noise",)) as loop:
        for step in loop.steps():
            tic = time.perf_counter()
            idx = loop.sampler.next(cfg.train.batch_size)
            batch = preference_batch([prompts[i] for i in idx], [[side[i] for i in idx] for side in sides],
                                     f.eos_token_id, f.pad_token_id, compute,
                                     None if labels is None else [labels[i] for i in idx])
            batch.input_ids, batch.attention_mask, batch.response_mask = (
                t.to(dist.device) for t in (batch.input_ids, batch.attention_mask, batch.response_mask))
            if batch.labels is not None:
                batch.labels = batch.labels.to(dist.device)
            noise = hooks.sample_noise(batch, loop.generators["noise"], cfg)  # the whole step's draws, every rank
            n = batch.input_ids.shape[0]
            local, local_noise = take(batch, dist.shard(n), n), take(noise, dist.shard(n), n)
            m = local.input_ids.shape[0]

            def loss_of(micro, z, it, rows):
                with torch.no_grad(), trainer.reference() as ref_model:
                    ref = hooks.logps(ref_model, micro, z, cfg)
                trainer.model.train()
                parts = hooks.draw_parts(z, cfg)
                if parts is None:
                    return hooks.loss(hooks.logps(trainer.model, micro, z, cfg), ref, micro, z, cfg)
                return replayed_loss(trainer, hooks, micro, z, parts, ref, cfg)  # one part's graph alive at a time

            sums = updates(trainer, [(slice(0, m), local)], [local_noise], cfg.train.micro_batch_size, loss_of)
            elapsed = time.perf_counter() - tic
            loop.end_step(step + 1, tokenizer, lambda: {
                **sums, "optim/lr": trainer.lr, "data/epoch": loop.sampler.epoch,
                "perf/tokens_per_s": int(batch.attention_mask.sum()) / elapsed, "time/step_s": elapsed})
    return loop.outcome(tokenizer, model_name, init)


def replayed_loss(trainer, hooks: PreferenceHooks, batch: PreferenceBatch, draw, parts: list, ref, cfg):
    """The loss of `draw` with the policy's gradient backpropagated one part at a time (`backward_by_parts`): the
    `logps` of the parts add up to the whole draw's. Returns the loss, detached (already backpropagated), and its
    metrics."""
    loss, metrics, _ = backward_by_parts(lambda part: hooks.logps(trainer.model, batch, part, cfg), parts, sum,
                                         lambda total: hooks.loss(total, ref, batch, draw, cfg), trainer.backward)
    return loss, metrics
