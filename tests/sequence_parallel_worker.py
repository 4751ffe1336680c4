"""One rank of `tests/test_sequence_parallel.py` (torchrun, 2 processes, gloo): for every family, a tiny
model's training forward and backward run once whole in this process and once sequence-parallel over the
two ranks (Ulysses: `dare.models.core.sequence_parallel`); rank 0 writes the largest differences of the
logits (or hidden states) and of the parameters' gradients (summed over the ranks, as FSDP reduces them),
over a length that divides by 2 and one that does not (right-padded inside the forward)."""

import json
import sys

import torch
import torch.distributed as dist

from dare.config import ScratchModelConfig
from dare.models import FAMILIES, facts, new_model
from dare.models.core import sequence_parallel
from dare.models.tokenizer import char_tokenizer

dist.init_process_group("gloo")
out = {}
for family, length in [(f, n) for f in FAMILIES for n in (8, 7)]:
    tok = char_tokenizer("0123456789+=", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 14, (2, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row
    block = facts(model).block_size is not None
    kwargs = {"attention_mask": mask}
    if block:  # the block-diffusion training layout [x_t ; x_0]
        noisy = torch.where(torch.rand(ids.shape, generator=g) < 0.5, facts(model).mask_token_id, ids)
        ids = torch.cat([noisy, ids], dim=1)
        kwargs["block_diffusion"] = True
    target = torch.randn(2, length, 32, generator=g)

    def run():
        model.zero_grad(set_to_none=True)
        hidden = model(input_ids=ids, output_logits=False, **kwargs).last_hidden_state
        logits = model(input_ids=ids, **kwargs).logits
        ((hidden - target) ** 2).sum().backward()
        (logits.float().logsumexp(-1).sum()).backward()
        # (an MoE expert no local token was routed to has no gradient on this rank: zero, as FSDP reduces it)
        grads = {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()}
        return logits.detach(), hidden.detach(), grads

    whole = run()
    with sequence_parallel(dist.group.WORLD):
        split = run()
    head = {n for n, p in model.named_parameters() if any(p is q for q in model.get_output_embeddings().parameters())}
    for name, grad in split[2].items():
        dist.all_reduce(grad)  # each rank holds its positions' share ...
        if name in head:
            grad /= dist.get_world_size()  # ... but the head, applied after the gather, runs in full on each
    assert split[0].shape == whole[0].shape and split[1].shape == whole[1].shape
    d = {"logits": (whole[0] - split[0]).abs().max().item(), "hidden": (whole[1] - split[1]).abs().max().item(),
         "grads": max((whole[2][n] - split[2][n]).abs().max().item() for n in whole[2]),
         "grad_scale": max(whole[2][n].abs().max().item() for n in whole[2])}
    worst = out.setdefault(family, {k: 0.0 for k in d})
    for k, v in d.items():
        worst[k] = max(worst[k], v)
if dist.get_rank() == 0:
    open(sys.argv[1], "w").write(json.dumps(out, indent=1))
dist.destroy_process_group()
