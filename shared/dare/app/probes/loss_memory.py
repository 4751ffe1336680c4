"""`dare bench train`'s loss memory probe: `python -m dare.app.probes.loss_memory VARIANT VOCAB B L` prints the peak
resident memory (KiB) of one masked-token loss and its backward on a small LLaDA with a VOCAB-token vocabulary over
B x L tokens, from full logits (VARIANT `full`), from hidden states 256 positions at a time keeping each chunk's
log-softmax for backward (`chunked`) or recomputing it there (`fused`, `estimators.LinearLogps`), and the loss:
{"peak_kib", "loss"}."""

import json
import sys

import torch

from dare.app.probes import peak_now, peak_start
from dare.models import token_logits
from dare.models.llada import LLaDAConfig, LLaDAModelLM
from dare.train.estimators import masked_logps


def main(argv: list[str]) -> dict:
    variant, vocab, B, L = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    torch.manual_seed(0)
    cfg = LLaDAConfig(d_model=64, n_heads=4, n_layers=2, mlp_hidden_size=256, vocab_size=vocab, embedding_size=vocab,
                      mask_token_id=vocab - 1, eos_token_id=0, pad_token_id=0)
    model = LLaDAModelLM(cfg)
    ids = torch.randint(1, vocab - 1, (B, L))
    where = torch.rand(B, L) < 0.5
    x = torch.where(where, torch.full_like(ids, vocab - 1), ids)
    before = peak_start()
    if variant == "full":
        logp = torch.log_softmax(token_logits(model, x).float(), -1).gather(-1, ids[..., None]).squeeze(-1)
        loss = -(logp * where).sum() / where.sum()
    else:
        loss = -masked_logps(model, x, ids, where, chunk=256, fused=variant == "fused").sum() / where.sum()
    loss.backward()
    after = peak_now()
    return {"peak_kib": after - before, "loss": loss.item()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
