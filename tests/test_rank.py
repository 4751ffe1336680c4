"""leaderboard/rank.py (issue 58): the t distribution, Welch's test, Holm's correction, rank classes and their
stability, the hierarchical bootstrap's intervals, Kendall's tau-b, the cross-family summary, the proxy check
and the command, each against hand-computed or published values."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dare.results import metric_from_values, write_result
from test_results import make_result

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def rank(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    import rank

    return rank


# ---------------------------------------------------------------------------------------------
# Student's t
# ---------------------------------------------------------------------------------------------


def test_t_quantiles_match_the_tables(rank):
    """The 0.975 quantiles of Student's t as tables print them (to 9 digits), a one-sided 0.95, the normal
    limit, and the symmetry below 0.5."""
    for df, exact in [(1, 12.706204736), (2, 4.302652730), (5, 2.570581836), (10, 2.228138852),
                      (30, 2.042272456)]:
        assert rank.t_quantile(0.975, df) == pytest.approx(exact, abs=1e-8), df
    assert rank.t_quantile(0.95, 1) == pytest.approx(6.313751515, abs=1e-8)
    assert rank.t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)  # the normal quantile
    assert rank.t_quantile(0.025, 5) == pytest.approx(-2.570581836, abs=1e-8)
    with pytest.raises(ValueError):
        rank.t_quantile(1.0, 3)


def test_t_cdf_and_the_incomplete_beta_in_closed_form(rank):
    """Cauchy (1 degree of freedom): P(T <= 1) = 3/4; 2 degrees: 1/2 + t / (2 sqrt(2 + t^2)); I_x(a, 1) = x^a,
    I_x(1, 1) = x, I_1/2(a, a) = 1/2."""
    assert rank.t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)
    for t in (-3.0, -0.4, 0.0, 0.7, 5.0):
        assert rank.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12), t
    assert rank.betainc(2.5, 1.0, 0.3) == pytest.approx(0.3 ** 2.5, abs=1e-12)
    assert rank.betainc(1.0, 1.0, 0.37) == pytest.approx(0.37, abs=1e-12)
    assert rank.betainc(7.5, 7.5, 0.5) == pytest.approx(0.5, abs=1e-12)
    assert rank.betainc(3, 4, 0.0) == 0.0 and rank.betainc(3, 4, 1.0) == 1.0


# ---------------------------------------------------------------------------------------------
# Welch, Holm, rank classes, stability
# ---------------------------------------------------------------------------------------------


def test_welch_p_values_by_hand(rank):
    """[1, 2, 3] vs [4, 5, 6]: t = -3 / sqrt(2/3) = -3.674, 4 degrees of freedom, whose two-sided p is
    1 - u (1 + (1 - u^2) / 2) with u = |t| / sqrt(4 + t^2) (0.0213116, as scipy's ttest_ind prints it).
    A side that does not vary leaves the other's n - 1 degrees of freedom: [0.5] x 3 vs [0.6, 0.7, 0.8] is
    t = -2 sqrt(3) on 2, p = 1 - |t| / sqrt(2 + t^2)."""
    t, df, p = rank.welch([1, 2, 3], [4, 5, 6])
    u = abs(t) / math.sqrt(4 + t * t)
    assert t == pytest.approx(-3 / math.sqrt(2 / 3)) and df == pytest.approx(4)
    assert p == pytest.approx(1 - u * (1 + (1 - u * u) / 2), abs=1e-12) and p == pytest.approx(0.0213116, abs=1e-7)
    t, df, p = rank.welch([0.5, 0.5, 0.5], [0.6, 0.7, 0.8])
    assert t == pytest.approx(-2 * math.sqrt(3)) and df == pytest.approx(2)
    assert p == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14), abs=1e-12)
    assert rank.welch([0.5], [0.6, 0.7]) is None  # one seed: no test
    assert rank.welch([0.9, 0.9], [0.9, 0.9])[2] == 1.0 and rank.welch([0.9, 0.9], [0.8, 0.8])[2] == 0.0


def test_welch_with_fractional_degrees_of_freedom_against_the_density_integrated(rank):
    """[1, 2, 3, 4] vs [2, 4, 6]: df = 1.75^2 / ((5/12)^2 / 3 + (4/3)^2 / 2) = 3.2347 (Welch-Satterthwaite); the
    p-value against 1 - 2 x the t density integrated from 0 to |t| (trapezoids)."""
    t, df, p = rank.welch([1, 2, 3, 4], [2, 4, 6])
    assert df == pytest.approx(1.75 ** 2 / ((5 / 12) ** 2 / 3 + (4 / 3) ** 2 / 2))
    x = np.linspace(0, abs(t), 200_001)
    density = (math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
               * (1 + x ** 2 / df) ** (-(df + 1) / 2))
    assert p == pytest.approx(1 - 2 * np.trapezoid(density, x), abs=1e-9)


def test_holm_by_hand(rank):
    """p = 0.005, 0.01, 0.03, 0.04 of m = 4: x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> made non-decreasing:
    0.02, 0.03, 0.06, 0.06; capped at 1."""
    adjusted = rank.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    assert adjusted == pytest.approx({"d": 0.02, "a": 0.03, "c": 0.06, "b": 0.06})
    assert rank.holm({"a": 0.6, "b": 0.5}) == {"b": 1.0, "a": 1.0}


def test_rank_classes_with_a_clear_winner(rank):
    """Three methods 10 points apart with a spread of 1 point: every pair differs after Holm (t = 12.2 on 4
    degrees of freedom), classes 1, 2, 3, and the winner is starred."""
    r = rank.rank_classes({"a": [0.90, 0.91, 0.92], "b": [0.80, 0.81, 0.82], "c": [0.70, 0.71, 0.72]})
    assert r.classes == {"a": 1, "b": 2, "c": 3} and r.best == "a"
    assert r.better == {"a": [], "b": ["a"], "c": ["a", "b"]} and (r.pairs, r.separated, r.raw_separated) == (3, 3, 3)
    lower = rank.rank_classes({"a": [0.90, 0.91, 0.92], "b": [0.80, 0.81, 0.82]}, higher=False)
    assert lower.classes == {"a": 2, "b": 1} and lower.best == "b"


def test_rank_classes_with_a_tie_at_the_top_star_nobody(rank):
    """a and b are not separated (one shared class), both beat c: classes 1, 1, 3 and no star, though a has
    the highest mean. A method with one seed is never tested, so never separated."""
    r = rank.rank_classes({"a": [0.90, 0.95, 0.85], "b": [0.89, 0.94, 0.84], "c": [0.50, 0.51, 0.52]})
    assert r.classes == {"a": 1, "b": 1, "c": 3} and r.best is None
    assert r.means["a"] > r.means["b"] and r.separated == 2
    alone = rank.rank_classes({"a": [0.99], "b": [0.10, 0.11]})
    assert alone.classes == {"a": 1, "b": 1} and alone.best is None and alone.pairs == 0


def test_rank_classes_count_only_what_survives_holms_correction(rank):
    """b is 5 points below a and c (p = 0.031 against each, uncorrected): two of the three pairs differ at 5%
    before the correction, none after it (0.031 x 3 = 0.093): one class, as the classes use Holm's p."""
    r = rank.rank_classes({"a": [0.90, 0.91, 0.92], "b": [0.84, 0.86, 0.88], "c": [0.90, 0.91, 0.92]})
    assert r.tests[("a", "b")][2] == pytest.approx(0.031, abs=0.001) and r.adjusted[("a", "b")] == pytest.approx(
        3 * r.tests[("a", "b")][2])
    assert (r.raw_separated, r.separated) == (2, 0) and r.classes == {"a": 1, "b": 1, "c": 1} and r.best is None


def test_a_rank_class_that_leaving_one_seed_out_changes_is_unstable(rank):
    """b is separated from a with three seeds (class 2); left with two (0.84 or 0.86 left out, about 1.7 degrees
    of freedom) it is not, and its class changes, so it is not stable (with 0.88 left out it would be). c, far
    below both, keeps class 3 whichever seed goes; a method with one seed cannot leave one out, and one with two
    would be left with a single, untestable seed (None: too few seeds, not "stable")."""
    seeds = {"a": [0.90, 0.91, 0.92], "b": [0.84, 0.86, 0.88], "c": [0.100, 0.1001, 0.1002], "d": [0.5],
             "e": [0.3, 0.31]}
    r = rank.rank_classes(seeds)
    assert r.classes == {"a": 1, "b": 2, "c": 4, "d": 1, "e": 3}
    assert [rank.rank_classes({**seeds, "b": seeds["b"][:i] + seeds["b"][i + 1:]}).classes["b"]
            for i in range(3)] == [1, 1, 2]
    stable = rank.stability(seeds)
    assert stable["b"] is False and stable["c"] is True and stable["d"] is None and stable["e"] is None


# ---------------------------------------------------------------------------------------------
# The hierarchical bootstrap
# ---------------------------------------------------------------------------------------------


def test_bootstrap_interval_of_seeds_that_all_score_the_same_is_not_zero_wide(rank):
    """Three seeds at 490 of 500: the seeds do not vary, the problems do (a binomial 98% of 500 has a standard
    error of 0.63 points): the interval is about 98 +- 1.2 points, not a point. Even three perfect seeds keep
    the width of half a problem wrong (the pseudo-counts), and stay within [0, 1]."""
    low, high = rank.bootstrap_interval([(500, 490.0, 490.0)] * 3)
    se = math.sqrt(0.98 * 0.02 / 500 / 3)  # three seeds' problems, pooled
    assert low < 0.98 < high and high - low == pytest.approx(2 * 1.96 * se, rel=0.2)
    low, high = rank.bootstrap_interval([(500, 500.0, 500.0)] * 3)
    assert 0.99 < low < high and high == 1.0
    assert rank.bootstrap_interval([(500, 0.0, 0.0)] * 3)[0] == 0.0 < rank.bootstrap_interval([(500, 0.0, 0.0)] * 3)[1]


def test_bootstrap_interval_counts_the_seeds_spread_is_deterministic_and_clipped(rank):
    """Seeds at 20% and 80% (500 problems each): the seed resampling dominates (draws of both seeds average to
    20, 50 or 80), so the interval spans most of it. The same evaluations give the same interval (a fixed
    generator seed). A non-0/1 metric near the top (nine problems at 1, one at 0.9: Normal(0.945, 0.066)) draws
    above 1; the interval is clipped at 1."""
    spread = rank.bootstrap_interval([(500, 100.0, 100.0), (500, 400.0, 400.0)])
    assert spread[0] < 0.25 and spread[1] > 0.75
    assert rank.bootstrap_interval([(500, 100.0, 100.0), (500, 400.0, 400.0)]) == spread
    assert rank.bootstrap_interval([(500, 100.0, 100.0), (500, 400.0, 400.0)], seed=1) != spread
    near_top = [(10, 9.9, 9.81)] * 3
    assert rank.bootstrap_interval(near_top, bounds=(-math.inf, math.inf))[1] > 1.0
    low, high = rank.bootstrap_interval(near_top)
    assert high == 1.0 and 0.85 < low < 0.95
    assert rank.bootstrap_interval([(100, 50.0, None)]) == rank.bootstrap_interval([(100, 50.0, 50.0)])


def test_evaluations_pool_a_seeds_runs(rank, monkeypatch):
    """A seed run twice is one evaluation of both runs' problems; another seed is another evaluation."""
    import load

    def result(seed, values, run):
        r = make_result(run_id=f"d1__tiny__addition__s{seed}__{run}", metrics=[
            metric_from_values("accuracy", values).model_dump()])
        r["training"]["seed"] = seed
        r["artifacts"] = {"samples_sha256": run * 64}
        return load.Result.model_validate(r)

    results = [result(0, [1, 1, 0, 1], "a"), result(0, [1, 0, 0, 1], "b"), result(1, [0, 0, 0, 1], "c")]
    assert rank.evaluations(results, "accuracy") == [(8, 5.0, 5.0), (4, 1.0, 1.0)]


# ---------------------------------------------------------------------------------------------
# Kendall's tau-b
# ---------------------------------------------------------------------------------------------


def test_tau_b_with_ties(rank):
    """scipy's documented example (-0.4714); [1, 2, 2, 3] against [1, 3, 2, 3] by hand: 4 concordant pairs, 0
    discordant, 5 pairs untied in each, 4 / 5; vectorised over draws; all ties: undefined."""
    assert rank.tau_b([12, 2, 1, 12, 2], [1, 4, 7, 1, 0]) == pytest.approx(-0.47140452079103173, abs=1e-12)
    assert rank.tau_b([1, 2, 2, 3], [1, 3, 2, 3]) == pytest.approx(0.8)
    draws = rank.tau_b(np.array([[1, 2, 3, 4], [4, 3, 2, 1]]), [10, 20, 30, 40])
    assert draws.tolist() == [1.0, -1.0]
    assert math.isnan(rank.tau_b([1, 1, 1], [1, 2, 3]))


# ---------------------------------------------------------------------------------------------
# Over results: the cross-family summary, the proxy check, the command
# ---------------------------------------------------------------------------------------------


def _write(root: Path, method: str, model: str, family: str, seed: int, correct: int, init: str = "sft"):
    """A result of `method` on `model`, `correct` of 100 problems right."""
    r = make_result(run_id=f"{method}__{model}__addition__s{seed}", method={"baseline": method, "init": init},
                    metrics=[metric_from_values("accuracy", [1] * correct + [0] * (100 - correct)).model_dump()])
    r["model"].update(name=model, family=family)
    r["decoding"]["sampler"] = "block" if family == "sdar" else "masked"
    r["training"].update(seed=seed, recipe_hash=f"{method}-r", config={"run": {"seed": seed}, "rl": {}})
    write_result(r, root / f"{method}-{model}-{seed}" / "result_addition.json")


@pytest.fixture
def results(tmp_path, monkeypatch):
    """bgpo on one model of two, coupled_grpo and d1 on both; three seeds each."""
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    (tmp_path / "committed").mkdir()
    monkeypatch.setenv("DARE_LEADERBOARD_RESULTS", str(tmp_path / "committed"))
    runs = tmp_path / "runs"
    for seed in range(3):
        _write(runs, "bgpo", "tiny-llada", "llada", seed, 99 - seed)
        for model, family in (("tiny-llada", "llada"), ("tiny-sdar", "sdar")):
            _write(runs, "coupled_grpo", model, family, seed, 90 + seed)
            _write(runs, "d1", model, family, seed, 60 + seed)
    monkeypatch.setenv("DARE_LEADERBOARD_RUNS", str(runs))
    import load

    return load.load_all()[0]


def test_the_cross_family_summary_averages_only_over_the_same_models(rank, results):
    """bgpo (99, 98, 97 on one model) would top an average over the models each method ran on; it ran on one of
    two, so it gets no mean and is listed after the methods run on both, which are averaged over both."""
    models, rows = rank.across(results, "addition [4/4/4, T=0]")
    assert models == ["tiny-llada", "tiny-sdar"]
    by = {row["method"]: row for row in rows}
    assert by["bgpo (from sft)"]["across"] is None and by["bgpo (from sft)"]["models"] == "1 of 2"
    assert by["coupled_grpo (from sft)"]["across"] == pytest.approx(91.0) and by["d1 (from sft)"]["across"] == 61.0
    assert [row["method"] for row in rows] == ["coupled_grpo (from sft)", "d1 (from sft)", "bgpo (from sft)"]
    assert by["bgpo (from sft)"]["class on tiny-llada"] == 1 and by["bgpo (from sft)"]["class on tiny-sdar"] is None
    assert by["d1 (from sft)"]["class on tiny-sdar"] == 2  # the classes are each model's own


def _published(root: Path, values: dict[str, float], benchmark: str = "gsm8k"):
    for method, value in values.items():
        (root / method).mkdir(parents=True, exist_ok=True)
        (root / method / "published.yaml").write_text(
            f'paper: {{arxiv: "0000.00000"}}\npublished:\n  - {{model: "LLaDA-8B-Instruct", benchmark: "{benchmark}", '
            f'gen_length: 256, block_length: 32, steps: 128, n_shot: 0, temperature: 0.0, value: {value}, '
            f'source: "a table"}}\n')


def test_proxy_is_kendalls_tau_against_a_published_ranking_of_five(rank, results, tmp_path):
    """Published (8B): coupled_grpo 80 > d1 70 > bgpo 60, and two methods not run here; ours (tiny LLaDA):
    bgpo 98 > coupled_grpo 91 > d1 61: one concordant pair of three (coupled_grpo, d1), two discordant, tau = -1/3;
    the seeds never reorder the three, so the bootstrap interval is that point. Only 3 methods overlap, and the
    row says so. A ranking of fewer than five methods is no ranking to check against."""
    _published(tmp_path / "repro", {"coupled_grpo": 80.0, "d1": 70.0, "bgpo": 60.0, "spg": 75.0, "wd1": 65.0})
    _published(tmp_path / "repro", {"gdpo": 50.0}, benchmark="countdown")
    assert [(p["benchmark"], len(p["values"])) for p in rank.published_rankings(tmp_path / "repro")] == [("gsm8k", 5)]
    rows = rank.proxy(results, "addition [4/4/4, T=0]", root=tmp_path / "repro")
    assert len(rows) == 1  # the LLaDA model only
    row = rows[0]
    assert row["model"] == "tiny-llada" and row["overlap"] == 3 and row["methods"] == "bgpo, coupled_grpo, d1"
    assert row["tau"] == pytest.approx(-1 / 3, abs=1e-3) and "fewer than 5 methods overlap (3)" in row["note"]
    assert row["low"] == row["tau"] == row["high"]


def test_the_command_prints_the_done_when_numbers(rank, results, tmp_path):
    """On one model: 3 RL methods, 3 pairs, all apart (1-point spreads 8 to 38 points apart); classes 1, 2, 3
    with the winner starred; every class survives leaving a seed out."""
    text = rank.report(results, "addition [4/4/4, T=0]", "tiny-llada")
    assert "pairs of RL methods that differ (uncorrected): 3 of 3 (100%)" in text
    assert "class 1: bgpo (from sft) 98.0" in text and "class 3: d1 (from sft) 61.0" in text
    assert "best: bgpo (from sft)" in text and "class survives leaving any one seed out: 3 of 3 (100%)" in text
    both = rank.report(results, "addition [4/4/4, T=0]")
    assert "== across the 2 models" in both and "pairs of RL methods that differ (uncorrected): 4 of 4 (100%)" in both
    with pytest.raises(SystemExit, match="no model 'nope'"):
        rank.report(results, "addition [4/4/4, T=0]", "nope")
    runs = Path(rank.load.run_dirs_from_env()[0])
    out = subprocess.run([sys.executable, str(REPO / "leaderboard" / "rank.py"), "--results",
                          str(tmp_path / "committed"), str(runs), "--column", "addition [4/4/4, T=0]", "--model",
                          "tiny-sdar"],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert "== tiny-sdar (2 trained methods, 2 of them RL)" in out and "best: coupled_grpo (from sft)" in out


def test_the_command_on_the_committed_results_imports_no_torch():
    """The command reads the committed results (and the papers' numbers) without torch."""
    code = ("import sys; sys.path.insert(0, 'leaderboard'); import load, rank; items, _ = load.load_all([]); "
            "text = rank.report(items, 'sudoku_fill [5/5/5, T=0]', 'tiny-llada-sudoku'); "
            "assert 'pairs of RL methods that differ (uncorrected)' in text and 'proxy' in text, text; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_proxy_ranks_the_start_as_sft_and_says_when_tau_is_undefined(rank, results, tmp_path):
    """The papers rank the SFT model beside the RL methods trained from it (d1's Table 1: SFT, d1, wd1, ...); the
    column's start is that row here. Published sft 50 < d1 70 < coupled_grpo 80; ours: start 40 < d1 61 <
    coupled_grpo 91: tau = 1 over three. Published numbers that tie every pair give no tau-b: a row with a note,
    not "nan". A table whose protocol is not stated ranks its own methods (one source, one protocol)."""
    runs = Path(rank.load.run_dirs_from_env()[0])
    for seed in range(3):
        _write(runs, "sft", "tiny-llada", "llada", seed, 40, init="scratch")
    import load

    items = load.load_all()[0]
    _published(tmp_path / "repro", {"sft": 50.0, "d1": 70.0, "coupled_grpo": 80.0, "spg": 75.0, "wd1": 65.0})
    [row] = rank.proxy(items, "addition [4/4/4, T=0]", root=tmp_path / "repro")
    assert row["methods"] == "coupled_grpo, d1, sft" and row["tau"] == 1.0
    _published(tmp_path / "tied", {"sft": 50.0, "d1": 50.0, "mdpo": 60.0, "spg": 75.0, "wd1": 65.0})
    [row] = rank.proxy(items, "addition [4/4/4, T=0]", root=tmp_path / "tied")
    assert row["methods"] == "d1, sft" and row["tau"] is None and "tau-b undefined" in row["note"]
    assert "tau = +nan" not in rank.report(items, "addition [4/4/4, T=0]", "tiny-llada")
    (tmp_path / "unstated" / "d1").mkdir(parents=True)
    for i, m in enumerate(["d1", "coupled_grpo", "bgpo", "spg", "vrpo"]):
        (tmp_path / "unstated" / m).mkdir(parents=True, exist_ok=True)
        (tmp_path / "unstated" / m / "published.yaml").write_text(
            f'paper: {{arxiv: "0000.00000"}}\npublished:\n  - {{model: "LLaDA-8B-Instruct", benchmark: "gsm8k", '
            f'value: {50 + i}, source: "one README table"}}\n')
    [pub] = rank.published_rankings(tmp_path / "unstated")
    assert pub["protocol"] == "one README table (one table; protocol not stated)" and len(pub["values"]) == 5
