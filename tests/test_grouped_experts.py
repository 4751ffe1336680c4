"""Grouped experts (`dare.models.blocks.Experts`) against the per-expert loops they replaced, at each
MoE family's released expert count and top-k with a shrunk width: bitwise in float32 on CPU, within
one bf16 ulp in bfloat16, equal gradients, experts that get no token, one token, the checkpoint's
parameter names, and the packed weights (views of one stack per projection)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from dare.models.blocks import Experts, SoftmaxTopKMoE, SwiGLU
from dare.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM, LLaDA2MoeSparseMoeBlock

HIDDEN = 64


# The former implementations, as they were (commit 711648e, shared/dare/models/blocks.py and llada2.py):
def softmax_topk_loop(moe: SoftmaxTopKMoE, x: torch.Tensor):
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    router_logits = moe.gate(x)
    weights = F.softmax(router_logits, dim=-1, dtype=torch.float)
    if hasattr(moe, "expert_bias"):
        weights = weights + moe.expert_bias
    weights, chosen = torch.topk(weights, moe.top_k, dim=-1)
    if moe.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(x.dtype)
    out = torch.zeros_like(x)
    for e in torch.unique(chosen).tolist():
        token, slot = torch.where(chosen == e)
        y = moe.experts[e](x[token]) * weights[token, slot, None]
        out.index_add_(0, token, y.to(x.dtype))
    return out.reshape(shape), router_logits


def llada2_loop(moe: LLaDA2MoeSparseMoeBlock, x: torch.Tensor):
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    chosen, weights, router_logits = moe.gate(flat)
    per_slot = flat.new_zeros(*chosen.shape, shape[-1])
    for e in torch.unique(chosen).tolist():
        token, slot = torch.where(chosen == e)
        per_slot[token, slot] = moe.experts[e](flat[token])
    y = (per_slot.float() * weights[..., None]).sum(dim=1).to(x.dtype).reshape(shape)
    return y + moe.shared_experts(x), router_logits


def llada2_config(**kw) -> LLaDA2MoeConfig:
    """LLaDA2.1-mini's routing (256 experts in 8 groups, keep 4, top-8, one shared expert), shrunk width."""
    base = dict(vocab_size=64, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, num_experts=256, num_shared_experts=1, num_experts_per_tok=8,
                n_group=8, topk_group=4, routed_scaling_factor=2.5, moe_intermediate_size=32, first_k_dense_replace=1,
                mask_token_id=63, pad_token_id=0, eos_token_id=1, embedding_dropout=0.0, attention_dropout=0.0,
                output_dropout=0.0)
    return LLaDA2MoeConfig(**{**base, **kw})


def moe_block(family: str, *, intermediate: int = 32, seed: int = 0):
    """(block, the former loop) at the family's released expert count and top-k."""
    torch.manual_seed(seed)
    if family == "llada2":  # LLaDA2.1-mini: 256 experts, top-8
        block = LLaDA2MoeSparseMoeBlock(llada2_config(moe_intermediate_size=intermediate))
        torch.nn.init.normal_(block.gate.weight, std=0.5)
        block.gate.expert_bias.normal_(std=0.1)
        return block, llada2_loop
    if family == "sdar_moe":  # SDAR-30B-A3B: 128 experts, top-8, renormalised
        block = SoftmaxTopKMoE(HIDDEN, intermediate, 128, 8, norm_topk_prob=True)
    else:  # LLaDA-MoE-7B-A1B: 64 experts, top-8, not renormalised, expert bias
        block = SoftmaxTopKMoE(HIDDEN, intermediate, 64, 8, norm_topk_prob=False, expert_bias=True)
        block.expert_bias.normal_(std=0.01)
    return block, softmax_topk_loop


FAMILIES = ["llada2", "sdar_moe", "lladamoe"]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tokens,intermediate", [(1, 32), (37, 32), (300, 64)])
def test_grouped_experts_are_bitwise_the_loop_in_float32(family, tokens, intermediate):
    """Bitwise where the experts' width is a multiple of 32, as in every released MoE (512, 768, 1024):
    on CPU `torch._grouped_mm` multiplies each group as the loop's matmul did; SiLU's vectorised loop
    rounds a tensor's last few elements differently, so at other widths see the next test."""
    block, loop = moe_block(family, intermediate=intermediate)
    x = torch.randn(1, tokens, HIDDEN)
    with torch.no_grad():
        got, got_logits = block(x)
        want, want_logits = loop(block, x)
    assert torch.equal(bits(got), bits(want)) and torch.equal(got_logits, want_logits)
    if tokens == 1:  # most experts get no token
        chosen = block.gate(x.reshape(-1, HIDDEN))[0] if family == "llada2" else torch.topk(got_logits, 8).indices
        assert chosen.unique().numel() == 8


@pytest.mark.parametrize("family", FAMILIES)
def test_at_other_widths_equal_to_float32_rounding(family):
    block, loop = moe_block(family, intermediate=24)
    x = torch.randn(1, 300, HIDDEN)
    with torch.no_grad():
        torch.testing.assert_close(block(x)[0], loop(block, x)[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_within_one_ulp_of_the_loop(family):
    block, loop = moe_block(family)
    block = block.to(torch.bfloat16)
    x = torch.randn(2, 40, HIDDEN, dtype=torch.bfloat16)
    with torch.no_grad():
        got, _ = block(x)
        want, _ = loop(block, x)
    ulp = torch.finfo(torch.bfloat16).eps * want.float().abs().clamp(min=torch.finfo(torch.bfloat16).tiny)
    diff = (got.float() - want.float()).abs()
    # one ulp of the larger-magnitude neighbour: the bf16 spacing at |want| (power-of-two floor) or above
    spacing = 2.0 ** torch.floor(torch.log2(want.float().abs().clamp(min=1e-30))) * torch.finfo(torch.bfloat16).eps
    assert bool((diff <= torch.maximum(spacing, ulp)).all()), float(diff.max())


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_equal_the_loop(family):
    block, loop = moe_block(family, intermediate=24)
    x = torch.randn(1, 50, HIDDEN)
    upstream = torch.randn(1, 50, HIDDEN)
    grads = []
    for run in (lambda b, t: b(t), loop):
        block.zero_grad()
        xi = x.clone().requires_grad_()
        (run(block, xi)[0] * upstream).sum().backward()
        grads.append((xi.grad, {n: p.grad.clone() if p.grad is not None else None for n, p in block.named_parameters()}))
    (gx, gp), (wx, wp) = grads
    torch.testing.assert_close(gx, wx, rtol=1e-6, atol=1e-7)
    assert gp.keys() == wp.keys()
    for name in gp:
        if wp[name] is None:  # an expert no token chose
            assert gp[name] is None or not gp[name].any(), name
        else:
            torch.testing.assert_close(gp[name], wp[name], rtol=1e-6, atol=1e-7, msg=name)


def test_an_expert_chosen_by_no_token_and_the_loop_switch():
    experts = Experts(SwiGLU(8, 32) for _ in range(5))
    x = torch.randn(3, 8)
    chosen = torch.tensor([[4, 0], [0, 4], [4, 2]])  # experts 1 and 3 get nothing
    with torch.no_grad():
        got = experts(x, chosen)
        experts.impl = "loop"
        want = experts(x, chosen)
        assert torch.equal(got, want)
        torch.testing.assert_close(got[1, 1], experts[4](x[1]))  # (a matmul of one row rounds differently)
        torch.testing.assert_close(got[2, 1], experts[2](x[2]))


def test_the_weights_are_packed_once_into_one_stack_per_projection_with_the_same_parameters():
    block, _ = moe_block("sdar_moe")
    params = dict(block.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    with torch.no_grad():
        block(torch.randn(4, HIDDEN))
        gate_stack = block.experts.stacked()[0]
    assert dict(block.named_parameters()) == params  # the same Parameter objects (an optimizer keeps them)
    assert gate_stack.shape == (128, 32, HIDDEN)
    for e in (0, 77, 127):
        w = block.experts[e].gate_proj.weight
        assert w.data_ptr() == gate_stack[e].data_ptr() and torch.equal(w, before[f"experts.{e}.gate_proj.weight"])
    with torch.no_grad():  # an in-place update of a parameter is seen by the stack (an optimizer step)
        block.experts[5].up_proj.weight.add_(1.0)
        assert torch.equal(block.experts.stacked()[1][5], before["experts.5.up_proj.weight"] + 1.0)
    # a copy and a dtype change pack their own weights (float64: the fallback of one matmul per expert)
    twin = copy.deepcopy(block).double()
    x = torch.randn(3, HIDDEN, dtype=torch.float64)
    with torch.no_grad():
        twin.experts.impl = "loop"
        want = twin.experts(x, torch.tensor([[1, 2], [3, 4], [5, 6]]))
        twin.experts.impl = "grouped"
        got = twin.experts(x, torch.tensor([[1, 2], [3, 4], [5, 6]]))
        assert torch.equal(got, want) and twin.experts.stacked()[0].dtype == torch.float64
    assert twin.experts[0].gate_proj.weight.data_ptr() != block.experts[0].gate_proj.weight.data_ptr()


def test_a_view_of_a_larger_buffer_is_not_repointed():
    """FSDP's gathered parameters are views into one all-gather buffer: packing must leave them alone."""
    block, _ = moe_block("lladamoe")
    buffer = torch.cat([p.detach().reshape(-1) for p in block.experts.parameters()])
    offset = 0
    for p in block.experts.parameters():
        p.data = buffer[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    assert not block.experts.pack()
    ptr = block.experts[3].down_proj.weight.data_ptr()
    x = torch.randn(1, 20, HIDDEN)
    with torch.no_grad():
        got, _ = block(x)
        want, _ = softmax_topk_loop(block, x)
    assert torch.equal(got, want) and block.experts[3].down_proj.weight.data_ptr() == ptr


def test_checkpoint_names_and_values_round_trip_after_packing(tmp_path):
    model = LLaDA2MoeModelLM(llada2_config(num_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4))
    ids = torch.randint(2, 60, (2, 12))
    with torch.no_grad():
        want = model(ids).logits  # packs the experts
    assert model.model.layers[1].mlp.experts._packed()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert "model.layers.1.mlp.experts.15.down_proj.weight" in state and not any("_stacks" in k for k in state)
    model.save_pretrained(tmp_path)
    again = LLaDA2MoeModelLM.from_pretrained(tmp_path)
    assert again.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in again.state_dict().items())
    with torch.no_grad():
        assert torch.equal(again(ids).logits, want)
        for layer in again.model.layers[1:]:
            layer.mlp.experts.impl = "loop"
        assert torch.equal(again(ids).logits, want)


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_grouped_experts_on_cuda_in_bfloat16_match_the_loop(family):
    """On the GPU (CUTLASS grouped kernel for bfloat16 on sm90+): the released routing at the released widths
    (hidden 2048, expert widths 512 / 768 / 1024), 2048 tokens, against the per-expert loop; gradients too."""
    from dare.app.bench_gpu import moe_layer

    block, _ = moe_layer(family, "cuda", "bfloat16")
    loop = llada2_loop if family == "llada2" else softmax_topk_loop
    x = torch.randn(2048, block.gate.weight.shape[1], device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got, want = block(x)[0].float(), loop(block, x)[0].float()
    scale = want.abs().max()
    assert float((got - want).abs().max()) <= 2 * torch.finfo(torch.bfloat16).eps * float(scale)
    for p in block.parameters():
        p.requires_grad_(True)
    xi = x[:256].clone().requires_grad_()
    block(xi)[0].float().square().sum().backward()
    g_grouped = xi.grad.float().clone()
    xi.grad = None
    loop(block, xi)[0].float().square().sum().backward()
    torch.testing.assert_close(g_grouped, xi.grad.float(), rtol=2e-2, atol=2e-2 * float(xi.grad.abs().max()))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_grouped_path_never_reads_a_tensor_on_the_host(family, monkeypatch):
    """No `.item()`, `.tolist()`, `bool()`, `int()` or `float()` of a tensor in a MoE layer's forward (each is a
    device sync on a GPU and breaks a CUDA graph); the former loop needs them."""
    block, loop = moe_block(family)
    x = torch.randn(40, HIDDEN)
    with torch.no_grad():
        block(x)  # packs the weights (once, outside the hot path)
        reads = []
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name: reads.append(_n) or _o(self, *a))
        block(x)
        assert reads == []
        loop(block, x)
        assert reads  # the check can fail: the loop reads the chosen experts


def test_a_packed_moe_layer_compiles_without_a_graph_break():
    """The captured decode step traces the MoE layer: once packed (by an eager forward), the compiled layer reads
    the stacks without comparing data pointers (which dynamo cannot trace) and gives the eager output. bfloat16:
    the fake kernel of `_grouped_mm` that tracing uses takes bfloat16."""
    block, _ = moe_block("sdar_moe")
    block = block.to(torch.bfloat16)
    x = torch.randn(12, HIDDEN, dtype=torch.bfloat16)
    with torch.no_grad():
        want = block(x)[0]  # packs
        got = torch.compile(block, fullgraph=True, backend="aot_eager")(x)[0]
    assert torch.equal(got, want)
