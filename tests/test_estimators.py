"""Likelihood estimators against exact enumeration on a tiny model, noise samplers' invariants,
chunked log-probs and the memory-bounded backward."""

import itertools
import math

import pytest
import torch

from dare.config import ScratchModelConfig
from dare.models import facts, new_model, token_logits
from dare.models.tokenizer import char_tokenizer
from dare.train import noise
from dare.train.batches import backward_by_parts
from dare.train.estimators import block_diffusion_logps, elbo, elbo_terms, masked_logps, sequence_elbo


@pytest.fixture(scope="module")
def tiny():
    tok = char_tokenizer("01", "llada")
    model = new_model("llada", tok, ScratchModelConfig(d_model=16, n_heads=2, n_layers=1, mlp_hidden_size=32), seed=1)
    with torch.no_grad():  # sharper predictions than the 0.02 init, so log-probs differ visibly
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(20)
    return model.eval(), tok


def _logp(model, ids, masked_positions, i):
    mask_id = facts(model).mask_token_id
    x = ids.clone()
    x[0, list(masked_positions)] = mask_id
    return torch.log_softmax(token_logits(model, x)[0, i].double(), -1)[ids[0, i]].item()


def exact_quantities(model, ids, completion):
    """(exact any-order log-likelihood, exact ELBO) of the completion positions given the prompt."""
    L = len(completion)
    with torch.no_grad():
        orders = []
        for order in itertools.permutations(completion):
            masked, total = set(completion), 0.0
            for i in order:  # reveal i given the tokens revealed so far
                total += _logp(model, ids, masked, i)
                masked.discard(i)
            orders.append(total)
        exact = math.log(sum(math.exp(v) for v in orders) / len(orders))
        any_order_mean = sum(orders) / len(orders)
        bound = 0.0
        for size in range(1, L + 1):
            subsets = list(itertools.combinations(completion, size))
            avg = sum(sum(_logp(model, ids, m, i) for i in m) for m in subsets) / len(subsets)
            bound += avg / size
    return exact, bound, any_order_mean


def test_elbo_is_a_lower_bound_and_the_monte_carlo_means_converge(tiny):
    model, tok = tiny
    ids = torch.tensor([tok.convert_tokens_to_ids(list("0110"))])
    completion = [1, 2, 3]
    exact, bound, any_order = exact_quantities(model, ids, completion)
    assert bound == pytest.approx(any_order, abs=1e-9)  # the discrete ELBO is the any-order mean
    assert bound <= exact + 1e-12  # Jensen: never above the exact log-likelihood
    assert exact - bound > 1e-4  # and not trivially equal on this model
    maskable = torch.zeros_like(ids, dtype=torch.bool)
    maskable[0, completion] = True
    with torch.no_grad():
        # the 1/t weights are heavy-tailed: stratified times need many more draws than counts
        for weighting, n, tol in (("count", 600, 0.02), ("time", 1500, 0.1)):
            g = torch.Generator().manual_seed(0)
            est = elbo(model, ids, None, maskable, noise.elbo_draws(maskable, n, g, weighting)).item()
            assert est == pytest.approx(bound, abs=tol * abs(bound) + 0.01), weighting


def test_sequence_elbo_of_a_continuation_converges_to_the_exact_bound(tiny):
    """OpenCompass' likelihood scoring: the ELBO of ids[start:] given ids[:start], all masks in one batch."""
    model, tok = tiny
    ids = torch.tensor([tok.convert_tokens_to_ids(list("0110"))])
    _, bound, _ = exact_quantities(model, ids, [1, 2, 3])
    with torch.no_grad():
        est = sequence_elbo(model, ids[0], 1, 900, torch.Generator().manual_seed(0))
    assert est == pytest.approx(bound, abs=0.02 * abs(bound) + 0.01)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_sequence_elbo_of_a_block_model_is_the_sum_of_per_block_bounds(family):
    """Block models factor over blocks: each block's masks see the clean blocks before it, so the
    exact bound is the sum over blocks of the masked-diffusion bound within the block (masking
    the blocks jointly has the same mean, by the any-order identity; per-block counts are the
    factorization's own estimator)."""
    tok = char_tokenizer("01", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=16, n_heads=2, n_layers=1, mlp_hidden_size=32), seed=1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(20)
    model.eval()
    bs = facts(model).block_size
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(len(tok) - 2, len(tok), (1, 2 * bs), generator=g)  # the characters 0 and 1
    start = bs - 2  # the last two positions of block 0, then all of block 1
    bound = 0.0
    with torch.no_grad():
        for positions in (list(range(start, bs)), list(range(bs, 2 * bs))):
            for size in range(1, len(positions) + 1):
                subsets = list(itertools.combinations(positions, size))
                total = 0.0
                for m in subsets:
                    where = torch.zeros_like(clean, dtype=torch.bool)
                    where[0, list(m)] = True
                    x = torch.where(where, facts(model).mask_token_id, clean)
                    total += block_diffusion_logps(model, x, clean, where).sum().item()
                bound += total / len(subsets) / size
        est = sequence_elbo(model, clean[0], start, 1200, torch.Generator().manual_seed(0))
    assert est == pytest.approx(bound, abs=0.03 * abs(bound) + 0.02)
    assert bound < -0.1  # not trivially zero


def test_normalization_is_explicit(tiny):
    model, tok = tiny
    ids = torch.tensor([tok.convert_tokens_to_ids(list("011010"))])
    maskable = torch.zeros_like(ids, dtype=torch.bool)
    maskable[0, 2:5] = True  # 3 valid completion tokens in a padded length of 6
    with torch.no_grad():
        draws = noise.elbo_draws(maskable, 6, torch.Generator().manual_seed(3))
        values = {n: elbo(model, ids, None, maskable, draws, normalize=n).item() for n in ("none", "valid", "padded")}
    assert values["valid"] == pytest.approx(values["none"] / 3)
    assert values["padded"] == pytest.approx(values["none"] / 6)


def test_chunked_log_probs_equal_the_full_logits(tiny):
    model, tok = tiny
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tok), (3, 7), generator=g)
    where = torch.rand(3, 7, generator=g) < 0.5
    x = torch.where(where, torch.full_like(ids, facts(model).mask_token_id), ids)
    with torch.no_grad():
        full = torch.log_softmax(token_logits(model, x).float(), -1).gather(-1, ids[..., None]).squeeze(-1)
        got = masked_logps(model, x, ids, where, chunk=2)
    torch.testing.assert_close(got[where], full[where], rtol=1e-5, atol=1e-5)
    assert (got[~where] == 0).all()
    with torch.no_grad():  # tempered (MDPO): log_softmax(logits / T), chunked and full alike
        warm = torch.log_softmax(token_logits(model, x).float() / 0.4, -1).gather(-1, ids[..., None]).squeeze(-1)
        for kw in (dict(chunk=2), dict(chunk=0)):
            got = masked_logps(model, x, ids, where, temperature=0.4, **kw)
            torch.testing.assert_close(got[where], warm[where], rtol=1e-5, atol=1e-5)


def test_memory_bounded_backward_matches_autograd(tiny):
    model, tok = tiny
    ids = torch.tensor([tok.convert_tokens_to_ids(list("0110")), tok.convert_tokens_to_ids(list("1001"))])
    maskable = torch.zeros_like(ids, dtype=torch.bool)
    maskable[:, 1:] = True
    model.zero_grad()
    draws = noise.elbo_draws(maskable, 4, torch.Generator().manual_seed(5))
    value = elbo(model, ids, None, maskable, draws, normalize="valid")
    value.sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    # the same loss, backpropagated one Monte Carlo draw at a time (`backward_by_parts`, the recipes' replayed loss)
    parts = [noise.Draw(draws.masked[:, k:k + 1], draws.t[:, k:k + 1], draws.weight[:, k:k + 1]) for k in range(4)]
    norm = maskable.sum(dim=1).clamp(min=1).float()
    loss, _, terms = backward_by_parts(lambda d: elbo_terms(model, ids, None, d), parts,
                                       lambda leaves: torch.cat(leaves, dim=1),
                                       lambda t: ((t.mean(dim=1) / norm).sum(), {}), lambda x: x.backward())
    torch.testing.assert_close(terms.mean(dim=1) / norm, value.detach())
    torch.testing.assert_close(loss, value.detach().sum())
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-5, atol=1e-6, msg=n)
    model.zero_grad()


def test_noise_samplers():
    g = torch.Generator().manual_seed(0)
    maskable = torch.tensor([[False, False, True, True, True, True, False]] * 3)
    prompt = torch.tensor([[True, True, False, False, False, False, False]] * 3)
    m = noise.full_completion(maskable, prompt, 0.5, g)
    assert (m[maskable]).all() and not (m & ~maskable & ~prompt).any()
    a, b = noise.complementary(maskable, torch.tensor([0.3, 0.5, 0.9]), g)
    assert torch.equal(a | b, maskable) and not (a & b).any()  # each token scored exactly once per pair
    counts = torch.tensor([1, 2, 4])
    assert noise.exact_count(maskable, counts, g).sum(dim=1).tolist() == [1, 2, 4]
    strat = noise.stratified_counts(torch.tensor([4, 1]), 8, g)
    assert strat.shape == (8, 2) and strat[:, 0].min() >= 1 and strat[:, 0].max() <= 4 and (strat[:, 1] == 1).all()
    assert sorted(set(strat[:, 0].tolist())) == [1, 2, 3, 4]  # spread over 1..L
    # the same generator state gives the same draws: old/ref/new log-probs share their masks
    x1 = noise.iid(maskable, torch.tensor([0.5] * 3), torch.Generator().manual_seed(9))
    x2 = noise.iid(maskable, torch.tensor([0.5] * 3), torch.Generator().manual_seed(9))
    assert torch.equal(x1, x2)
    times = noise.stratified_times(64, 4, g)
    for j in range(4):  # one time in each stratum [j/4, (j+1)/4)
        assert ((times[:, j] >= j / 4) & (times[:, j] < (j + 1) / 4 + 1e-9)).all()
    for weighting in ("count", "time"):
        d = noise.elbo_draws(maskable, 5, g, weighting)
        assert d.masked.shape == (3, 5, 7) and not (d.masked & ~maskable[:, None]).any()
        if weighting == "count":  # weight L / l with l the masked count
            torch.testing.assert_close(d.weight, 4 / d.masked.sum(-1).float())


def test_packed_and_padded_losses_are_equal(tiny):
    from dare.train.packing import pack, pad, unpack

    model, tok = tiny
    g = torch.Generator().manual_seed(2)
    rows = [torch.randint(0, len(tok), (n,), generator=g) for n in (5, 9, 3)]
    masks = [torch.rand(len(r), generator=g) < 0.6 for r in rows]
    mask_id = facts(model).mask_token_id
    ids, cu = pack(rows)
    where, _ = pack(masks)
    packed = masked_logps(model, torch.where(where, mask_id, ids), ids, where, cu_seqlens=cu)
    pids, attn = pad(rows, 0)
    pwhere = pad([m.long() for m in masks], 0)[0].bool()
    padded = masked_logps(model, torch.where(pwhere, mask_id, pids), pids, pwhere, attention_mask=attn)
    for i, part in enumerate(unpack(packed, cu)):
        torch.testing.assert_close(part, padded[i, :len(rows[i])], rtol=1e-5, atol=1e-5)
    assert packed.sum().item() == pytest.approx(padded.sum().item(), abs=1e-4)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_block_diffusion_logps_match_the_training_layout_logits(family):
    """The [noisy ; clean] path: chunked log-probs from hidden states equal the log-softmax of the
    logits the block-diffusion forward returns, at every masked position."""
    tok = char_tokenizer("0123456789+=", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64),
                      seed=0).eval()
    bs = facts(model).block_size
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(3, len(tok), (2, 3 * bs), generator=g)
    where = torch.zeros_like(clean, dtype=torch.bool)  # block 1 half masked, block 2 fully masked
    where[:, bs:2 * bs] = torch.rand(2, bs, generator=g) < 0.5
    where[:, 2 * bs:] = True
    x = torch.where(where, facts(model).mask_token_id, clean)
    with torch.no_grad():
        logits = model(torch.cat([x, clean], dim=1), block_diffusion=True).logits
        want = torch.log_softmax(logits.float(), -1).gather(-1, clean[..., None])[..., 0]
        for chunk in (0, 3):
            got = block_diffusion_logps(model, x, clean, where, chunk=chunk)
            torch.testing.assert_close(got[where], want[where], atol=1e-5, rtol=1e-5)
            assert (got[~where] == 0).all()


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2"])
def test_ar_prefix_logps_equal_one_plain_forward_per_token(family):
    """JustGRPO's AR-prefix likelihood: the batched estimate (masked models: one forward per position;
    block models: one per in-block offset, all blocks at once through the [x_t ; x_0] layout) equals,
    for every row alone and every completion token o_t, the model's own forward on [q, o_<t, MASK...]
    (block models: truncated after o_t's block, the sampler's view), left padding and a prompt that
    ends inside a block included."""
    from types import SimpleNamespace

    from dare.rollout import left_pad
    from dare.train.estimators import Compute, ar_prefix_logps

    tok = char_tokenizer("0123456789+=", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64),
                      seed=0).eval()
    f, G = facts(model), 7
    prompts = [[5, 9, 7], [5, 11, 6, 8, 9, 10], [6]]
    ids, mask = left_pad(prompts, f.pad_token_id)
    completions = torch.randint(3, 14, (3, G), generator=torch.Generator().manual_seed(0))
    batch = SimpleNamespace(sequences=torch.cat([ids, completions], 1), prompt_length=ids.shape[1],
                            attention_mask=torch.cat([mask, torch.ones_like(completions)], 1),
                            step_map=torch.zeros_like(completions), block_size=f.block_size, compute=Compute())
    with torch.no_grad():
        got = ar_prefix_logps(model, batch)
        for b, prompt in enumerate(prompts):
            for t in range(G):
                x = prompt + completions[b, :t].tolist() + [f.mask_token_id] * (G - t)
                if f.block_size:  # keep the blocks up to o_t's: a block sees only itself and earlier ones
                    end = -(-(len(prompt) + t + 1) // f.block_size) * f.block_size
                    x = x[:end]
                logp = torch.log_softmax(token_logits(model, torch.tensor([x]))[0, len(prompt) + t].float(), -1)
                assert got[b, t].item() == pytest.approx(logp[completions[b, t]].item(), abs=1e-5), (b, t)


def test_renyi_eubo_sandwiches_the_likelihood_and_its_monte_carlo_terms_converge(tiny):
    """SPG's evidence upper bound: by exact enumeration over every mask of a 3-token completion,
    ELBO <= log-likelihood <= sum_i (1/beta) log E[w 1[i masked] p^beta(x_i | x_masked)] for beta in {1, 1.5, 2};
    and the Monte Carlo terms (`draw_logps` + `eubo_terms`, count-weighted draws) converge to the exact ones."""
    from types import SimpleNamespace

    from dare.train.estimators import Compute, draw_logps, eubo_terms

    model, tok = tiny
    ids = torch.tensor([tok.convert_tokens_to_ids(list("0110"))])
    completion, L = [1, 2, 3], 3
    exact, bound, _ = exact_quantities(model, ids, completion)

    def exact_term(i, beta):  # E over l ~ U{1..L}, a uniform l-subset, weight L / l
        total = 0.0
        for size in range(1, L + 1):
            subsets = list(itertools.combinations(completion, size))
            total += sum(math.exp(beta * _logp(model, ids, m, i)) for m in subsets if i in m) / len(subsets) / size
        return math.log(total)

    with torch.no_grad():
        for beta in (1.0, 1.5, 2.0):
            assert bound <= exact <= sum(exact_term(i, beta) for i in completion) / beta
        maskable = torch.tensor([[False, True, True, True]])
        draws = noise.elbo_draws(maskable, 3000, torch.Generator().manual_seed(0), "count")
        batch = SimpleNamespace(sequences=ids, attention_mask=torch.ones_like(ids), prompt_length=1,
                                compute=Compute())
        logps = draw_logps(model, batch, draws.masked)  # (1, n, 3)
        terms = eubo_terms(logps, draws.masked[:, :, 1:], draws.weight, 1.5)
    for k, i in enumerate(completion):
        assert terms[0, k].item() == pytest.approx(exact_term(i, 1.5), abs=0.06), i  # weight 1: off by 0.5+


def _batched_elbo(model, ids, draws):
    """(n,) weight_k x the masked log-probs of each of one row's n draws, in one forward of n rows."""
    masked = draws.masked[0]
    rows = ids.expand(masked.shape[0], -1)
    x = torch.where(masked, facts(model).mask_token_id, rows)
    with torch.no_grad():
        return draws.weight[0] * masked_logps(model, x, rows, masked).sum(dim=1)


def test_complementary_pairs_are_an_unbiased_elbo_that_scores_every_token_once_per_pair(tiny):
    """ESPO's coupled draws: x ~ U{0..L}, weights (L+1)/x and (L+1)/(L-x); every maskable token is masked in
    exactly one draw of each pair, and the Monte Carlo mean converges to the exact ELBO (enumerated)."""
    model, tok = tiny
    ids = torch.tensor([tok.convert_tokens_to_ids(list("0110"))])
    _, bound, _ = exact_quantities(model, ids, [1, 2, 3])
    maskable = torch.tensor([[False, True, True, True]])
    draws = noise.complementary_pairs(maskable, 3000, torch.Generator().manual_seed(0))
    pairs = draws.masked.view(1, 3000, 2, 4)
    assert (pairs.sum(dim=2) == maskable.long()).all()  # a mask and its complement: each token once per pair
    estimate = _batched_elbo(model, ids, draws).mean().item()  # = estimators.elbo on these draws, in one forward
    assert estimate == pytest.approx(bound, abs=0.3)  # the mean's standard error here: 0.066; L/x weights: -8.3
    stratified = noise.complementary_pairs(torch.ones(4, 7, dtype=torch.bool), 1, torch.Generator().manual_seed(3))
    assert sorted(stratified.masked[:, 0].sum(dim=1).tolist()) == [0, 2, 4, 6]  # k, k + 2, k + 4, k + 6 mod 8


def test_quadrature_draws_converge_to_their_enumerated_value(tiny):
    """GDPO's semi-deterministic estimator: Gauss-Legendre nodes over t, int(t L) positions masked at each,
    weight w_k / 2 / t_k: the mean over draws converges to the exact expectation over the random subsets
    (enumerated), a biased approximation of the ELBO (a node with int(t L) = 0 scores nothing)."""
    model, tok = tiny
    ids = torch.tensor([tok.convert_tokens_to_ids(list("0110"))])
    completion, L = [1, 2, 3], 3
    maskable = torch.tensor([[False, True, True, True]])
    for nodes in (2, 3):
        xi, w = noise.GAUSS_LEGENDRE[nodes]
        exact = 0.0
        for node, wk in zip(xi, w):
            t = (node + 1) / 2
            subsets = list(itertools.combinations(completion, int(t * L)))
            if subsets and subsets[0]:
                avg = sum(sum(_logp(model, ids, m, i) for i in m) for m in subsets) / len(subsets)
                exact += wk / 2 / t * avg
        draws = [noise.quadrature(maskable, nodes, torch.Generator().manual_seed(s)) for s in range(4000)]
        with torch.no_grad():
            assert elbo(model, ids, None, maskable, draws[0]).item() == pytest.approx(
                _batched_elbo(model, ids, draws[0]).mean().item(), abs=1e-5)
        stacked = noise.Draw(torch.cat([d.masked for d in draws], 1), None, torch.cat([d.weight for d in draws], 1))
        mean = _batched_elbo(model, ids, stacked).mean().item()
        assert mean == pytest.approx(exact, abs=0.15), (nodes, mean, exact)  # standard error 0.035


def test_bench_estimators_reports_every_estimator_on_one_fixed_batch(tmp_path, trained_tiny, char_tok):
    """`dare bench estimators`' table on a trained tiny checkpoint (2 draws here; the README's numbers use 32):
    every estimator reports its spread and bias; the exact AR order has none; more ELBO draws spread less.
    (The memory rows run BGPO updates in fresh processes, minutes on 2 busy cores: left to the benchmark;
    tests/test_bgpo.py checks that the per-draw update has the full gradient.)"""
    import json

    from dare.app.bench_estimators import estimators_benchmark
    from dare.models.tokenizer import save_tokenizer
    ckpt = tmp_path / "ckpt"
    trained_tiny.save_pretrained(ckpt)
    save_tokenizer(char_tok, ckpt)
    report = estimators_benchmark(str(ckpt), draws=4, memory_draws=(), out=str(tmp_path / "r.json"))
    rows = report["estimators"]
    assert len(rows) == 10 and all(math.isfinite(r["std"]) and math.isfinite(r["bias_vs_exact_elbo"])
                                   for r in rows.values())
    assert rows["AR prefix (JustGRPO; exact AR order)"]["std"] == 0
    assert rows["ELBO, stratified counts, n=16 (BGPO)"]["std"] < rows["ELBO, stratified counts, n=1"]["std"]
    assert json.loads((tmp_path / "r.json").read_text())["exact_elbo"] == report["exact_elbo"]


def test_a_draws_fields_have_one_shape_each():
    """`Draw.check` (run by the RL step on every algorithm's first draw): t is `masked`'s shape without the
    positions, t_at is `masked`'s shape, weight one of the two; a scalar or per-position t fails with the field."""
    g = torch.Generator().manual_seed(0)
    masked = torch.rand(3, 2, 5, generator=g) < 0.5
    noise.Draw(masked, torch.rand(3, 2), torch.ones(3, 2)).check()
    noise.Draw(masked, weight=torch.ones(3, 2, 5), t_at=torch.rand(3, 2, 5)).check()
    for bad, field in [(noise.Draw(masked, torch.tensor(0.5)), "Draw.t has shape ()"),
                       (noise.Draw(masked, torch.rand(3, 2, 5)), r"Draw.t has shape \(3, 2, 5\)"),
                       (noise.Draw(masked, t_at=torch.rand(3, 2)), r"Draw.t_at has shape \(3, 2\)"),
                       (noise.Draw(masked, weight=torch.ones(3)), r"Draw.weight has shape \(3,\)"),
                       (noise.Draw(masked, torch.rand(3, 2), t_at=torch.rand(3, 2, 5)), "not both")]:
        with pytest.raises(ValueError, match=field):
            bad.check()
    parts = noise.single_draws(noise.Draw(masked, weight=torch.ones(3, 2, 5), t_at=torch.rand(3, 2, 5)))
    assert len(parts) == 2 and all(p.t is None and p.t_at.shape == (3, 1, 5) for p in parts)
