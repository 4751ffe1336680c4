"""The logits-free loss: `LinearLogps` (the output head's log-probs recomputed in backward, chunk by chunk) gives
the values and gradients of the chunked path that keeps each chunk's log-softmax, within float32 rounding."""

import pytest
import torch

from dare.config import ScratchModelConfig
from dare.models import facts, new_model, output_head
from dare.models.llada import LLaDAConfig, LLaDAModelLM
from dare.models.tokenizer import char_tokenizer
from dare.train.estimators import (
    block_diffusion_logps, head_chunks, linear_head, liger_logps, LinearLogps, masked_logps,
)

N, H, V = 11, 8, 37


def reference(hidden, targets, weight, bias, temperature, support):
    """log p(targets) from full (N, V) float32 logits, the way the chunked path computes each chunk."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature
    if support is not None:
        logits = logits.masked_fill(~support, -torch.inf)
    return logits.log_softmax(-1).gather(-1, targets[:, None])[:, 0]


def grads(fn, hidden, weight, bias, upstream):
    """(values, d hidden, d weight, d bias) of sum(upstream x fn(hidden, weight, bias)): per-token weights, as a
    policy-gradient loss puts them."""
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in (hidden, weight, bias)]
    out = fn(*leaves)
    (out * upstream).sum().backward()
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("chunk", [1, 4, N, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("truncated", [False, True])
def test_linear_logps_equal_the_full_logits_in_values_and_gradients(chunk, temperature, truncated):
    g = torch.Generator().manual_seed(chunk)
    hidden = torch.randn(N, H, generator=g, requires_grad=True)
    weight = torch.randn(V, H, generator=g, requires_grad=True)
    bias = torch.randn(V, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (N,), generator=g)
    support = None
    if truncated:  # a top-k-like support that always keeps the target
        support = torch.rand(N, V, generator=g) < 0.4
        support[torch.arange(N), targets] = True
    upstream = torch.randn(N, generator=g)
    spans = head_chunks(torch.nn.Linear(1, 1), N, chunk, "cpu")
    want = grads(lambda h, w, b: reference(h, targets, w, b, temperature, support), hidden, weight, bias, upstream)
    got = grads(lambda h, w, b: LinearLogps.apply(h, targets, w, b, temperature, support, spans),
                hidden, weight, bias, upstream)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_frozen_head_gets_no_gradient_and_the_hidden_states_still_do():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, H, generator=g, requires_grad=True)
    weight = torch.randn(V, H, generator=g)  # LoRA: the head is frozen
    targets = torch.randint(0, V, (N,), generator=g)
    out = LinearLogps.apply(hidden, targets, weight, None, 1.0, None, head_chunks(torch.nn.Linear(1, 1), N, 3, "cpu"))
    out.sum().backward()
    want = torch.autograd.grad(reference(hidden, targets, weight, None, 1.0, None).sum(), hidden)[0]
    torch.testing.assert_close(hidden.grad, want, rtol=1e-5, atol=1e-5)
    assert weight.grad is None


def _tiny(family):
    tok = char_tokenizer("0123456789+=", family)
    return new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64),
                     seed=0), tok


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2"])
def test_the_linear_head_is_the_models_output_head(family):
    model, _ = _tiny(family)
    weight, bias = linear_head(model)
    h = torch.randn(5, 32)
    torch.testing.assert_close(torch.nn.functional.linear(h, weight, bias).float(), output_head(model)(h).float(),
                               rtol=0, atol=0)


def _model_grads(model, logps_fn, upstream):
    model.zero_grad()
    out = logps_fn()
    (out * upstream).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk", [3, 5, 1024])
def test_masked_logps_fused_equals_the_chunked_head_pass_on_every_parameter(chunk):
    """Chunks of 3 and 5 split rows of 7 scored positions; tempered and truncated; every parameter's gradient."""
    model, tok = _tiny("llada")
    g = torch.Generator().manual_seed(chunk)
    ids = torch.randint(3, len(tok), (3, 12), generator=g)
    where = torch.rand(3, 12, generator=g) < 0.6
    x = torch.where(where, facts(model).mask_token_id, ids)
    support = torch.rand(int(where.sum()), model.config.vocab_size, generator=g) < 0.5
    support[torch.arange(len(support)), ids[where]] = True
    upstream = torch.randn(3, 12, generator=g)
    for kw in (dict(), dict(temperature=0.6, support=support)):
        want, want_g = _model_grads(model, lambda: masked_logps(model, x, ids, where, chunk=chunk, fused=False, **kw),
                                    upstream)
        got, got_g = _model_grads(model, lambda: masked_logps(model, x, ids, where, chunk=chunk, **kw), upstream)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert got_g.keys() == want_g.keys()
        for name in want_g:
            torch.testing.assert_close(got_g[name], want_g[name], rtol=1e-5, atol=1e-5, msg=name)


def test_a_tied_head_and_bf16_autocast_match_the_chunked_pass():
    """LLaDA with weight tying (the head is the input embedding: one weight, two gradients summed) and CPU bf16
    autocast (the matmuls in bf16 as `head(hidden)` runs them): the same values and gradients within bf16 rounding."""
    model = LLaDAModelLM(LLaDAConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64, vocab_size=20,
                                     embedding_size=20, mask_token_id=19, eos_token_id=0, pad_token_id=0,
                                     weight_tying=True))
    assert type(model.get_output_embeddings()) is torch.nn.Embedding
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 19, (2, 10), generator=g)
    where = torch.rand(2, 10, generator=g) < 0.6
    x = torch.where(where, facts(model).mask_token_id, ids)
    upstream = torch.randn(2, 10, generator=g)
    want, want_g = _model_grads(model, lambda: masked_logps(model, x, ids, where, chunk=4, fused=False), upstream)
    got, got_g = _model_grads(model, lambda: masked_logps(model, x, ids, where, chunk=4), upstream)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name in want_g:
        torch.testing.assert_close(got_g[name], want_g[name], rtol=1e-5, atol=1e-5, msg=name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, want_g = _model_grads(model, lambda: masked_logps(model, x, ids, where, chunk=4, fused=False), upstream)
        got, got_g = _model_grads(model, lambda: masked_logps(model, x, ids, where, chunk=4), upstream)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for name in want_g:
        scale = want_g[name].abs().max().item() + 1e-6
        torch.testing.assert_close(got_g[name] / scale, want_g[name] / scale, rtol=0, atol=3e-2, msg=name)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_block_diffusion_logps_fused_equals_the_chunked_head_pass(family):
    model, tok = _tiny(family)
    bs = facts(model).block_size
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(3, len(tok), (2, 3 * bs), generator=g)
    where = torch.rand(2, 3 * bs, generator=g) < 0.5
    x = torch.where(where, facts(model).mask_token_id, clean)
    upstream = torch.randn(2, 3 * bs, generator=g)
    want, want_g = _model_grads(model, lambda: block_diffusion_logps(model, x, clean, where, chunk=3, fused=False),
                                upstream)
    got, got_g = _model_grads(model, lambda: block_diffusion_logps(model, x, clean, where, chunk=3), upstream)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name in want_g:
        torch.testing.assert_close(got_g[name], want_g[name], rtol=1e-5, atol=1e-5, msg=name)


def test_heads_it_cannot_see_through_keep_the_chunked_pass():
    """A head with a forward hook (tests push MASK's logit down this way) or wrapped by LoRA goes through its module."""
    model, _ = _tiny("llada")
    assert linear_head(model) is not None
    handle = model.get_output_embeddings().register_forward_hook(lambda m, i, out: out)
    assert linear_head(model) is None
    handle.remove()
    model.model.transformer["ff_out"] = torch.nn.Sequential(model.get_output_embeddings())
    assert linear_head(model) is None


def _on_cuda(*tensors):
    return [t.cuda().requires_grad_(t.requires_grad) for t in tensors]


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_liger_equals_the_recompute_path_on_cuda(temperature, monkeypatch):
    """liger-kernel's fused linear cross-entropy (the `gpu` extra) against `LinearLogps` on CUDA: per-token
    log-probs and, under unequal per-token weights, the gradients of hidden, weight and bias; float32 (TF32 off)
    within float32 rounding, and under bf16 autocast within bf16 rounding."""
    pytest.importorskip("liger_kernel")
    liger = liger_logps()
    assert liger is not None, "liger-kernel is installed but predates 0.8.5 (its per-token backward is wrong)"
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    g = torch.Generator().manual_seed(0)
    n, h, v = 300, 64, 5000
    hidden, weight, bias = _on_cuda(torch.randn(n, h, generator=g), 0.1 * torch.randn(v, h, generator=g),
                                    torch.randn(v, generator=g))
    targets, upstream = _on_cuda(torch.randint(0, v, (n,), generator=g), torch.randn(n, generator=g))
    spans = head_chunks(torch.nn.Linear(1, 1), n, 128, "cuda")
    for precise in (True, False):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not precise):
            want = grads(lambda a, w, b: LinearLogps.apply(a, targets, w, b, temperature, None, spans),
                         hidden.requires_grad_(), weight.requires_grad_(), bias.requires_grad_(), upstream)
            got = grads(lambda a, w, b: liger(a, targets, w, b, temperature),
                        hidden.requires_grad_(), weight.requires_grad_(), bias.requires_grad_(), upstream)
        for name, a, b in zip(("logps", "hidden", "weight", "bias"), got, want):
            scale = b.abs().max().item()
            tol = 1e-4 if precise else 3e-2
            torch.testing.assert_close(a.float() / scale, b.float() / scale, rtol=0, atol=tol,
                                       msg=f"{name}, {'float32' if precise else 'bf16 autocast'}")


@pytest.mark.gpu
def test_masked_logps_on_cuda_takes_liger_and_equals_the_chunked_pass(monkeypatch):
    """On CUDA with liger installed, `masked_logps` (fused, the default) goes through liger where it applies (no
    support, temperature 1 or 0.5) and through `LinearLogps` otherwise (temperature 0.7); each equals the chunked
    pass in values and every parameter's gradient."""
    pytest.importorskip("liger_kernel")
    assert liger_logps() is not None
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    model, tok = _tiny("llada")
    model = model.cuda()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(tok), (3, 12), generator=g).cuda()
    where = (torch.rand(3, 12, generator=g) < 0.6).cuda()
    x = torch.where(where, facts(model).mask_token_id, ids)
    upstream = torch.randn(3, 12, generator=g).cuda()
    calls = []
    real = liger_logps()
    monkeypatch.setattr("dare.train.estimators.liger_logps", lambda: lambda *a: calls.append(1) or real(*a))
    for temperature, through_liger in ((1.0, True), (0.5, True), (0.7, False)):
        calls.clear()
        want, want_g = _model_grads(model, lambda: masked_logps(model, x, ids, where, chunk=5, fused=False,
                                                                temperature=temperature), upstream)
        got, got_g = _model_grads(model, lambda: masked_logps(model, x, ids, where, chunk=5, temperature=temperature),
                                  upstream)
        assert bool(calls) == through_liger, temperature
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for name in want_g:
            torch.testing.assert_close(got_g[name], want_g[name], rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("path", ["fused", "fused_support", "module", "module_support", "lora"])
def test_a_forward_that_scores_nothing_returns_an_empty_differentiable_result_on_every_path(path):
    """Issue 59.1: n = 0 scored positions (GDPO's first quadrature node with short answers) on the fused path, the
    head module's path (`fused=False`) and a LoRA-wrapped head (peft: `linear_head` gives None) returns a (0,)
    float32 tensor that backpropagates (zero gradients), where the module's path raised `torch.cat(): expected a
    non-empty list`."""
    from dare.train.estimators import head_logps

    model, _ = _tiny("llada")
    if path == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["ff_out"]))
        assert linear_head(model) is None
    hidden = torch.randn(0, 32, requires_grad=True)
    targets = torch.zeros(0, dtype=torch.long)
    support = torch.ones(0, model.config.vocab_size, dtype=torch.bool) if path.endswith("support") else None
    out = head_logps(model, hidden, targets, chunk=4, support=support, fused=path.startswith("fused"))
    assert out.shape == (0,) and out.dtype == torch.float32 and out.requires_grad
    out.sum().backward()
    assert hidden.grad is not None and hidden.grad.shape == (0, 32)
