"""`dare bench estimators`' BGPO memory probe: `python -m dare.app.probes.bgpo_memory N_T MODE` prints the peak
resident memory (KiB) of one BGPO update (its loss and backward) with N_T draws, every draw's graph alive (MODE
`full`) or one draw at a time (`bounded`: `algo.memory_bounded`), on a small LLaDA and 8 x 256 tokens, with the loss:
{"peak_kib", "loss"}. Run on the checkout (`dare.app.probes.run(..., baselines=True)`)."""

import json
import sys
from types import SimpleNamespace

import torch

from baselines.bgpo import algorithm as bgpo
from baselines.bgpo.config import Config
from dare.app.probes import peak_now, peak_start
from dare.models.llada import LLaDAConfig, LLaDAModelLM
from dare.train.estimators import Compute
from dare.train.hooks import bind
from dare.train.rl import replayed_loss


def main(argv: list[str]) -> dict:
    n_t, bounded = int(argv[0]), argv[1] == "bounded"
    torch.manual_seed(0)
    V, B, P, G = 512, 8, 32, 224
    model = LLaDAModelLM(LLaDAConfig(d_model=256, n_heads=4, n_layers=4, mlp_hidden_size=1024, vocab_size=V,
                                     embedding_size=V, mask_token_id=V - 1, eos_token_id=0, pad_token_id=0))
    seqs = torch.randint(1, V - 1, (B, P + G))
    batch = SimpleNamespace(sequences=seqs, attention_mask=torch.ones_like(seqs), prompt_length=P,
                            response_mask=torch.ones(B, G, dtype=torch.bool), compute=Compute(pack=False, chunk=256),
                            advantages=torch.linspace(-1, 1, B), num_sequences=B)
    cfg = Config()
    cfg.algo.n_t, cfg.algo.memory_bounded = n_t, bounded
    draw = bgpo.sample_noise(batch, torch.Generator().manual_seed(0), cfg)
    before = peak_start()
    parts = bgpo.draw_parts(draw, cfg)
    if parts is None:
        logps = bgpo.token_logps(model, batch, draw, cfg)
        loss, _ = bgpo.loss(logps, logps.detach(), None, batch, draw, cfg)
        loss.backward()
    else:
        loss, _, _ = replayed_loss(SimpleNamespace(backward=lambda x: x.backward()), bind(bgpo), model, batch, draw,
                                   parts, None, None, cfg)
    after = peak_now()
    return {"peak_kib": after - before, "loss": loss.item()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
