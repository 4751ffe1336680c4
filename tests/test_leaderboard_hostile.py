"""Hostile results folders (issue 45, items 5-8): a results folder is often a shared or downloaded one, so
no file in it may crash or hang the leaderboard, make it read or show another file, make the browser
fetch anything, or pass a name that reads as another one. Each hostile file sits in a tmp folder; the
files that would hang (a FIFO) or grow memory without bound (/dev/zero) are read in a subprocess with
a timeout and a memory limit, so a regression fails instead of hanging the suite."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dare.results import MAX_DEPTH, metric_from_values, write_result
from test_results import make_result

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "leaderboard" / "app.py")
EVIL = "![x](http://evil/beacon.png)"


@pytest.fixture
def load(tmp_path, monkeypatch):
    """leaderboard/load.py, with an empty committed folder (only the test's files are read)."""
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    for folder in ("committed", "runs"):
        (tmp_path / folder).mkdir()
    monkeypatch.setenv("DARE_LEADERBOARD_RESULTS", str(tmp_path / "committed"))
    monkeypatch.setenv("DARE_LEADERBOARD_RUNS", str(tmp_path / "runs"))
    import load

    return load


def _write(folder: Path, result: dict | str, name: str = "result_addition.json") -> Path:
    """A result file written as it is (hostile files are not valid results, so not `write_result`)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(result if isinstance(result, str) else json.dumps(result))
    return path


def _deep(depth: int) -> str:
    """A JSON object nested `depth` deep, written as text (json.dumps itself would recurse that deep)."""
    return '{"a": ' * depth + "1" + "}" * depth


def _invalid(load) -> dict[str, str]:
    """{file name: reason} of the invalid files `load_all` lists."""
    return {p.name: why for p, why in load.load_all()[1]}


# ---------------------------------------------------------------------------------------------
# 5. One file never takes the app down or hangs it
# ---------------------------------------------------------------------------------------------


def test_json_nested_200000_deep_is_an_invalid_file(load, tmp_path):
    _write(tmp_path / "runs" / "deep", "[" * 200_000 + "]" * 200_000)
    _write(tmp_path / "runs" / "ok", make_result())
    assert _invalid(load) == {"result_addition.json": f"nested deeper than {MAX_DEPTH} levels"}
    assert len(load.load_all()[0]) == 1


def test_a_schema_valid_result_with_a_950_deep_config_is_an_invalid_file(load, tmp_path):
    """It validates, but recursing over it (`_flat`, pickling into st.cache_data) raises RecursionError."""
    r = make_result()
    r["training"]["config"] = "DEEP"
    _write(tmp_path / "runs" / "deep", json.dumps(r).replace('"DEEP"', _deep(950)))
    why = _invalid(load)["result_addition.json"]
    assert why == f"nested deeper than {MAX_DEPTH} levels"


@pytest.mark.parametrize("old,new,shown", [
    ('"value": 0.75, "count": 4, "sum": 3.0', '"value": 1e308, "count": 1, "sum": 1e308', "metrics.0.value: 1e+308"),
    ('"lr": 0.001', '"lr": 1e999', "training.config.train.lr: inf"),  # 1e999 parses as infinity
    ('"n_params": 1000', '"n_params": ' + "9" * 40, "model.n_params: a 40-digit number"),
])
def test_absurd_numbers_make_a_file_invalid(load, tmp_path, old, new, shown):
    """Two seeds of 1e308 overflowed the seed statistics (OverflowError in `stats`)."""
    for seed in (0, 1):
        r = make_result(run_id=f"d1__tiny__addition__s{seed}__abcd1234")
        r["training"]["seed"] = seed
        text = json.dumps(r)
        assert old in text
        _write(tmp_path / "runs" / f"s{seed}", text.replace(old, new))
    items, invalid = load.load_all()
    assert not items and len(invalid) == 2
    assert all(why == f"{shown} is not a finite number within ±1e+18" for _, why in invalid), invalid


_SUBPROCESS_LOAD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))  # /dev/zero read whole fails, not the machine
sys.path.insert(0, "leaderboard")
import load
items, invalid = load.load_all()
info = load.run_detail(*items[0])
assert info["config"] is None and not info["samples"] and not info["curves"], info
print(json.dumps({"valid": len(items), "bench": len(load.load_bench()), "notes": [info["config_note"],
                  info["samples_note"]], "invalid": {p.name: why for p, why in invalid}}))
"""


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_fifo_or_dev_zero_named_like_a_result_neither_hangs_nor_grows_memory(tmp_path, kind):
    """A FIFO blocks its reader forever; a symlink to /dev/zero is endless. As a result file, a bench
    report (committed folder), a training log and a samples file beside a valid result: each is
    refused without being read, the result files listed with their reason."""
    runs, committed = tmp_path / "runs", tmp_path / "committed"
    committed.mkdir()
    r = make_result()
    r["artifacts"] = {"config": "config.yaml", "samples": "samples.jsonl"}
    _write(runs / "ok", r)

    for path in (runs / "bad" / "result_addition.json", committed / "bench-train.json",
                 runs / "ok" / "config.yaml", runs / "ok" / "samples.jsonl", runs / "ok" / "metrics.jsonl"):
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        else:
            os.symlink("/dev/zero", path)
    env = {**os.environ, "DARE_LEADERBOARD_RUNS": str(runs), "DARE_LEADERBOARD_RESULTS": str(committed)}
    done = subprocess.run([sys.executable, "-c", _SUBPROCESS_LOAD], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert out["valid"] == 1 and out["bench"] == 0
    assert out["invalid"] == {"result_addition.json": f"not a regular file ({what})",
                              "bench-train.json": f"not a regular file ({what})"}
    if kind == "fifo":  # /dev/zero resolves outside the result's folder: refused before opening
        assert [n.rsplit(": ", 1)[1] for n in out["notes"]] == [f"not a regular file ({what})"] * 2
    else:
        assert all(n.endswith("is outside the result's folder, not shown") for n in out["notes"]), out["notes"]


def test_training_curves_and_samples_skip_deep_lines_and_absurd_values(load, tmp_path):
    """A metrics.jsonl line nested 200,000 deep raised RecursionError, a logged 1e308 overflowed the seed
    statistics at equal forwards; a samples line nested that deep raised RecursionError in Run detail."""
    folder = tmp_path / "runs" / "run"
    r = make_result()
    r["artifacts"] = {"samples": "samples.jsonl"}
    path = _write(folder, r)
    (folder / "metrics.jsonl").write_text("\n".join([
        json.dumps({"step": 1, "loss/total": 0.5, "huge": 1e308}), "[" * 200_000 + "]" * 200_000,
        json.dumps({"step": 2, "loss/total": float("nan"), "\u202ekl": 0.1}), _deep(40)]) + "\n")
    (folder / "samples.jsonl").write_text(json.dumps({"completion": "3"}) + "\n" + "[" * 200_000 + "\n")
    assert load.read_curve(load.curve_file(path)) == [{"step": 1, "loss/total": 0.5}, {"step": 2}]
    info = load.run_detail(path, load.load_all()[0][0][1])
    assert info["samples"] == [{"completion": "3"}]


def test_bench_reports_are_read_with_the_same_guards(load, tmp_path):
    """A bench report nested 200,000 deep raised RecursionError; one whose parts have the wrong shape
    (a number where the comparison's dict belongs, hardware as a list) crashed the Speed view."""
    committed = tmp_path / "committed"
    _write(committed, '{"kind": "bench.train", "results": ' + "[" * 200_000 + "]" * 200_000 + "}", "bench-deep.json")
    _write(committed, {"kind": "bench.train", "hardware": ["x"], "results": {
        "packing": 5, "loss_memory": {"full_peak_mib": "a lot"},
        "rl_step": {"naive": {"reward_mean": "high"}, "accelerated": {"reward_mean": 0.5}}}}, "bench-shape.json")
    reports = load.load_bench()
    assert [p.name for p, _ in reports] == ["bench-shape.json"]
    rows = load.training_speed_rows(reports)
    assert [(r["comparison"], r["baseline"], r["hardware"]) for r in rows] == [
        ("packing vs padding (tokens/s)", None, "? (?)"), ("loss peak memory, MiB (vocab None)", None, "? (?)"),
        ("end-to-end RL step, s", None, "? (?)")]
    assert _invalid(load) == {"bench-deep.json": f"nested deeper than {MAX_DEPTH} levels"}


def test_gpu_acceptance_rows_come_from_released_reports_only(load, tmp_path):
    """`dare bench gpu` reports: one row per target with its verdict; the suite's shrunk CPU runs and a report
    whose targets are not a list (or hold non-dicts) give no row and no crash."""
    committed = tmp_path / "committed"
    target = {"target": "dual cache over vanilla", "measured": 6.4437, "need": 5.0, "met": True, "unit": "x"}
    base = {"kind": "bench.gpu", "card": "NVIDIA H200", "created": "2026-11-27T14:57:53Z",
            "git": {"commit": "07810c8f501b"}}
    _write(committed, {**base, "shrunk": False, "targets": [target, {**target, "met": False}, {**target, "met": None},
                                                            "junk"]}, "gpu-real.json")
    _write(committed, {**base, "shrunk": True, "targets": [target]}, "gpu-shrunk.json")
    _write(committed, {**base, "shrunk": False, "targets": {"a": 1}}, "gpu-shape.json")
    rows = load.gpu_target_rows(load.load_bench())
    assert [(r["report"], r["verdict"], r["measured"], r["card"], r["commit"], r["date"]) for r in rows] == [
        ("gpu-real.json", v, "6.44x", "NVIDIA H200", "07810c8", "2026-11-27") for v in ("met", "missed", "not measured")]


def test_the_committed_gpu_report_gives_its_targets(monkeypatch):
    """The first H200 run (leaderboard/results/bench-gpu/): its 9 targets, 5 met."""
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    import load

    rows = [r for r in load.gpu_target_rows(load.load_bench([])) if r["report"].startswith("gpu-NVIDIA_H200-2026-11-27")]
    assert len(rows) == 9 and sum(r["verdict"] == "met" for r in rows) == 5
    assert {r["measured"] for r in rows if "math attention" in r["target"]} == {"0 calls"}  # a zero is shown


def test_the_committed_h100_report_gives_its_targets(monkeypatch):
    """The H100 run of 2026-11-27 (docs/gpus.md): its 9 targets, 6 met, the same three of issue 47 missed."""
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    import load

    rows = [r for r in load.gpu_target_rows(load.load_bench([]))
            if r["report"].startswith("gpu-NVIDIA_H100_80GB_HBM3-2026-11-27")]
    assert len(rows) == 9 and sum(r["verdict"] == "met" for r in rows) == 6
    assert {r["card"] for r in rows} == {"NVIDIA H100 80GB HBM3"}
    assert sorted(r["target"] for r in rows if r["verdict"] == "missed") == sorted([
        "LLaDA2.1-mini forward, batch 8, grouped experts", "... the former loop over the same run's grouped forward",
        "LLaDA-8B cached block step, batch 1, captured, over one read of the weights"])


# ---------------------------------------------------------------------------------------------
# 6. No file makes the app read or show another file
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["absolute", "parent", "deeper", "symlink"])
def test_artifacts_are_read_only_inside_the_result_folder(load, tmp_path, where):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:SECRET\n")
    (tmp_path / "secret.jsonl").write_text(json.dumps({"completion": "SECRET"}) + "\n")
    folder = tmp_path / "runs" / "a" / "b"
    folder.mkdir(parents=True)
    names = {"absolute": (str(secret), str(tmp_path / "secret.jsonl")),
             "parent": ("../../../secret.txt", "../../../secret.jsonl"),
             "deeper": ("x/../../../../secret.txt", "./../../../secret.jsonl"),
             "symlink": ("config.yaml", "samples.jsonl")}[where]
    if where == "symlink":
        os.symlink(secret, folder / "config.yaml")
        os.symlink(tmp_path / "secret.jsonl", folder / "samples.jsonl")
    r = make_result()
    r["artifacts"] = {"config": names[0], "samples": names[1]}
    path = _write(folder, r)
    info = load.run_detail(path, load.load_all()[0][0][1])
    assert "SECRET" not in json.dumps(info, default=str)
    assert info["config"] is None and info["samples"] == []
    assert info["config_note"] == f"{names[0]} is outside the result's folder, not shown"
    assert info["samples_note"] == f"{names[1]} is outside the result's folder, not shown"


def test_artifacts_inside_the_result_folder_are_still_shown(load, tmp_path):
    folder = tmp_path / "runs" / "run"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "config.yaml").write_text("lr: 0.1\n")
    os.symlink("sub/config.yaml", folder / "link.yaml")  # a link that stays inside is followed
    r = make_result()
    r["artifacts"] = {"config": "link.yaml"}
    path = _write(folder, r)
    info = load.run_detail(path, load.load_all()[0][0][1])
    assert info["config"] == "lr: 0.1\n" and info["config_note"] is None


# ---------------------------------------------------------------------------------------------
# 7. No file makes the browser fetch anything; 8. no name reads as another
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field,value,char", [
    ("model.name", "\u202e1dw\u202c", "U+202E"),  # displays as a second "wd1"
    ("method.baseline", "w\u2066d1", "U+2066"),
    ("benchmark.name", "addi\u200btion", "U+200B"),  # zero width
    ("model.family", "llada\x1b[31m", "U+001B"),  # a terminal escape
    ("run_id", "run\u200f", "U+200F"),
    ("training.config.train.\u061cx", 1, "U+061C"),  # a key
    ("model.dtype", "\ud800", "U+D800"),  # a lone surrogate
])
def test_control_and_bidi_characters_make_a_file_invalid(load, tmp_path, field, value, char):
    r = make_result()
    *parents, last = field.split(".")
    target = r
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    _write(tmp_path / "runs" / "bad", r)
    why = _invalid(load)["result_addition.json"]
    shown = field.encode("unicode_escape").decode()
    key = "key has " if field.startswith("training.config") else ""
    assert why == f"{shown}: {key}control or format character {char}"
    assert why.isprintable()  # the reason itself shows no bidi character


def test_newlines_and_tabs_in_free_text_stay_valid(load, tmp_path):
    r = make_result()
    r["training"]["command"] = "dare train d1 \\\n\t--seed 0"
    _write(tmp_path / "runs" / "ok", r)
    assert len(load.load_all()[0]) == 1 and not _invalid(load)


def test_write_result_refuses_what_read_result_would(tmp_path):
    """A result the leaderboard would list as invalid is not written in the first place."""
    r = make_result()
    r["model"]["name"] = "\u202e1dw\u202c"
    with pytest.raises(ValueError, match=r"result\.json: model\.name: control or format character U\+202E; not written"):
        write_result(r, tmp_path / "result.json")
    assert not (tmp_path / "result.json").exists()


# ---------------------------------------------------------------------------------------------
# The app over a hostile folder
# ---------------------------------------------------------------------------------------------


def _markdown_texts(at) -> list[str]:
    """Every string the app hands to Markdown rendering: text elements and st.table cells and names."""
    texts = [e.value for elements in (at.markdown, at.caption, at.subheader, at.header, at.title) for e in elements]
    for t in at.table:
        df = t.value
        texts += [str(v) for v in [*df.index, *df.columns, *df.to_numpy().ravel()]]
    return texts


@pytest.fixture
def markdown_names(tmp_path, monkeypatch):
    """Two recipes of one method whose every name is a Markdown image (model, family, method, benchmark,
    metric, config key, CPU, a curve's metric) and whose config is /etc/passwd, beside a plain result."""
    runs = tmp_path / "runs"
    for seed in (0, 1):  # two recipes of one method: their labels come from the configs
        r = make_result(run_id=f"evil_{seed}", method={"baseline": EVIL.replace("x", "method"), "init": "sft"})
        r["model"].update(name=EVIL.replace("x", "model"), family=EVIL.replace("x", "family"))
        r["benchmark"]["name"] = EVIL.replace("x", "bench")
        r["metrics"] = [metric_from_values(EVIL.replace("x", "metric"), [1, 0]).model_dump()]
        r["training"].update(recipe_hash=f"r{seed}", config={"train": {EVIL.replace("x", "key"): seed}})
        r["provenance"]["hardware"]["cpu_model"] = EVIL.replace("x", "cpu")
        r["artifacts"] = {"config": "/etc/passwd"}
        _write(runs / f"evil_{seed}", r)
        (runs / f"evil_{seed}" / "metrics.jsonl").write_text(json.dumps({"step": 1, EVIL: 0.5}) + "\n")
    _write(runs / "plain", make_result())
    committed = tmp_path / "committed"
    committed.mkdir()
    monkeypatch.setenv("DARE_LEADERBOARD_RUNS", str(runs))
    monkeypatch.setenv("DARE_LEADERBOARD_RESULTS", str(committed))
    return runs


PLAIN_RUN = "d1__tiny__addition__s0__abcd1234"


def test_markdown_in_names_is_shown_as_plain_text(markdown_names):
    """Every view on the Markdown-named runs and on the plain one: no text the app renders as Markdown
    holds a link or image (`](http`); the names are there, escaped."""
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    for family, run_id in [(EVIL.replace("x", "family"), "evil_0"), ("llada", PLAIN_RUN)]:
        texts = []
        for tab in [t.label for t in at.tabs]:  # only the open tab runs: every view, one at a time
            at.session_state["tab"] = at.query_params["tab"] = tab  # a click on the tab
            at.run()
            if tab == "Leaderboard":
                at.selectbox(key="family").select(family).run()
            if tab == "Run detail":
                at.selectbox(key="run").select(run_id).run()
            assert not at.exception, (tab, at.exception)
            texts += _markdown_texts(at)
            if tab == "Leaderboard" and run_id == "evil_0":
                leaderboard = next(t for t in at.tabs if t.label == "Leaderboard")
                assert r"\!\[model\]\(http\:\/\/evil\/beacon\.png\)" in leaderboard.subheader[0].value  # as text
        assert not [t for t in texts if "](http" in t], "a Markdown link or image would be rendered"
        if run_id == "evil_0":
            assert all(any(rf"\!\[{x}\]" in t for t in texts) for x in ("method", "bench", "metric", "cpu", "family"))
            assert any("/etc/passwd is outside the result's folder, not shown" in c.value.replace("\\", "")
                       for c in at.caption)  # the Run detail, open last
            assert "root:" not in " ".join(c.value for c in at.code)


@pytest.fixture
def hostile(markdown_names, tmp_path):
    """The Markdown-named runs with every hostile result file that can be read in-process beside them
    (the FIFO and /dev/zero are the subprocess test's)."""
    runs = markdown_names
    _write(runs / "deep", "[" * 200_000 + "]" * 200_000)
    r = make_result(run_id="deep_config")
    r["training"]["config"] = "DEEP"
    _write(runs / "deep_config", json.dumps(r).replace('"DEEP"', _deep(950)))
    for seed in (0, 1):
        r = make_result(run_id=f"huge_{seed}", metrics=[{"name": "accuracy", "value": 1e308, "count": 1, "sum": 1e308}])
        r["training"]["seed"] = seed
        _write(runs / f"huge_{seed}", r)
    r = make_result(run_id="bidi")
    r["model"]["name"] = "\u202e1dw\u202c"
    _write(runs / "bidi", r)
    os.symlink(tmp_path / "nowhere.json", runs / "result_dangling.json")
    return runs


def test_a_hostile_folder_renders_and_lists_every_bad_file(hostile):
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    listed = at.expander[0].dataframe[0].value
    reasons = dict(zip(listed["file"].map(lambda f: str(Path(f).relative_to(hostile))), listed["reason"]))
    assert reasons == {
        "deep/result_addition.json": f"nested deeper than {MAX_DEPTH} levels",
        "deep_config/result_addition.json": f"nested deeper than {MAX_DEPTH} levels",
        "huge_0/result_addition.json": "metrics.0.value: 1e+308 is not a finite number within ±1e+18",
        "huge_1/result_addition.json": "metrics.0.value: 1e+308 is not a finite number within ±1e+18",
        "bidi/result_addition.json": "model.name: control or format character U+202E",
        "result_dangling.json": "unreadable: No such file or directory"}
    for tab, key in [("Families", "family_benchmark"), ("Compute", "compute_benchmark"),
                     ("By method", "heat_benchmark")]:  # every view still renders
        at.session_state["tab"] = at.query_params["tab"] = tab  # a click on the tab
        assert at.run().selectbox(key=key).options and not at.exception, (tab, at.exception)
    at.session_state["tab"] = at.query_params["tab"] = "Run detail"
    at.run()
    assert {o.rsplit(" · ", 1)[-1] for o in at.selectbox(key="run").options} == {"evil_0", "evil_1", PLAIN_RUN}
    at.selectbox(key="run").select("evil_1").run()
    assert not at.exception, at.exception



def test_csv_downloads_do_not_carry_formulas():
    import load

    cells = ["=HYPERLINK(\"http://evil\")", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\t=1", "d1", "-0.5", "+1.2",
             1.5, None]
    assert [load.csv_safe(c) for c in cells] == [
        "'=HYPERLINK(\"http://evil\")", "'+cmd|' /C calc'!A0", "'-2+3", "'@SUM(A1)", "'\t=1", "d1", "-0.5", "+1.2",
        1.5, None]


def test_a_fifo_given_directly_is_named_as_what_it_is(tmp_path):
    from dare.results import load_results

    os.mkfifo(tmp_path / "result_x.json")
    valid, invalid = load_results(tmp_path / "result_x.json", tmp_path / "missing.json")
    assert valid == [] and [why for _, why in invalid] == ["not a regular file (a FIFO)", "no such file or folder"]


# ---------------------------------------------------------------------------------------------
# Issue 60: the Published view's files, training logs linked out, the Speed tab's size, the fingerprint
# ---------------------------------------------------------------------------------------------

TARGETS = """paper: {arxiv: "2504.12216", table: "d1 Table 1"}
base_model: LLaDA-8B-Instruct
eval: {split: test, block_length: 32, steps_per_token: 0.5, temperature: 0.0, n_shot: 0}
tolerance: 2.0
targets:
  - {config: gsm8k.yaml, benchmark: gsm8k, gen_length: 256, value: 79.8}
"""
PUBLISHED = """paper: {arxiv: "2504.12216"}
published:
  - {model: LLaDA-8B-Instruct, benchmark: gsm8k, value: 79.8, source: "d1 Table 1", gen_length: 256}
"""
SECRET = "root:x:0:0:root:/root:/bin/bash\n"


@pytest.mark.parametrize("name, old, new, shown", [
    ("published.yaml", "benchmark: gsm8k", "benchmark: [gsm8k]", "published[0].benchmark=['gsm8k']: a non-empty string"),
    ("published.yaml", "benchmark: gsm8k", "benchmark: !!set {gsm8k}", "published.0.benchmark: a set;"),
    ("targets.yaml", 'paper: {arxiv: "2504.12216", table: "d1 Table 1"}', "paper: [arxiv, table]",
     "paper=['arxiv', 'table']: needs arxiv and table"),
    ("targets.yaml", "tolerance: 2.0", "tolerance: abc", "tolerance='abc': points, a number in [0, 100]"),
    ("published.yaml", '"d1 Table 1"', '"d1 Table 1\\u202e"', "published.0.source: control or format character U+202E"),
    ("targets.yaml", "d1 Table 1", "d1 \\e[31mTable 1", "paper.table: control or format character U+001B"),
    ("published.yaml", "gen_length: 256", "gen_length: 1" + "0" * 50, "published.0.gen_length: a 51-digit number"),
    ("published.yaml", "gen_length: 256", "gen_length: 256, temperature: .inf", "published.0.temperature: inf is not"),
    ("targets.yaml", "temperature: 0.0", "temperature: .inf", "eval.temperature: inf is not a finite number"),
    ("published.yaml", "", "#" + "x" * (18 << 20), "bytes, over the 1 MiB cap"),  # parsed in 130 s on every rerun
    ("published.yaml", "", "LINK", "a link to"),  # its first 200 characters were shown in a caption
    ("targets.yaml", "", "LINK", "a link to"),
])
def test_each_bad_published_file_is_one_line_on_the_page_and_the_others_still_show(monkeypatch, tmp_path, name, old,
                                                                                    new, shown):
    """Each of these raised out of the Published view (TypeError, AttributeError, ValueError), stopping the app at
    that tab, showed control and bidi characters raw, accepted 10^50 and T=inf, or read a file linked out of the
    reproductions folder and showed its start."""
    monkeypatch.syspath_prepend(str(REPO / "leaderboard"))
    import published

    root = tmp_path / "reproductions"
    path = root / "d1" / name
    path.parent.mkdir(parents=True)
    (path.parent / "gsm8k.yaml").write_text("baseline: d1\n")
    text = TARGETS if name == "targets.yaml" else PUBLISHED
    if new == "LINK":
        (tmp_path / "secret.yaml").write_text(SECRET)
        path.symlink_to(tmp_path / "secret.yaml")
    else:
        assert old in text
        path.write_text(text.replace(old, new) if old else text + new)
    (root / "wd1").mkdir()
    (root / "wd1" / "published.yaml").write_text(PUBLISHED)
    methods = {m["method"]: m for m in published.published_methods(root)}
    why = methods["d1"]["why none"]
    assert why.startswith(f"{path}: ") and shown in why and "\n" not in why and why.isprintable(), why[:500]
    assert "root:x" not in why and len(why) < 1000
    assert {r["method"] for r in published.published_rows([], root)} == {"wd1"}  # the others still show


def test_training_curves_are_not_read_through_a_link_out_of_their_folder(load, tmp_path):
    secret = tmp_path / "environ"
    secret.write_text('{"step": 1, "HF_TOKEN_is_1": 1}\n')
    r = _write(tmp_path / "runs" / "run", make_result())
    (r.parent / "metrics.jsonl").symlink_to(secret)
    assert load.read_curve(load.curve_file(r)) == []
    (r.parent / "metrics.jsonl").unlink()
    (r.parent / "metrics.jsonl").write_text(secret.read_text())
    assert load.read_curve(load.curve_file(r)) == [{"step": 1, "HF_TOKEN_is_1": 1}]


def test_the_speed_tab_reads_and_shows_a_bounded_amount_of_bench_reports(load, tmp_path, monkeypatch):
    """Ten 4 MiB bench reports made 607,860 rows (48 s, 830 MB); the rows and the bytes read are capped."""
    report = json.loads((REPO / "leaderboard" / "results" / "bench-gpu").glob("gpu-*.json").__next__().read_text())
    report["targets"] = [{"target": f"t{i}", "measured": 1.0, "need": 2.0, "unit": "s", "met": True}
                         for i in range(800)]
    for i in range(4):
        _write(tmp_path / "committed" / "bench-gpu", report, f"gpu-{i}.json")
    reports = load.load_bench()
    assert len(reports) == 4 and len(load.gpu_target_rows(reports)) == load.MAX_BENCH_ROWS == 1000
    size = (tmp_path / "committed" / "bench-gpu" / "gpu-0.json").stat().st_size
    monkeypatch.setattr(load, "MAX_BENCH_BYTES", 2 * size + 10)
    assert len(load.load_bench()) == 2


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "link_out"])
def test_the_results_fingerprint_neither_hangs_nor_reads_what_the_leaderboard_would_not(tmp_path, kind):
    """make screenshot and the browser test hung on a FIFO named *.json, and ran out of memory on a link to /dev/zero:
    in a subprocess with a timeout and a memory cap, so that a regression fails instead."""
    root = tmp_path / "results"
    (root / "run").mkdir(parents=True)
    (root / "run" / "result_a.json").write_text("{}\n")
    bad = root / "run" / "result_b.json"
    if kind == "fifo":
        os.mkfifo(bad)
    else:
        (tmp_path / "secret.json").write_text('{"token": "x"}\n')
        bad.symlink_to("/dev/zero" if kind == "dev_zero" else tmp_path / "secret.json")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30)); "
            "from dare.app.screenshot import results_fingerprint; print(results_fingerprint(__import__('pathlib').Path(sys.argv[1])))")
    fingerprint = lambda: subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True,
                                         timeout=60, cwd=REPO)
    done = fingerprint()
    assert done.returncode == 0 and len(done.stdout.strip()) == 64, done.stderr[-2000:]
    if kind == "link_out":  # the target's content does not count: changing it changes nothing
        (tmp_path / "secret.json").write_text('{"token": "y"}\n')
        assert fingerprint().stdout == done.stdout
    (root / "run" / "result_a.json").write_text("{ }\n")  # a regular file's bytes still count
    assert fingerprint().stdout != done.stdout
