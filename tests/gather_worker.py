"""One rank of `tests/test_gathered_rollout.py` (launched by torchrun over gloo): each case's checkpoint sharded
with FSDP2 as training shards it, this rank's prompts decoded three times (FSDP's per-forward gathering, then
twice inside `dare.train.dist.gathered` with a training forward and backward between), the all-gathers of each
rollout counted, and what the units look like after the context, saved for the test to compare."""

import json
import sys

import torch
import torch.distributed as td
from torch.distributed.fsdp import FSDPModule

from dare.config import DecodingConfig
from dare.models import facts, load_pretrained
from dare.rollout import generate, left_pad
from dare.train.dist import gathered, setup_dist
from dare.train.trainer import shard

spec, out = sys.argv[1:3]
spec = json.loads(open(spec).read())
dist = setup_dist()

calls = {"n": 0}
for name in ("all_gather_single", "all_gather_into_tensor"):  # FSDP2's all-gather (torch 2.13: the first)
    original = getattr(td, name, None)
    if original is not None:
        def counted(*args, _original=original, **kwargs):
            calls["n"] += 1
            return _original(*args, **kwargs)
        setattr(td, name, counted)


def rollout(model, ids, mask, decoding, gather: bool) -> tuple:
    calls["n"] = 0
    with torch.no_grad(), gathered(model, gather):
        result = generate(model, ids, mask, decoding, torch.Generator().manual_seed(0))
    return result, calls["n"]


def units_state(model) -> dict:
    """Per FSDP unit: its parameters sharded, and whether it reshards after forward (FSDP's private state)."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    groups = [(m, g) for m in units for g in m._get_fsdp_state()._fsdp_param_groups]
    return {"units": len(groups), "sharded": [g.is_sharded for _, g in groups],
            "reshards": [g.post_forward_mesh_info is not None for _, g in groups]}


results = []
for case in spec["cases"]:
    model = load_pretrained(case["checkpoint"]).eval()
    shard(model, bf16=False)
    decoding = DecodingConfig(**case["decoding"])
    ids, mask = left_pad(case["prompts"][dist.rank], facts(model).pad_token_id)
    plain, n_plain = rollout(model, ids, mask, decoding, gather=False)
    before = units_state(model)
    first, n_first = rollout(model, ids, mask, decoding, gather=True)
    after = units_state(model)
    loss = model(input_ids=ids).logits.float().pow(2).mean()  # a training forward and backward in between
    loss.backward()
    second, n_second = rollout(model, ids, mask, decoding, gather=True)
    results.append({"plain": plain.sequences, "first": first.sequences, "second": second.sequences,
                    "nfe": plain.nfe, "gathers": [n_plain, n_first, n_second], "before": before, "after": after})
torch.save(results, f"{out}/rank{dist.rank}.pt")
