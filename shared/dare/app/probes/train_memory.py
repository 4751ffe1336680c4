"""`dare plan`'s calibration probe: `python -m dare.app.probes.train_memory D_MODEL LAYERS B L VOCAB CHECKPOINTING`
prints the peak resident memory (KiB) of two training steps (forward, chunked masked-token loss, backward, AdamW)
of a float32 LLaDA of that size on the CPU, counted from before the model is built: {"peak_kib"}."""

import json
import sys

import torch

from dare.app.probes import peak_now, peak_start
from dare.models.llada import LLaDAConfig, LLaDAModelLM
from dare.train.estimators import masked_logps


def config(d_model: int, layers: int, vocab: int) -> LLaDAConfig:
    return LLaDAConfig(d_model=d_model, n_heads=max(1, d_model // 64), n_kv_heads=max(1, d_model // 64),
                       n_layers=layers, mlp_hidden_size=4 * d_model, vocab_size=vocab, embedding_size=vocab,
                       max_sequence_length=4096, mask_token_id=vocab - 1, eos_token_id=0, pad_token_id=0)


def main(argv: list[str]) -> dict:
    d_model, layers, B, L, vocab, checkpointing = map(int, argv[:6])
    torch.manual_seed(0)
    before = peak_start()
    model = LLaDAModelLM(config(d_model, layers, vocab))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(1, vocab - 1, (B, L))
    where = torch.zeros(B, L, dtype=torch.bool)
    where[:, L // 2:] = True  # the completion half is scored
    x = torch.where(where, torch.full_like(ids, vocab - 1), ids)
    for _ in range(2):  # the second step runs with the optimizer's moments alive
        loss = -masked_logps(model, x, ids, where, chunk=1024).sum() / where.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"peak_kib": peak_now() - before}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
