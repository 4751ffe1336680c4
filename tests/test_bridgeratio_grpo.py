"""BridgeRatio-GRPO against DARE's own code: pull request #21 of yjyddq/DARE, head commit
6d4791fa1553c75493c8ef9f2509c9ba7ca4ccf8 (`verl/trainer/ppo/dllm_core_algos.py`: `estimate_bridge_log_ratio`,
`compute_policy_loss_bridgeratio`; `tests/test_bridgeratio.py`).

The PR's two tests are ported on their own inputs (the first two tests below). Every other expected value was
produced by running the PR's functions, unchanged, on the inputs written here (outside this repository; their
loss with the recipe's clip 0.2 / 0.2, dual clip 3 and token-mean aggregation, its per-path scores expanded over
the completion as its actor passes them), and is pinned here. Then the hooks on a tiny model: the three paths,
and their agreement with coupled-GRPO's estimate on the same draw."""

from types import SimpleNamespace

import pytest
import torch

from baselines.bridgeratio_grpo import algorithm as bridge
from baselines.coupled_grpo import algorithm as coupled
from conftest import run_config
from dare.config import ScratchModelConfig
from dare.models import new_model
from dare.models.tokenizer import char_tokenizer
from dare.train import noise
from dare.train.estimators import Compute
from dare.train.objectives import bridge_log_ratio

# the inputs of the PR's first test (batch 2, 3 paths, 2 positions)
CURRENT = torch.tensor([[[-1.0, -0.8], [-1.2, -0.6], [-0.9, -0.7]], [[-0.4, -1.1], [-0.3, -1.0], [-0.5, -0.9]]])
OLD = torch.tensor([[[-1.1, -0.9], [-1.3, -0.5], [-1.0, -0.8]], [[-0.6, -1.0], [-0.4, -1.2], [-0.7, -0.8]]])


def test_bridge_log_ratio_matches_coupled_logsumexp():
    """The PR's `test_bridge_log_ratio_matches_coupled_logsumexp`: the uncorrected estimate is the difference of
    the paths' logsumexps, with 3 paths; and the original's values."""
    log_ratio, correction = bridge_log_ratio(CURRENT, OLD)
    torch.testing.assert_close(log_ratio, torch.logsumexp(CURRENT, dim=1) - torch.logsumexp(OLD, dim=1))
    assert CURRENT.shape[1] == 3 and (correction == 0).all()
    torch.testing.assert_close(log_ratio, torch.tensor([[0.10000002384185791, 0.021843910217285156],
                                                        [0.1621118187904358, -0.00995868444442749]]))


def _batch(advantages, tokens, G):
    mask = torch.arange(G)[None, :] < torch.tensor(tokens)[:, None]
    return SimpleNamespace(advantages=torch.tensor(advantages), response_mask=mask, num_tokens=float(mask.sum()))


def _terms(scores: torch.Tensor, G: int) -> torch.Tensor:
    """(B, 3, G) per-token terms whose sum over a path divided by G (score_scale token) is `scores` (B, 3)."""
    return torch.nn.functional.pad((scores * G)[:, :, None], (0, G - 1))


def test_bridge_policy_loss_is_zero_for_zero_advantage():
    """The PR's `test_bridge_policy_loss_is_zero_for_zero_advantage` through our loss hook: equal paths, zero
    advantage -> loss, clip fraction, PPO KL and dual-clip fraction all 0."""
    paths = torch.tensor([[-1.0, -1.0]])  # the PR's (1, 2 paths, 2 positions) of -1: one score per path
    cfg = run_config("bridgeratio_grpo")
    batch = _batch([0.0], [2], 2)
    terms = torch.nn.functional.pad(paths[:, :, None] * 2, (0, 1))
    loss, m = bridge.loss(terms, terms.clone(), None, batch, None, cfg)
    assert loss.item() == 0.0
    assert m["stats/clip_ratio"] == m["stats/ppo_kl"] == m["stats/dual_clip_ratio"] == 0.0


@pytest.mark.parametrize("correction, expected", [
    ("delta", [[0.10000002384185791, 0.0177680142223835], [0.16052083671092987, -0.01325075514614582]]),
    ("jackknife", [[0.10000009834766388, 0.015421707183122635], [0.15964114665985107, -0.014968852512538433]]),
    ("cumulant", [[0.09999998658895493, 0.021906232461333275], [0.16212089359760284, -0.010352585464715958]]),
])
def test_corrections_match_the_original(correction, expected):
    log_ratio, term = bridge_log_ratio(CURRENT, OLD, correction)
    torch.testing.assert_close(log_ratio, torch.tensor(expected))
    torch.testing.assert_close(term, log_ratio - bridge_log_ratio(CURRENT, OLD)[0])


# three completions of 4 positions (4, 2, 3 loss tokens), advantages of both signs: per-sequence path scores
SCORES = torch.tensor([[-0.50, -0.70, -0.60], [1.20, 0.80, 0.60], [-1.40, -1.00, -1.20]])
FAR = torch.tensor([[-0.80, -0.90, -0.75], [-0.60, -0.20, -0.40], [-1.00, -0.80, -0.90]])
NEAR = SCORES + torch.tensor([[0.05, -0.10, 0.02], [0.10, 0.05, -0.05], [-0.08, 0.10, 0.00]])
ON_POLICY_GRAD = [[-0.24477693438529968, -0.20040640234947205, -0.22148331999778748],
                  [0.20027852058410645, 0.1342507004737854, 0.10991518199443817],
                  [0.044884584844112396, 0.0669599324464798, 0.05482214689254761]]


@pytest.mark.parametrize("old, algo, value, grad", [
    # every ratio clipped: PPO's clip for A = 1.5 (rho 1.24) and A = -0.5 (rho 0.75), the dual clip for A = -2
    # (rho 3.62 > 3): (-1.5 x 1.2 x 4 + 2 x 3 x 2 + 0.5 x 0.8 x 3) / 9 = 2/3, no gradient
    (FAR, {}, 0.6666666269302368, [[0.0] * 3] * 3),
    (SCORES, {}, -0.0555555559694767, ON_POLICY_GRAD),
    (NEAR, {}, -0.08261808753013611,
     [[-0.24553081393241882, -0.2010236233472824, -0.22216546535491943],
      [0.19059287011623383, 0.1277582049369812, 0.10459958761930466],
      [0.043937813490629196, 0.06554751098155975, 0.05366576090455055]]),
    (NEAR, {"correction": "delta"}, -0.08417403697967529,
     [[-0.2449929118156433, -0.20058323442935944, -0.2216787487268448],
      [0.1895868480205536, 0.12708385288715363, 0.10404746979475021],
      [0.043725498020648956, 0.06523077189922333, 0.05340643599629402]]),
    (NEAR, {"correction": "delta", "detach_correction": False}, -0.08417403697967529,
     [[-0.25273844599723816, -0.19357477128505707, -0.2209416627883911],
      [0.20762750506401062, 0.12029695510864258, 0.09279371052980423],
      [0.040541112422943115, 0.06912019103765488, 0.05270140618085861]]),
    (NEAR, {"correction": "jackknife"}, -0.08529116213321686,
     [[-0.2565901577472687, -0.1899910569190979, -0.2199661135673523],
      [0.21902644634246826, 0.11409905552864075, 0.08621031045913696],
      [0.03890462592244148, 0.07117976993322372, 0.05183586850762367]]),
    (NEAR, {"correction": "cumulant"}, -0.0826098620891571,
     [[-0.2456689327955246, -0.2004871368408203, -0.22254106402397156],
      [0.1906854510307312, 0.12797687947750092, 0.10427595674991608],
      [0.0438326820731163, 0.06552264094352722, 0.05379367619752884]]),
], ids=["clipped", "on-policy", "near", "delta", "delta-undetached", "jackknife", "cumulant"])
def test_loss_and_gradient_match_the_original(old, algo, value, grad):
    G, cfg = 4, run_config("bridgeratio_grpo", **algo)
    batch = _batch([1.5, -2.0, -0.5], [4, 2, 3], G)
    scores = SCORES.clone().requires_grad_()
    loss, _ = bridge.loss(_terms(scores, G), _terms(old, G), None, batch, None, cfg)
    loss.backward()
    assert loss.item() == pytest.approx(value, abs=1e-6)
    torch.testing.assert_close(scores.grad, torch.tensor(grad), atol=1e-6, rtol=1e-5)


def test_ratio_log_clip_and_asymmetric_clip_match_the_original():
    G = 4
    batch = _batch([1.5, -2.0, -0.5], [4, 2, 3], G)
    loss, m = bridge.loss(_terms(SCORES, G), _terms(FAR, G), None, batch, None,
                          run_config("bridgeratio_grpo", ratio_log_clip=0.5))
    assert loss.item() == pytest.approx(0.06609826534986496, abs=1e-6)
    assert m["stats/clip_ratio"] == pytest.approx(0.7777777910232544)
    assert m["stats/ppo_kl"] == pytest.approx(0.04899350926280022, abs=1e-6)
    assert m["stats/dual_clip_ratio"] == 0.0  # log rho capped at 0.5 < log 3
    loss, m = bridge.loss(_terms(SCORES, G), _terms(FAR, G), None, batch, None,
                          run_config("bridgeratio_grpo", eps_low=0.1, eps_high=0.3))
    assert loss.item() == pytest.approx(0.6542179584503174, abs=1e-6)
    assert m["stats/clip_ratio"] == pytest.approx(0.3333333432674408)
    assert m["stats/ppo_kl"] == pytest.approx(0.15016576647758484, abs=1e-6)
    assert m["stats/dual_clip_ratio"] == pytest.approx(0.2222222238779068)


def test_on_policy_gradient_weights_each_path_by_its_share():
    """At rho = 1 the gradient of path k is -A softmax_k(l) |o| / sum |o| (the original's on-policy gradient)."""
    share = torch.softmax(SCORES, dim=1) * torch.tensor([1.5, -2.0, -0.5])[:, None] * torch.tensor([4.0, 2, 3])[:, None]
    torch.testing.assert_close(-share / 9, torch.tensor(ON_POLICY_GRAD), atol=1e-6, rtol=1e-5)


def _tiny_batch(family="llada"):
    tok = char_tokenizer("0123456789+=", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0)
    seqs = torch.randint(3, 14, (4, 9), generator=torch.Generator().manual_seed(0))
    response = torch.ones(4, 5, dtype=torch.bool)
    response[1, 3:] = False
    batch = SimpleNamespace(sequences=seqs, attention_mask=torch.ones_like(seqs), prompt_length=4, block_size=None,
                            response_mask=response, compute=Compute(pack=False))
    return model, batch


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_three_paths_and_coupled_grpos_estimate_on_the_same_draw(family):
    """The draw is the full completion, M and its complement (each completion token masked in exactly one of the
    pair), weights 1, 1/t, 1/(1-t), the prompt never masked; half the paths' sum is coupled-GRPO's Eq. 13 on the
    same (t, M), drawn from the same generator."""
    model, batch = _tiny_batch(family)
    cfg = run_config("bridgeratio_grpo")
    draw = bridge.sample_noise(batch, torch.Generator().manual_seed(3), cfg)
    completion = noise.completion(batch.attention_mask, batch.prompt_length)
    full, first, second = draw.masked.unbind(dim=1)
    assert (full == completion).all() and not (first & second).any() and ((first | second) == completion).all()
    t = draw.t[0, 1].item()
    assert 0.2 <= t <= 0.8 and (draw.t == torch.tensor([1.0, t, 1 - t])).all()
    torch.testing.assert_close(draw.weight, 1 / draw.t)
    with torch.no_grad():
        terms = bridge.token_logps(model, batch, draw, cfg)
        pair = coupled.sample_noise(batch, torch.Generator().manual_seed(3), run_config("coupled_grpo"))
        assert (pair.masked == first).all() and pair.t.tolist() == pytest.approx([t] * 4)  # one t, every row
        reference = coupled.token_logps(model, batch, pair, run_config("coupled_grpo"))
    assert terms.shape == (4, 3, 5) and (terms[:, 1:][~draw.masked[:, 1:, 4:]] == 0).all()
    torch.testing.assert_close(0.5 * terms.sum(dim=1), reference, atol=1e-5, rtol=1e-5)
    scores = bridge.path_scores(terms, batch, cfg)
    torch.testing.assert_close(scores, terms.sum(dim=2) / 5)
    seq = bridge.path_scores(terms, batch, run_config("bridgeratio_grpo", score_scale="sequence"))
    valid = bridge.path_scores(terms, batch, run_config("bridgeratio_grpo", score_scale="valid_tokens"))
    torch.testing.assert_close(valid, scores * torch.tensor([5.0, 3, 5, 5])[:, None])
    torch.testing.assert_close(seq, terms.sum(dim=2))


def test_block_models_are_refused():
    _, batch = _tiny_batch()
    with pytest.raises(ValueError, match="masked"):
        bridge.sample_noise(SimpleNamespace(**{**vars(batch), "block_size": 4}), torch.Generator(), run_config("bridgeratio_grpo"))
    cfg = run_config("bridgeratio_grpo")
    a = 0.5 / ((1 / 3) ** 0.5 + 1e-6)  # (r - 0.5) / (sample std + 1e-6)
    assert bridge.advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), cfg)[0].tolist() == pytest.approx([a, -a, -a, a])
