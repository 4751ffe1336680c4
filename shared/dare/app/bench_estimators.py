"""`dare bench estimators`: every likelihood estimator of `dare.train.estimators` side by side on one fixed
batch, and the memory of the memory-bounded (per-draw) update against the number of draws.

1. The batch: 8 addition test prompts of the demo's SFT checkpoint (or --checkpoint) with the completions it
   decodes greedily. Each estimator estimates each completion's log-likelihood (summed over its tokens) `draws`
   times with independent noise; the report gives, per estimator, the forwards one estimate costs, the mean over
   rows of the per-row standard deviation across draws (what the RL diagnostics log as estimator noise), and the
   mean difference to the exact ELBO (enumerated over every mask of the completion).
2. The memory: one BGPO update (its loss and backward) of a small LLaDA on 8 x 256 tokens in a fresh process
   for n_t = 1, 4, 16 draws, with every draw's graph alive and backpropagated one draw at a time; peak resident
   memory above the process's level before the update.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

from dare.app import probes
from dare.utils import atomic_write_json, fingerprint, now, runs_dir, shown_path


def _batch(model, tokenizer, rows: int = 8):
    import torch

    from dare.config import DecodingConfig
    from dare.data import load_split
    from dare.models import encode_chat, facts
    from dare.rollout import generate, left_pad
    from dare.train.estimators import Compute

    f = facts(model)
    test = load_split("addition", "test")[:rows]
    ids, mask = left_pad(encode_chat(tokenizer, [r["prompt"] for r in test]), f.pad_token_id)
    with torch.no_grad():
        out = generate(model, ids, mask, DecodingConfig(gen_length=4, block_length=4, steps=4))
    return SimpleNamespace(sequences=out.sequences, attention_mask=out.attention_mask, prompt_length=out.prompt_length,
                           response_mask=out.response_mask, step_map=out.step_map, block_size=f.block_size,
                           compute=Compute(pack=False))


def _exact_elbo(model, batch) -> list[float]:
    """Per row: sum over mask sizes l of the mean over l-subsets of the completion of sum log p / l."""
    import torch

    from dare.models import facts
    from dare.train.estimators import diffusion_logps

    P, G = batch.prompt_length, batch.sequences.shape[1] - batch.prompt_length
    subsets = [s for size in range(1, G + 1) for s in itertools.combinations(range(G), size)]
    where = torch.zeros((len(subsets), P + G), dtype=torch.bool)
    for k, s in enumerate(subsets):
        where[k, [P + i for i in s]] = True
    out = []
    with torch.no_grad():
        for b in range(batch.sequences.shape[0]):
            ids = batch.sequences[b].expand(len(subsets), -1)
            attn = batch.attention_mask[b].expand(len(subsets), -1)
            x = torch.where(where, facts(model).mask_token_id, ids)
            sums = diffusion_logps(model, x, ids, where, attn).sum(dim=1)
            total = 0.0
            for size in range(1, G + 1):
                picked = [k for k, s in enumerate(subsets) if len(s) == size]
                total += float(sums[picked].mean()) / size
            out.append(total)
    return out


def _estimators(model, batch):
    """name -> (forwards per estimate, fn(generator) -> (B,) estimate of each completion's log-likelihood)."""
    import torch

    from dare.train import noise
    from dare.train.estimators import (ar_prefix_logps, completion_logps, draw_logps, elbo, renyi_eubo,
                                       token_mean_elbo)

    P, G = batch.prompt_length, batch.sequences.shape[1] - batch.prompt_length
    completion = noise.completion(batch.attention_mask, P)
    prompt = batch.attention_mask.bool() & ~completion
    lengths = batch.response_mask.sum(dim=1).float()

    def one_step(g):
        masked = noise.full_completion(completion, prompt, 0.15, g)
        return (completion_logps(model, batch, masked) * batch.response_mask).sum(dim=1)

    def elbo_of(draw):
        return elbo(model, batch.sequences, batch.attention_mask, completion, draw)

    def spg(bound):
        def fn(g):
            segment = (torch.arange(G) // 2).expand(batch.sequences.shape[0], G)  # blocks of 2: 2 on 4 tokens
            draw = noise.block_random(batch.response_mask, segment, batch.attention_mask[:, :P].bool(), 2, g)
            logps = draw_logps(model, batch, draw.masked)
            scored = draw.masked[:, :, P:] & batch.response_mask[:, None, :]
            value = (token_mean_elbo(logps, scored) if bound == "elbo"
                     else renyi_eubo(logps, scored, 1.0 / draw.t.clamp(min=1e-8), 1.5))
            return value * lengths  # its per-token averages, on the sum scale
        return fn

    table = {
        "one-step mean-field (d1, wd1)": (1, one_step),
        "ELBO, stratified counts, n=1": (1, lambda g: elbo_of(noise.elbo_draws(completion, 1, g, "count"))),
        "ELBO, stratified counts, n=4": (4, lambda g: elbo_of(noise.elbo_draws(completion, 4, g, "count"))),
        "ELBO, stratified counts, n=16 (BGPO)": (16, lambda g: elbo_of(noise.elbo_draws(completion, 16, g, "count"))),
        "ELBO, stratified times, n=4 (VRPO)": (4, lambda g: elbo_of(noise.elbo_draws(completion, 4, g, "time"))),
        "coupled pairs, 2 pairs (ESPO)": (4, lambda g: elbo_of(noise.complementary_pairs(completion, 2, g))),
        "Gauss-Legendre, 3 nodes (GDPO)": (3, lambda g: elbo_of(noise.quadrature(completion, 3, g))),
        "block-random ELBO x length, 2 draws (SPG)": (2, spg("elbo")),
        "block-random EUBO x length, beta 1.5 (SPG)": (2, spg("eubo")),
        "AR prefix (JustGRPO; exact AR order)": (G, lambda g: (ar_prefix_logps(model, batch) * batch.response_mask).sum(1)),
    }
    return table


def estimators_benchmark(checkpoint: str | None = None, draws: int = 64, memory_draws=(1, 4, 16),
                         out: str | None = None) -> dict:
    import statistics

    import torch

    from dare.app.bench import _demo_checkpoint
    from dare.models import load_pretrained, load_tokenizer
    from dare.train.estimators import spread

    ckpt = Path(checkpoint) if checkpoint else _demo_checkpoint("llada")
    model, tokenizer = load_pretrained(ckpt).eval(), load_tokenizer(ckpt)
    batch = _batch(model, tokenizer)
    exact = _exact_elbo(model, batch)
    report = {"kind": "bench.estimators", "schema_version": 1, "created": now(), "checkpoint": shown_path(ckpt),
              "draws": draws, "rows": len(exact), "exact_elbo": exact, "estimators": {}, "memory": {},
              **fingerprint()}
    print(f"estimator benchmark: {shown_path(ckpt)}, {len(exact)} addition completions of 4 tokens, {draws} draws "
          f"each; exact ELBO (enumerated) mean {statistics.mean(exact):.3f}")
    print(f"  {'estimator':42s} {'forwards':>8s} {'std':>7s} {'bias vs ELBO':>12s}")
    with torch.no_grad():
        for name, (forwards, fn) in _estimators(model, batch).items():
            mean, sd = spread(fn, draws)
            std, bias = float(sd.mean()), float((mean - torch.tensor(exact)).mean())
            report["estimators"][name] = {"forwards": forwards, "std": std, "bias_vs_exact_elbo": bias,
                                          "mean": float(mean.mean())}
            print(f"  {name:42s} {forwards:8d} {std:7.3f} {bias:12.3f}")
    if memory_draws:
        print("  BGPO update, peak memory above the start (8 x 256 tokens, d_model 256, 4 layers):")
    for n_t in memory_draws:
        row = {mode: probes.run("bgpo_memory", n_t, mode, baselines=True) for mode in ("full", "bounded")}
        report["memory"][str(n_t)] = {"full_mib": row["full"]["peak_kib"] / 1024,
                                      "bounded_mib": row["bounded"]["peak_kib"] / 1024,
                                      "loss_difference": abs(row["full"]["loss"] - row["bounded"]["loss"])}
        print(f"    n_t = {n_t:2d}: every graph alive {row['full']['peak_kib'] / 1024:7.0f} MiB, one draw at a time "
              f"{row['bounded']['peak_kib'] / 1024:7.0f} MiB (same loss within "
              f"{report['memory'][str(n_t)]['loss_difference']:.1e})")
    path = Path(out) if out else runs_dir() / "bench" / f"estimators-{now().replace(':', '')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, report)
    print(f"  -> {shown_path(path)}")
    return report
