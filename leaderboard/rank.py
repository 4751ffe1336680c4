"""Which method is better under one budget, and which methods tie (issue 58). Torch-free: numpy, no scipy.

Read top to bottom; each number is made once, here:

1. Student's t distribution (`t_cdf`, `t_quantile`), from the regularized incomplete beta function's continued
   fraction (`betainc`).
2. Tests between the methods of one column (one task and decoding) on one model: `welch` (Welch's t-test over
   seeds, two-sided), `holm` (Holm's step-down correction over all pairs of the column), `rank_classes` (a method's
   rank class is 1 + the number of methods significantly better than it after the correction, as the arena
   leaderboards' rank bounds: methods not separated share a class; the best is starred only when it is
   significantly better than every other), `stability` (does a method's class survive leaving any one of its
   seeds out?).
3. A cell's 95% interval that counts the evaluation's own noise: `bootstrap_interval`, a hierarchical bootstrap
   over seeds and, within each seed, its N problems.
4. `tau_b`: Kendall's tau-b (ties handled), vectorised over bootstrap draws.
5. The views: `board` (the landing table: rank class, mean [interval] per model, seeds, the score and area at
   equal forward passes (`equal_compute`), stability, links), `across` (the cross-family summary: only methods run
   on the same set of models are averaged), `proxy` (Kendall's tau between the papers' LLaDA-8B rankings and
   ours).
6. `main`: `python leaderboard/rank.py --column "<task label>" [--model <name>] [--results DIR ...]` prints issue
   58's "Done when" numbers for a column.

Scores are fractions in [0, 1] (the result JSONs'); tables show them in %. A "seed" is a distinct seed of one
recipe on one model (`load.seed_groups`: a seed run again is one seed, its runs averaged).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import load
from dare.results import Result

ALPHA = 0.05  # the tests' level
DRAWS = 4000  # bootstrap draws
SEED = 58  # the bootstrap's generator seed: the same results give the same intervals
BOUNDS = (0.0, 1.0)  # a score's range
PROXY_MIN = 5  # methods a published ranking needs, and the overlap a proxy correlation is read from
PROXY_BENCHMARKS = ("gsm8k", "countdown", "sudoku")
PROXY_MODEL = "LLaDA-8B"  # the published model family the suite's LLaDA ranking stands in for
EPS = 1e-12  # differences below this are rounding (seed values are means of counts)


# ---------------------------------------------------------------------------------------------
# 1. Student's t distribution
# ---------------------------------------------------------------------------------------------


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) for a, b > 0, 0 <= x <= 1: its continued fraction
    (Numerical Recipes, 3rd ed., §6.4), evaluated by the modified Lentz method on the side where it converges fast
    (I_x(a, b) = 1 - I_{1-x}(b, a))."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 10_000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),  # the even step, then the odd one
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return f


def t_tail(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom: the two-sided
    p-value of `t`, I_{df / (df + t^2)}(df / 2, 1 / 2)."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2, 0.5, df / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    half = t_tail(t, df) / 2
    return 1.0 - half if t > 0 else half


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = `p` (0 < p < 1) for `df` degrees of freedom: bisection on `t_cdf` (to 1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p}: a probability strictly between 0 and 1")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, 2 * high
    while high - low > 1e-12 * max(1.0, high):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


# ---------------------------------------------------------------------------------------------
# 2. Tests between methods: Welch, Holm, rank classes, stability
# ---------------------------------------------------------------------------------------------


def _mean_var(values: list[float]) -> tuple[float, float]:
    mean = math.fsum(values) / len(values)
    return mean, math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)


def welch(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """Welch's t-test of two methods' per-seed scores (unequal variances): (t of mean(a) - mean(b), the
    Welch-Satterthwaite degrees of freedom, the two-sided p-value). None when a side has fewer than two seeds (no
    test). When neither side varies over its seeds the standard error is 0: p = 1 for equal means, else 0."""
    if len(a) < 2 or len(b) < 2:
        return None
    (ma, va), (mb, vb) = _mean_var(a), _mean_var(b)
    ua, ub = va / len(a), vb / len(b)
    diff = ma - mb if abs(ma - mb) > EPS else 0.0
    if ua + ub <= EPS ** 2:
        df = len(a) + len(b) - 2.0
        return (0.0, df, 1.0) if diff == 0 else (math.copysign(math.inf, diff), df, 0.0)
    t = diff / math.sqrt(ua + ub)
    df = (ua + ub) ** 2 / (ua ** 2 / (len(a) - 1) + ub ** 2 / (len(b) - 1))
    return t, df, t_tail(t, df)


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjusted p-values: sorted ascending, the i-th (from 0) of m is multiplied by m - i, capped
    at 1 and made non-decreasing. A pair is significant at level alpha when its adjusted p is below alpha (the
    family-wise error rate over all the pairs stays at most alpha)."""
    out, running, m = {}, 0.0, len(pvalues)
    for i, key in enumerate(sorted(pvalues, key=pvalues.get)):
        running = max(running, min(1.0, (m - i) * pvalues[key]))
        out[key] = running
    return out


@dataclass
class Ranking:
    """Rank classes of the methods of one column on one model (`rank_classes`)."""
    means: dict[str, float]  # method -> mean over its seeds
    seeds: dict[str, int]  # method -> its number of seeds
    classes: dict[str, int]  # method -> 1 + the number of methods significantly better than it (Holm)
    better: dict[str, list[str]]  # method -> the methods significantly better than it
    tests: dict[tuple[str, str], tuple | None]  # (a, b) -> `welch(a, b)`, every pair of the column
    adjusted: dict[tuple[str, str], float]  # (a, b) -> Holm's adjusted p, the pairs tested
    best: str | None  # the method starred: significantly better than every other; None where the best is tied

    @property
    def pairs(self) -> int:
        """Pairs of methods with a test (both with two seeds or more)."""
        return len(self.adjusted)

    @property
    def separated(self) -> int:
        """Pairs that differ at `ALPHA` after Holm's correction."""
        return sum(p < ALPHA for p in self.adjusted.values())

    @property
    def raw_separated(self) -> int:
        """Pairs whose uncorrected Welch p-value is below `ALPHA` (issue 58's count)."""
        return sum(t[2] < ALPHA for t in self.tests.values() if t is not None)


def _pairs(labels: list[str]) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:]]


def rank_classes(seeds: dict[str, list[float]], alpha: float = ALPHA, higher: bool = True,
                 tests: dict | None = None) -> Ranking:
    """The rank classes of methods from their per-seed scores (`seeds`: method -> one value per seed): Welch's
    t-test (`welch`) on every pair, Holm's correction (`holm`) over all of them; a method is significantly better
    than another where the adjusted p is below `alpha` and its mean is higher (lower when not `higher`). `tests`:
    the pairs' Welch tests when already known (`stability` changes one method's)."""
    labels = list(seeds)
    tests = tests if tests is not None else {(a, b): welch(seeds[a], seeds[b]) for a, b in _pairs(labels)}
    adjusted = holm({pair: t[2] for pair, t in tests.items() if t is not None})
    better: dict[str, list[str]] = {label: [] for label in labels}
    for (a, b), p in adjusted.items():
        if p < alpha and tests[(a, b)][0] != 0:
            winner, loser = (a, b) if (tests[(a, b)][0] > 0) == higher else (b, a)
            better[loser].append(winner)
    means = {label: math.fsum(v) / len(v) for label, v in seeds.items()}
    top = max(labels, key=lambda m: means[m] if higher else -means[m], default=None)
    beats_all = top is not None and len(labels) > 1 and all(top in better[m] for m in labels if m != top)
    return Ranking(means, {m: len(v) for m, v in seeds.items()}, {m: 1 + len(better[m]) for m in labels}, better,
                   tests, adjusted, top if beats_all else None)


def stability(seeds: dict[str, list[float]], alpha: float = ALPHA, higher: bool = True,
              ranking: Ranking | None = None) -> dict[str, bool | None]:
    """For every method: does its rank class stay the same when any one of its seeds is left out (the classes
    computed again, with the Holm correction, on the column with that seed dropped)? None for a method with fewer
    than three seeds: with one left out, one seed remains and no test can place it, so its class would stay by
    default (untested, not stable)."""
    ranking = ranking or rank_classes(seeds, alpha, higher)
    out: dict[str, bool | None] = {}
    for label, values in seeds.items():
        if len(values) < 3:
            out[label] = None
            continue
        out[label] = True
        for i in range(len(values)):
            dropped = {**seeds, label: values[:i] + values[i + 1:]}
            tests = {pair: welch(dropped[pair[0]], dropped[pair[1]]) if label in pair else test
                     for pair, test in ranking.tests.items()}
            if rank_classes(dropped, alpha, higher, tests).classes[label] != ranking.classes[label]:
                out[label] = False
                break
    return out


# ---------------------------------------------------------------------------------------------
# 3. A cell's interval: a hierarchical bootstrap over seeds and problems
# ---------------------------------------------------------------------------------------------


def bootstrap_interval(evaluations: list[tuple[int, float, float | None]], draws: int = DRAWS, seed: int = SEED,
                       bounds: tuple[float, float] = BOUNDS, level: float = 0.95) -> tuple[float, float]:
    """The percentile `level` interval of a cell's mean score from a hierarchical bootstrap: each draw resamples
    the cell's seeds with replacement and, within each resampled seed, its N problems, parametrically from the
    seed's evaluation (count N, sum, sum of squares; one per seed): a 0/1 metric (sum of squares = sum) as
    Binomial(N, p) / N, any other as Normal(mean, standard error). So a cell whose seeds all score the same still
    has the width of its evaluation's noise; and so that a seed scoring every problem alike (all right, all
    wrong) does too, each evaluation gets half a problem right and half a problem wrong added (the Jeffreys
    prior's pseudo-counts: p = (sum + 1/2) / (N + 1)). A metric without its sum of squares is drawn as 0/1 (the
    widest a [0, 1] metric of that mean can be). The ends are clipped to `bounds`. Vectorised (one array of
    `draws` x seeds) and deterministic (a generator seeded with `seed`)."""
    count = np.array([e[0] for e in evaluations], dtype=float)
    total = np.array([e[1] for e in evaluations], dtype=float)
    squares = np.array([e[1] if e[2] is None else e[2] for e in evaluations], dtype=float)
    binary = np.abs(squares - total) <= 1e-9 * np.maximum(1.0, count)
    n, s, q = count + 1, total + 0.5, squares + 0.5  # the pseudo-counts
    p = s / n
    se = np.sqrt(np.maximum(q - s * s / n, 0.0) / (n - 1) / n)
    rng = np.random.default_rng(seed)
    pick = rng.integers(len(count), size=(draws, len(count)))  # the resampled seeds of every draw
    counts = rng.binomial(count[pick].astype(np.int64), p[pick]) / count[pick]
    normal = rng.normal(p[pick], se[pick])
    means = np.where(binary[pick], counts, normal).mean(axis=1)
    low, high = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return float(np.clip(low, *bounds)), float(np.clip(high, *bounds))


def evaluations(results: list[Result], metric: str) -> list[tuple[int, float, float | None]]:
    """One evaluation (count, sum, sum of squares) per distinct seed of `results` (`load.seed_groups`), a seed's
    runs pooled (their problems together)."""
    out = []
    for runs in load.seed_groups(results):
        ms = [r.metric(metric) for r in runs]
        squares = None if any(m.sum_sq is None for m in ms) else sum(m.sum_sq for m in ms)
        out.append((sum(m.count for m in ms), sum(m.sum for m in ms), squares))
    return out


# ---------------------------------------------------------------------------------------------
# 4. Kendall's tau-b
# ---------------------------------------------------------------------------------------------


def tau_b(x, y) -> np.ndarray | float:
    """Kendall's tau-b between `x` and `y` (the last axis; leading axes are draws, vectorised): (concordant -
    discordant pairs) / sqrt(pairs not tied in x * pairs not tied in y), so ties count in neither the numerator
    nor their own side of the denominator. NaN where one side is all ties."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    i, j = np.triu_indices(x.shape[-1], 1)
    sx, sy = np.sign(x[..., i] - x[..., j]), np.sign(y[..., i] - y[..., j])
    den = np.sqrt((sx != 0).sum(-1) * (sy != 0).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = np.where(den > 0, (sx * sy).sum(-1) / np.where(den > 0, den, 1), np.nan)
    return float(tau) if tau.ndim == 0 else tau


# ---------------------------------------------------------------------------------------------
# 5. The column's cells, equal compute, the board, across families, the proxy check
# ---------------------------------------------------------------------------------------------


@dataclass
class Cell:
    """The results of one recipe (its label: `load.row_labels(within=model)`) on one model of a column."""
    label: str
    model: str
    family: str
    baseline: str
    results: list[Result] = field(default_factory=list)
    start: bool = False  # a base model another result of the model trained from: shown, not ranked
    rl: bool = False  # trained by an RL recipe (its config has an `rl` section)


def column_cells(items, column: str, metric: str | None = None) -> list[Cell]:
    """The cells of one column (`load.benchmark_label`), by model (family, name) and first appearance; results
    without `metric` are left out."""
    results = [r for _, r in items if load.benchmark_label(r) == column
               and (metric is None or any(m.name == metric for m in r.metrics))]
    labels = load.row_labels(results, within=lambda r: r.model.name)
    started_from = {(r.model.name, r.method.init) for r in results}
    cells: dict[tuple[str, str], Cell] = {}
    for r in sorted(results, key=lambda r: (r.model.family, r.model.name)):
        key = (r.model.name, labels[load.recipe(r)])
        if key not in cells:
            start = r.method.init in load.BASE_INITS and (r.model.name, r.method.baseline) in started_from
            rl = bool(r.training and isinstance(r.training.config, dict) and "rl" in r.training.config)
            cells[key] = Cell(key[1], r.model.name, r.model.family, r.method.baseline, start=start, rl=rl)
        cells[key].results.append(r)
    return list(cells.values())


def column_metric(items, column: str) -> str | None:
    """The metric a column is ranked on: the headline's (`load.HEADLINE`) for a headline task, else the main
    metric of its results."""
    results = [r for _, r in items if load.benchmark_label(r) == column]
    if not results:
        return None
    headline = dict(load.HEADLINE).get(results[0].benchmark.name)
    if headline and any(m.name == headline for m in results[0].metrics):
        return headline
    return load.main_metric(results[0])


def higher_is_better(cells: list[Cell], metric: str) -> bool:
    return all(r.metric(metric).higher_is_better for c in cells for r in c.results)


def seed_values(cells: list[Cell], metric: str) -> dict[str, list[float]]:
    """Ranked method (a cell that is not a start) -> its per-seed scores (`load.per_seed`)."""
    return {c.label: load.per_seed(c.results, metric) for c in cells if not c.start}


@dataclass
class Compute:
    """The column at equal forward passes (`equal_compute`)."""
    metric: str | None  # the curve metric (`val/<metric>` where logged)
    budget: float | None  # the common forward budget (`load.common_budget`, the Compute tab's)
    start: float | None  # where the area starts: the last first logged point over the column's curves
    at: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (model, label) -> per seed, at budget
    area: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (model, label) -> per seed, mean to it


def mean_until(curve: list[dict], metric: str, start: float, budget: float) -> float | None:
    """The normalised area under a validation curve: the mean of `metric` over forward passes from `start` to
    `budget` (the area under the curve, linear between logged points as `load.value_at` reads it, divided by
    `budget - start`); None where the curve does not cover the range."""
    ends = [load.value_at(curve, load.FORWARDS, x, metric) for x in (start, budget)]
    if None in ends:
        return None
    if budget <= start:
        return ends[1]
    inside = sorted((rec[load.FORWARDS], rec[metric]) for rec in curve
                    if load.FORWARDS in rec and metric in rec and start < rec[load.FORWARDS] < budget)
    xs, ys = [start] + [x for x, _ in inside] + [budget], [ends[0]] + [y for _, y in inside] + [ends[1]]
    return sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:])) / (budget - start)


def equal_compute(items, column: str, cells: list[Cell], metric: str | None = None) -> Compute:
    """Each cell's seeds at the column's common forward budget: the validation metric (`val/<metric>`, else the
    Compute tab's default, `load.compute_metrics`) interpolated there (`load.value_at`), and its mean from the
    last first logged point of the column's curves up to the budget (`mean_until`); a seed's runs averaged (every
    copy read: a run published twice may have its curves beside one copy only), seeds without a value left out. The
    budget is the Compute tab's (`load.common_budget`)."""
    names, default = load.compute_metrics(items, column)
    curve_metric = f"val/{metric}" if metric and f"val/{metric}" in names else default
    curves = {load.result_key(r): load.read_curve(load.curve_file(p))  # a start retrained keeps its run id
              for p, r in items if load.benchmark_label(r) == column}
    budget = load.common_budget(curves.values(), curve_metric)
    if budget is None:
        return Compute(curve_metric, None, None)
    firsts = [min(rec[load.FORWARDS] for rec in c if load.FORWARDS in rec and curve_metric in rec)
              for c in curves.values() if any(load.FORWARDS in rec and curve_metric in rec for rec in c)]
    start = max(firsts)
    out = Compute(curve_metric, budget, start)
    for c in cells:
        at, area = [], []
        for runs in load.seed_groups(c.results, copies=True):
            for values, fn in ((at, lambda cv: load.value_at(cv, load.FORWARDS, budget, curve_metric)),
                               (area, lambda cv: mean_until(cv, curve_metric, start, budget))):
                got = [v for v in (fn(curves.get(load.result_key(r), [])) for r in runs) if v is not None]
                if got:
                    values.append(sum(got) / len(got))
        if at:
            out.at[(c.model, c.label)] = at
        if area:
            out.area[(c.model, c.label)] = area
    return out


def code_url(reference_code: str) -> str:
    """The GitHub address of a front matter's `reference_code` (`owner/repo@commit (files)`), '' when it names none
    (`none released ...`)."""
    found = re.match(r"([A-Za-z0-9][\w.-]*/[\w.-]+?)(?=[@ ;,(]|$)", reference_code or "")
    return f"https://github.com/{found.group(1)}" if found else ""


def _links() -> dict[str, tuple[str, str]]:
    """baseline -> (paper, code) addresses, from the baselines' front matter."""
    from dare.app.baselines import glossary  # torch-free

    return {g["name"]: (g["url"], code_url(g["reference_code"])) for g in glossary()}


def _pct(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(100 * x, digits)


def cell_text(mean: float, low: float, high: float) -> str:
    """`mean [low, high]` in %."""
    return f"{100 * mean:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


@dataclass
class Board:
    """The landing view of one column ranked on one model (`board`)."""
    column: str
    metric: str
    model: str  # the model the classes are for
    models: list[str]  # the column's models
    rows: list[dict]  # the table, best class first
    numbers: list[dict]  # one row per (method, model): mean, low, high (%), n, start, class
    ranking: Ranking
    stable: dict[str, bool | None]
    compute: Compute
    compute_ranking: Ranking | None  # classes at the common forward budget

    @property
    def order(self) -> list[str]:
        """The recipes' labels in the table's order."""
        return [row["method"].removeprefix("★ ").removesuffix(" (start)") for row in self.rows]

    @property
    def cannot_separate(self) -> bool:
        """Fewer than a quarter of the model's tested pairs differ after Holm's correction."""
        return self.ranking.pairs == 0 or self.ranking.separated < self.ranking.pairs / 4


def models_of(cells: list[Cell]) -> list[str]:
    """The column's models, by family and name."""
    return list(dict.fromkeys(c.model for c in cells))


def default_model(cells: list[Cell]) -> str | None:
    """The model the landing view ranks on first: the one with the most ranked methods."""
    models = models_of(cells)
    return max(models, key=lambda m: sum(1 for c in cells if c.model == m and not c.start), default=None)


def board(items, column: str, model: str | None = None, metric: str | None = None) -> Board:
    """The landing table of a column ranked on `model` (default: `default_model`), scored on `metric` (default:
    `column_metric`). A row per recipe of the model (its start last, not ranked): its rank class (`rank_classes`:
    Welch over seeds, Holm over all the model's pairs), ★ on the method only where it is significantly better than
    every other, the mean [95% interval] in % on every model of the column (`bootstrap_interval`; ⚠ over runs
    from different machines or lock files, `load.mixed`), its seeds, at equal forward passes the mean score at the
    common budget and the normalised area up to it with their rank classes (`equal_compute`), whether its class
    survives leaving out any one seed (`stability`), and the paper and code addresses (the front matter)."""
    metric = metric or column_metric(items, column)
    cells = column_cells(items, column, metric)
    model = model or default_model(cells)
    models = models_of(cells)
    higher = higher_is_better(cells, metric)
    mine = [c for c in cells if c.model == model]
    seeds = seed_values(mine, metric)
    ranking = rank_classes(seeds, higher=higher)
    stable = stability(seeds, higher=higher, ranking=ranking)
    compute = equal_compute(items, column, cells, metric)
    at_budget = {c.label: compute.at[(model, c.label)] for c in mine if not c.start and (model, c.label) in compute.at}
    compute_ranking = rank_classes(at_budget, higher=higher) if at_budget else None
    intervals = {(c.model, c.label): (load.stats(load.per_seed(c.results, metric)),
                                      bootstrap_interval(evaluations(c.results, metric))) for c in cells}
    mixed = {(c.model, c.label): load.mixed(c.results) for c in cells}
    links = _links()
    rows = []
    for c in mine:
        row = {"class": None if c.start else ranking.classes[c.label],
               "method": ("★ " if c.label == ranking.best else "") + c.label + (" (start)" if c.start else "")}
        for m in models:
            got = intervals.get((m, c.label))
            row[m] = cell_text(got[0][0], *got[1]) + (load.MIXED if mixed[(m, c.label)] else "") if got else ""
        at, area = compute.at.get((model, c.label)), compute.area.get((model, c.label))
        row.update({"mean": _pct(load.stats(load.per_seed(c.results, metric))[0], 2),
                    "seeds": len(load.seed_groups(c.results)),
                    "at budget": _pct(load.stats(at)[0], 2) if at else None,
                    "area": _pct(load.stats(area)[0], 2) if area else None,
                    "class at budget": compute_ranking.classes.get(c.label) if compute_ranking and at else None,
                    "stable": "start" if c.start else {True: "yes", False: "no", None: "too few seeds"}[stable[c.label]],
                    "paper": links.get(c.baseline, ("", ""))[0], "code": links.get(c.baseline, ("", ""))[1]})
        rows.append(row)
    rows.sort(key=lambda r: (r["class"] is None, r["class"] or 0, -(r["mean"] or 0) if higher else (r["mean"] or 0)))
    numbers = [{"method": c.label, "model": c.model, "mean": _pct(stats[0], 2), "low": _pct(ci[0], 2),
                "high": _pct(ci[1], 2), "n": stats[2], "start": c.start, "mixed": mixed[(c.model, c.label)],
                "class": ranking.classes.get(c.label) if c.model == model else None}
               for c in cells for stats, ci in [intervals[(c.model, c.label)]]]
    return Board(column, metric, model, models, rows, numbers, ranking, stable, compute, compute_ranking)


def across(items, column: str, metric: str | None = None) -> tuple[list[str], list[dict]]:
    """The cross-family summary of a column: (its models, one row per ranked recipe). A recipe run on every model
    of the column gets its mean over them (`across`, %) and its rank class on each model (`rank_classes` per
    model: the classes are per family, never pooled); a recipe run on fewer models gets no mean (`models` says
    on how many), so methods run on different sets of models are never ranked against each other by an average.
    Rows: the recipes run on every model by their mean, best first, then the others."""
    metric = metric or column_metric(items, column)
    cells = column_cells(items, column, metric)
    models = models_of(cells)
    higher = higher_is_better(cells, metric)
    classes = {m: rank_classes(seed_values([c for c in cells if c.model == m], metric), higher=higher).classes
               for m in models}
    rows = []
    for label in dict.fromkeys(c.label for c in cells if not c.start):
        means = {c.model: load.stats(load.per_seed(c.results, metric))[0] for c in cells if c.label == label}
        everywhere = len(means) == len(models)
        rows.append({"method": label, "across": _pct(math.fsum(means.values()) / len(means), 2) if everywhere else None,
                     "models": f"{len(means)} of {len(models)}",
                     **{f"class on {m}": classes[m].get(label) for m in models}})
    rows.sort(key=lambda r: (r["across"] is None, -(r["across"] or 0) if higher else (r["across"] or 0)))
    return models, rows


def published_rankings(root=None) -> list[dict]:
    """The papers' rankings the suite is checked against: for each published model of `PROXY_MODEL`, benchmark of
    `PROXY_BENCHMARKS` and protocol, the numbers of the methods trained from the released model (no `init`), one
    per method (the first its file lists: its own paper's), where at least `PROXY_MIN` methods report. A protocol is
    either stated (`dare.app.targets.comparable`: generation length, block length and steps) or one table's own:
    numbers without a stated protocol group by their source (DARE's README compares its methods in one table, under
    one protocol it does not state), never with stated ones."""
    import published  # leaderboard/published.py
    from dare.app import targets

    groups: dict[tuple, dict[str, float]] = {}
    for pub in published._load(root)[0]:
        for e in pub.numbers:
            if e["model"].startswith(PROXY_MODEL) and e["benchmark"] in PROXY_BENCHMARKS and not e.get("init"):
                protocol = (targets.protocol_text(e) if targets.comparable(e)
                            else f"{e['source']} (one table; protocol not stated)")
                groups.setdefault((e["model"], e["benchmark"], protocol), {}).setdefault(pub.baseline,
                                                                                         float(e["value"]))
    return [{"model": m, "benchmark": b, "protocol": p, "values": v}
            for (m, b, p), v in sorted(groups.items()) if len(v) >= PROXY_MIN]


def proxy(items, column: str, metric: str | None = None, models: list[str] | None = None, root=None,
          draws: int = DRAWS, seed: int = SEED) -> list[dict]:
    """Is the suite a proxy for the papers' 8B rankings? For each published ranking (`published_rankings`) and each
    LLaDA model of the column (or `models`): Kendall's tau-b (`tau_b`) between the published numbers and our means
    of the methods in both (a method with one recipe on the model; the column's start is its baseline, `sft`, as the
    papers rank the SFT model beside the RL methods trained from it), with a 95% percentile
    interval from a bootstrap over our seeds (each method's seeds resampled with replacement; the published
    numbers fixed). A row says when fewer than `PROXY_MIN` methods overlap; no correlation for fewer than two."""
    metric = metric or column_metric(items, column)
    cells = column_cells(items, column, metric)
    models = models or [m for m in models_of(cells) if any(c.model == m and c.family == "llada" for c in cells)]
    rankings = published_rankings(root)
    out = []
    for model in models:
        ranked = [c for c in cells if c.model == model]  # the start too: the papers' "SFT" rows rank it
        by_baseline: dict[str, list[Cell]] = {}
        for c in ranked:
            by_baseline.setdefault(c.baseline, []).append(c)
        ours = {b: load.per_seed(cs[0].results, metric) for b, cs in by_baseline.items() if len(cs) == 1}
        several = sorted(b for b, cs in by_baseline.items() if len(cs) > 1)
        for pub in rankings:
            both = [b for b in pub["values"] if b in ours]
            row = {"model": model, "benchmark": pub["benchmark"], "published on": pub["model"],
                   "protocol": pub["protocol"], "published methods": len(pub["values"]), "overlap": len(both),
                   "methods": ", ".join(both), "tau": None, "low": None, "high": None}
            notes = []
            if len(both) < PROXY_MIN:
                notes.append(f"fewer than {PROXY_MIN} methods overlap ({len(both)})")
            if several and any(b in pub["values"] for b in several):
                notes.append("left out, several recipes here: " + ", ".join(b for b in several if b in pub["values"]))
            published_values = [pub["values"][b] for b in both]
            point = tau_b([math.fsum(ours[b]) / len(ours[b]) for b in both], published_values) if len(both) >= 2 \
                else math.nan
            if len(both) >= 2 and math.isnan(point):
                notes.append("tau-b undefined: every pair is tied on one side")
            if not math.isnan(point):
                row["tau"] = round(float(point), 3)
                rng = np.random.default_rng(seed)
                means = np.stack([np.asarray(ours[b])[rng.integers(len(ours[b]), size=(draws, len(ours[b])))].mean(1)
                                  for b in both], axis=1)
                taus = tau_b(means, published_values)
                taus = taus[~np.isnan(taus)]
                if len(taus):
                    row["low"], row["high"] = (round(float(x), 3) for x in np.percentile(taus, [2.5, 97.5]))
            row["note"] = "; ".join(notes)
            out.append(row)
    return out


# ---------------------------------------------------------------------------------------------
# 6. The command: issue 58's "Done when" numbers for a column
# ---------------------------------------------------------------------------------------------


def _share(k: int, n: int) -> str:
    return f"{k} of {n}" + (f" ({100 * k / n:.0f}%)" if n else "")


def report(items, column: str, model: str | None = None) -> str:
    """The text `main` prints: for each model of the column (or `model`), the pairs of RL methods (RL recipes,
    starts left out) that differ at 5% by Welch's test over seeds, uncorrected, and the same for every trained
    method; the rank classes (Welch, Holm over all the model's pairs of trained methods); the share of methods whose
    class survives leaving any one seed out; the classes at equal forward passes; then the proxy correlations."""
    metric = column_metric(items, column)
    if metric is None:
        columns = sorted({load.benchmark_label(r) for _, r in items})
        raise SystemExit(f"no result in column {column!r}; columns: " + "; ".join(columns))
    cells = column_cells(items, column, metric)
    models = [model] if model else models_of(cells)
    unknown = [m for m in models if m not in models_of(cells)]
    if unknown:
        raise SystemExit(f"no model {unknown[0]!r} in {column!r}; models: {', '.join(models_of(cells))}")
    lines = [f"{column}: {metric}, {'higher' if higher_is_better(cells, metric) else 'lower'} is better",
             f"tests: Welch's t-test over seeds, two-sided, level {ALPHA}; classes with Holm's correction over all "
             "pairs of a model; intervals: hierarchical bootstrap over seeds and problems"]
    totals = {"rl": [0, 0], "all": [0, 0]}
    for m in models:
        b = board(items, column, m, metric)
        rl = {c.label for c in cells if c.model == m and c.rl and not c.start}
        raw = [(pair, t) for pair, t in b.ranking.tests.items() if t is not None]
        rl_raw = [(pair, t) for pair, t in raw if set(pair) <= rl]
        rl_pairs = len(rl) * (len(rl) - 1) // 2
        trained = len(b.ranking.classes)
        counts = {"rl": (sum(t[2] < ALPHA for _, t in rl_raw), rl_pairs),
                  "all": (b.ranking.raw_separated, trained * (trained - 1) // 2)}
        for key, (k, n) in counts.items():
            totals[key][0] += k
            totals[key][1] += n
        untested = [f"{label} ({n} seed)" for label, n in b.ranking.seeds.items() if n < 2]
        lines += ["", f"== {m} ({trained} trained methods, {len(rl)} of them RL)",
                  f"pairs of RL methods that differ (uncorrected): {_share(*counts['rl'])}",
                  f"pairs of trained methods that differ (uncorrected): {_share(*counts['all'])}"
                  + (f"; untested, one seed: {', '.join(untested)}" if untested else ""),
                  f"pairs separated after Holm: {_share(b.ranking.separated, b.ranking.pairs)}"]
        for k in sorted(set(b.ranking.classes.values())):
            members = sorted((x for x, c in b.ranking.classes.items() if c == k), key=lambda x: -b.ranking.means[x])
            lines.append(f"  class {k}: " + ", ".join(f"{x} {100 * b.ranking.means[x]:.1f}" for x in members))
        lines.append(f"best: {b.ranking.best} (significantly better than every other)" if b.ranking.best
                     else "best: tied (no method is significantly better than every other; no star)")
        kept = [x for x, s in b.stable.items() if s]
        tested = [x for x, s in b.stable.items() if s is not None]
        changed = [x for x in tested if x not in kept]
        lines.append(f"class survives leaving any one seed out: {_share(len(kept), len(tested))}"
                     + (f"; changes: {', '.join(changed)}" if changed else ""))
        if b.compute_ranking:
            lines.append(f"at equal forwards ({b.compute.metric} at {b.compute.budget:,.0f} forwards; mean from "
                         f"{b.compute.start:,.0f}): " + ", ".join(
                f"{x} class {b.compute_ranking.classes[x]} ({100 * b.compute_ranking.means[x]:.1f})"
                for x in sorted(b.compute_ranking.classes, key=lambda x: b.compute_ranking.classes[x])))
        else:
            lines.append("at equal forwards: no run of this model logged validation curves against "
                         f"{load.FORWARDS} up to the column's budget")
    if len(models) > 1:
        lines += ["", f"== across the {len(models)} models (each model's own pairs)",
                  f"pairs of RL methods that differ (uncorrected): {_share(*totals['rl'])}",
                  f"pairs of trained methods that differ (uncorrected): {_share(*totals['all'])}"]
    rows = proxy(items, column, metric, [m for m in models if any(c.model == m and c.family == "llada" for c in cells)])
    lines += ["", "== proxy: Kendall's tau-b, published LLaDA-8B ranking vs ours (95% bootstrap over our seeds)"]
    if not published_rankings():
        lines.append(f"no published ranking of {PROXY_MIN} methods or more under one stated protocol")
    if not rows:
        lines.append("no LLaDA model in this column (or none chosen): no proxy correlation")
    for r in rows:
        tau = ("no correlation" + (" (under two methods)" if r["overlap"] < 2 else "")) if r["tau"] is None else (
            f"tau = {r['tau']:+.2f}" + (f" [{r['low']:+.2f}, {r['high']:+.2f}]" if r["low"] is not None else ""))
        lines.append(f"{r['model']} vs {r['benchmark']} on {r['published on']} ({r['protocol']}): {tau}, "
                     f"{r['overlap']} of {r['published methods']} published methods here ({r['methods']})"
                     + (f"; {r['note']}" if r["note"] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Issue 58's numbers for one leaderboard column: pairs that differ, "
                                     "rank classes, stability under leaving a seed out, proxy correlations.")
    parser.add_argument("--results", nargs="+", type=Path, help="folders of result JSONs (default: the committed "
                        "leaderboard/results/); the first read as the committed folder, the rest as run folders")
    parser.add_argument("--column", required=True, help='a task and decoding label, e.g. "addition [4/4/4, T=0]"')
    parser.add_argument("--model", help="one model of the column (default: every model)")
    args = parser.parse_args(argv)
    if args.results:
        os.environ[load.COMMITTED_ENV] = str(args.results[0])
    items, invalid = load.load_all(args.results[1:] if args.results else [])
    for path, why in invalid:
        print(f"skipped {path}: {why}", file=sys.stderr)
    print(report(items, args.column, args.model))


if __name__ == "__main__":
    main()
