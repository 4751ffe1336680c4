"""`dare bench rollout`: sampler throughput on a checkpoint (default: a random tiny LLaDA).

Prints tokens/s, forward passes (NFE) and tokens committed per forward for a batch of prompts
from the addition task. Timings are wall-clock medians over `repeats` runs after one warm-up.
"""

from __future__ import annotations

import statistics
import time


def rollout_benchmark(checkpoint: str | None, overrides: list[str], repeats: int = 3, batch_size: int = 8) -> dict:
    import torch

    from dare.config import DecodingConfig, ScratchModelConfig
    from dare.config import load as load_config
    from dare.data import TASKS, load_split
    from dare.models import encode_chat, facts, load_pretrained, load_tokenizer, new_model
    from dare.models.tokenizer import char_tokenizer
    from dare.rollout import generate, left_pad
    from dare.utils import make_generator

    params = load_config(DecodingConfig, None, overrides)
    if checkpoint:
        model, tokenizer, label = load_pretrained(checkpoint), load_tokenizer(checkpoint), checkpoint
    else:
        tokenizer = char_tokenizer(TASKS["addition"].alphabet, "llada")
        model, label = new_model("llada", tokenizer, ScratchModelConfig(), seed=0), "random tiny llada"
    model.eval()
    rows = load_split("addition", "test")[:batch_size]
    ids, mask = left_pad(encode_chat(tokenizer, [r["prompt"] for r in rows]), facts(model).pad_token_id)

    def once(seed):
        t0 = time.perf_counter()
        out = generate(model, ids, mask, params, make_generator(seed, "bench"))
        return time.perf_counter() - t0, out

    once(-1)  # warm-up
    runs = [once(i) for i in range(repeats)]
    seconds = statistics.median(t for t, _ in runs)
    out = runs[0][1]
    tokens = ids.shape[0] * params.gen_length
    report = {"model": label, "batch_size": ids.shape[0], "gen_length": params.gen_length,
              "block_length": params.block_length, "steps": params.steps, "seconds": seconds,
              "tokens_per_s": tokens / seconds, "nfe": out.nfe, "tokens_per_forward": params.gen_length / out.nfe,
              "threads": torch.get_num_threads()}
    print(f"rollout benchmark: {label}, batch {report['batch_size']}, gen {params.gen_length}, block "
          f"{params.block_length}, steps {params.steps}, {report['threads']} threads")
    print(f"  {report['tokens_per_s']:.1f} tokens/s   NFE {report['nfe']}   "
          f"{report['tokens_per_forward']:.2f} tokens/forward   {seconds:.3f}s per batch (median of {repeats})")
    return report
