"""`dare bench train`'s VRPO memory probe: `python -m dare.app.probes.vrpo_memory N_T MODE PAIRS LENGTH WIDTH` prints
the peak resident memory (KiB) of one VRPO update (its DPO loss and backward) with N_T draws, every draw's graph
alive (MODE `full`) or one draw at a time (`bounded`: `algo.memory_bounded`), on PAIRS pairs of a 32-token prompt and
LENGTH-token responses and a 4-layer LLaDA of width WIDTH, with the loss and the gradient norm:
{"peak_kib", "loss", "grad_norm"}. Run on the checkout (`dare.app.probes.run(..., baselines=True)`)."""

import json
import sys

import torch

from baselines.vrpo import algorithm as vrpo
from baselines.vrpo.config import Config
from dare.app.probes import peak_now, peak_start
from dare.models.llada import LLaDAConfig, LLaDAModelLM
from dare.train.estimators import Compute
from dare.train.hooks import bind
from dare.train.preference import preference_batch, replayed_loss


def main(argv: list[str]) -> dict:
    n_t, bounded, pairs, length, width = int(argv[0]), argv[1] == "bounded", int(argv[2]), int(argv[3]), int(argv[4])
    torch.manual_seed(0)
    V, P = 512, 32
    model = LLaDAModelLM(LLaDAConfig(d_model=width, n_heads=4, n_layers=4, mlp_hidden_size=4 * width, vocab_size=V,
                                     embedding_size=V, mask_token_id=V - 1, eos_token_id=0, pad_token_id=0))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, V - 1, (P,), generator=g).tolist() for _ in range(pairs)]
    chosen = [torch.randint(1, V - 1, (length,), generator=g).tolist() for _ in range(pairs)]
    rejected = [torch.randint(1, V - 1, (length,), generator=g).tolist() for _ in range(pairs)]
    batch = preference_batch(prompts, [chosen, rejected], 0, 0, Compute(pack=False, chunk=256))
    cfg = Config()
    cfg.algo.n_t, cfg.algo.memory_bounded = n_t, bounded
    draw = vrpo.sample_noise(batch, torch.Generator().manual_seed(0), cfg)
    with torch.no_grad():
        ref = vrpo.logps(model, batch, draw, cfg) - 1.0
    before = peak_start()
    parts = vrpo.draw_parts(draw, cfg)
    if parts is None:
        loss, _ = vrpo.loss(vrpo.logps(model, batch, draw, cfg), ref, batch, draw, cfg)
        loss.backward()
    else:
        trainer = type("T", (), {"model": model, "backward": staticmethod(lambda x: x.backward())})
        loss, _ = replayed_loss(trainer, bind(vrpo), batch, draw, parts, ref, cfg)
    after = peak_now()
    grad = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None) ** 0.5
    return {"peak_kib": after - before, "loss": loss.item(), "grad_norm": grad}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
