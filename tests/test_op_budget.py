"""A guard against creep in the rollout's step (issue 62, item 7): the operations each family's cached step
dispatches per decoder layer, counted on CPU with a `TorchDispatchMode` (every aten call that computes: views,
reshapes and transposes, which launch no kernel, are left out), must stay within a budget.

The step is the one the samplers run (`dare.rollout.core.StepForward`, eager): for the bidirectional families
the masked sampler's dual-cache step (a 4-token block against the cache of the whole canvas, `replace_position`
a device scalar), for the block-causal ones the block sampler's step (the model's block against the cache of the
committed blocks). A layer's count is the 3-layer model's minus the 2-layer model's (LLaDA2's first layer is
dense, the others are MoE), and the whole step is the 2-layer model's. The budgets are today's counts: a change that adds work to every
layer of every decoding step fails here with the ops that grew; one that removes work lowers the budget in the
same commit. What a count becomes on a GPU (fused or captured kernels) is `dare bench gpu`'s to measure."""

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dare.config import ScratchModelConfig
from dare.models import facts, new_model
from dare.models.registry import ATTENTION, FAMILIES
from dare.models.tokenizer import char_tokenizer
from dare.rollout.core import StepForward

VIEWS = {"aten.view", "aten._unsafe_view", "aten.t", "aten.transpose", "aten.select", "aten.slice", "aten.expand",
         "aten.split", "aten.split_with_sizes", "aten.unsqueeze", "aten.squeeze", "aten.permute", "aten.as_strided",
         "aten.alias", "aten.detach", "aten.unbind", "aten.narrow", "aten.reshape", "aten._reshape_alias",
         "aten.view_as", "aten.chunk"}
"""Ops that return a view (or a metadata change) of their input: no kernel, so not counted."""

BUDGET = {  # family: (ops per decoder layer, ops of the whole step of a 2-layer model), measured at this commit
    "llada": (39, 109),
    "dream": (39, 109),
    "sdar": (51, 139),
    "sdar_moe": (70, 177),
    "llada2": (85, 174),
    "lladamoe": (68, 167),
}


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name not in VIEWS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def step_ops(family: str, layers: int) -> collections.Counter:
    """The ops of one cached decoding step of a tiny `family` model with `layers` decoder layers."""
    tok = char_tokenizer("0123456789+=", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=2, n_layers=layers, mlp_hidden_size=64),
                      0).eval()
    run = StepForward(model, compiled=False)
    B, P, G = 2, 8, 8
    x = torch.randint(0, 10, (B, P + G), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, P + G, dtype=torch.long)
    with torch.no_grad():
        cache = run.cache(P + G, B)
        if ATTENTION[family] == "bidirectional":  # the dual cache: the whole canvas cached, the block replaced
            model(x, mask, past_key_values=cache, use_cache=True)
            with Ops() as counted:
                run(x[:, P:P + 4], mask[:, P:P + 4], cache, torch.tensor(P))
        else:  # the committed blocks cached, the current block decoded
            bs = facts(model).block_size
            model(x[:, :P], mask[:, :P], past_key_values=cache, use_cache=True)
            with Ops() as counted:
                run(x[:, P:P + bs], mask[:, P:P + bs], cache)
    return counted.ops


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_decoding_step_stays_within_its_op_budget(family):
    two, three = step_ops(family, 2), step_ops(family, 3)
    layer = three - two
    per_layer, whole = sum(layer.values()), sum(two.values())
    assert per_layer > 10 and layer["aten.mm"] + layer["aten.addmm"] + layer["aten._grouped_mm"] >= 3  # a layer
    budget_layer, budget_whole = BUDGET[family]
    assert per_layer <= budget_layer, (f"{family}: {per_layer} ops per decoder layer, budget {budget_layer}; "
                                       f"the layer's ops: {dict(layer.most_common())}")
    assert whole <= budget_whole, f"{family}: {whole} ops in the step, budget {budget_whole}: {dict(two.most_common())}"
