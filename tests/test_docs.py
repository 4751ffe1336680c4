"""The documentation: README.md is a short front page whose method table is generated, and the MkDocs
site (mkdocs.yml, docs/) builds with `mkdocs build --strict`, one page per baseline, no broken link."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dare.app import baselines, docs

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0, not a build problem


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = build(REPO / "mkdocs.yml", out)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_readme_is_a_front_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for what in ("make demo", "make test", "make docs", "d1 - sft:"):
        assert what in text, what


def test_readme_method_table_is_generated():
    text = (REPO / "README.md").read_text()
    assert docs.readme_with_table(text) == text, (
        f"README.md's method table differs from the baselines' front matter; run: {docs.REGENERATE}")
    for name in baselines.names():
        assert f"[{name}](baselines/{name}/README.md)" in text, name


def test_readme_links_resolve():
    """The README's relative links (to the docs pages, CONTRIBUTING.md, the screenshots) work on GitHub too."""
    text = (REPO / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"^[a-z]+:|^#", t)]
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (REPO / t.split("#")[0]).exists()]
    assert not missing, missing


def test_site_builds_strict_with_a_page_per_baseline(site):
    for name in baselines.names():
        page = site / "baselines" / f"{name}.html"
        assert page.is_file(), name
        html = page.read_text()
        meta = baselines.front_matter(name)
        arxiv = str(meta["arxiv"])  # "" for a method without a paper (bridgeratio_grpo: a pull request)
        assert (not arxiv or f"https://arxiv.org/abs/{arxiv}" in html) and "Reference code" in html, name
    table = (site / "baselines" / "index.html").read_text().split("<table>", 1)[1].split("</table>")[0]  # the methods
    for entry in baselines.glossary():
        assert f'href="{entry["name"]}.html"' in table and entry["url"] in table, entry["name"]
    assert "Contributing a baseline" in (site / "contributing.html").read_text()
    for page in ("getting-started", "layout", "cli", "concepts/families", "concepts/samplers", "concepts/estimators",
                 "concepts/data", "training", "sweeps", "evaluation", "gpus", "results", "architecture"):
        assert (site / f"{page}.html").is_file(), page


@pytest.mark.parametrize("broken", [None, "[a page](no-such-page.md)", "[an anchor](training.md#no-such-heading)",
                                    "[a repository file](../shared/dare/no_such_module.py)"])
def test_a_broken_link_fails_the_strict_build(tmp_path, broken):
    """The check can fail: the same site with one broken link does not build (and without it, it does)."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("gpu", "__pycache__"))
    for source in ("baselines", "shared", "CONTRIBUTING.md"):  # what the hook and `watch:` read
        (tmp_path / source).symlink_to(REPO / source)
    page = tmp_path / "docs" / "sweeps.md"
    if broken:
        page.write_text(page.read_text() + f"\nSee {broken}.\n")
    r = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    out = r.stdout + r.stderr
    if broken is None:
        assert r.returncode == 0, out
    else:
        assert r.returncode != 0 and "Aborted with 1 warnings in strict mode" in out, out
        assert f"Doc file 'sweeps.md' contains a link '{broken.split('(')[1][:-1]}'" in out, out


def test_links_to_repository_files_become_code_paths():
    """A baseline README's link to a repository file the site does not show becomes its path as code; one
    to a page the site shows becomes a link to that page; one to nothing is kept (the build reports it)."""
    text = ("[the hooks](../../shared/dare/train/hooks.py), [d1](../d1/README.md), [guide](../../CONTRIBUTING.md), "
            "[gone](../../nothing.py), [web](https://arxiv.org/abs/1), ![pic](../../docs/img/landing.png)")
    out = docs.rewrite_links(text, "baselines/sft/README.md", "baselines/sft.md")
    assert "the hooks (`shared/dare/train/hooks.py`)" in out
    assert "[d1](d1.md)" in out and "[guide](../contributing.md)" in out
    assert "[gone](../../nothing.py)" in out and "[web](https://arxiv.org/abs/1)" in out
    assert "![pic](../img/landing.png)" in out


def test_lists_written_for_github_read_the_same_in_the_site():
    """Python-Markdown needs a blank line before a list and 4 spaces for what an item holds; GitHub does not."""
    text = ("Steps:\n1. first\n   wrapped\n2. second\n\n   ```yaml\n   a:\n     b: 1\n   ```\n\n   more\n3. third\n\n"
            "After.\n- x\n\n```\n- not a list\n```\n")
    assert docs.github_lists(text) == (
        "Steps:\n\n1. first\n    wrapped\n2. second\n\n    ```yaml\n    a:\n      b: 1\n    ```\n\n    more\n\n3. third\n\n"
        "After.\n\n- x\n\n```\n- not a list\n```\n")


# --- what the pages claim, against the repository ---------------------------------------------------------------

NUMBERS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                      "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}
NUMBERS.update({f"twenty-{w}": 20 + NUMBERS[w] for w in "one two three four five six seven eight nine".split()})
BASELINE_COUNT = re.compile(r"\b(\d+|" + "|".join(sorted(NUMBERS, key=len, reverse=True)) + r")(?: [A-Za-z-]+)? baselines\b",
                            re.I)


def baseline_counts(text: str) -> list[int]:
    """Every count of baselines a text states ("seventeen baselines", "21 RL baselines")."""
    return [int(n) if n.isdigit() else NUMBERS[n.lower()] for n in BASELINE_COUNT.findall(text)]


def pages() -> list[Path]:
    """Every Markdown file the site or GitHub shows as documentation."""
    return sorted({*REPO.glob("docs/**/*.md"), REPO / "README.md", REPO / "CONTRIBUTING.md",
                   *REPO.glob("baselines/*/README.md"), *REPO.glob("reproductions/**/README.md")})


def test_a_count_of_baselines_is_the_number_of_baseline_folders():
    """Issue 58: the docs' home said "seventeen baselines" when 21 folders existed. No count goes stale unseen."""
    assert baseline_counts("seventeen baselines, 21 baselines, the twenty-one RL baselines") == [17, 21, 21]
    stated = {f"{page.relative_to(REPO)}: {n}": n for page in pages() for n in baseline_counts(page.read_text())}
    assert all(n == len(baselines.names()) for n in stated.values()), (len(baselines.names()), stated)


def test_the_site_loads_no_web_font(site):
    """Material fetches Roboto from Google Fonts unless `theme.font` is false; offline every page then waits
    about 5 s for it. The built pages reference no font server."""
    import yaml

    assert yaml.safe_load((REPO / "mkdocs.yml").read_text())["theme"]["font"] is False
    html = [page for page in site.rglob("*.html") if "fonts.googleapis.com" in page.read_text()
            or "fonts.gstatic.com" in page.read_text()]
    assert not html, html


FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*(.*)$")


def bare_fences(text: str) -> list[int]:
    """The lines of the fenced code blocks that open without a language (and of one left open)."""
    bare, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if not m:
            continue
        if fence is None:
            fence = m.group(1)
            if not m.group(2):
                bare.append(number)
        elif m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2):
            fence = None
    return bare + ([len(text.splitlines())] if fence else [])


def test_every_fenced_code_block_names_its_language():
    """A fence without a language is highlighted by guess (or not at all); every page says what its code is."""
    assert bare_fences("```bash\nmake\n```\n\n```\nplain\n```\n  ````text\n  ```\n  ````\n") == [5]
    bare = {str(page.relative_to(REPO)): bare_fences(page.read_text()) for page in pages()}
    assert not {page: lines for page, lines in bare.items() if lines}, "fences without a language (page: lines)"


SCHEMA_MENTION = re.compile(r'\bschema(?:_version:)? ?(?:v|")?(\d+)\b')


def test_the_docs_example_result_is_a_committed_result_of_the_current_schema(tmp_path):
    """docs/results.md shows a result JSON: it is read by the project's own reader, carries the schema version
    the code writes, and every field it shows is the committed result's of the same run id (trimmed, not made up).
    The docs name no other schema version as the current one."""
    from dare.results import SCHEMA_VERSION, load_results, read_result

    text = (REPO / "docs" / "results.md").read_text()
    examples = [e for e in re.findall(r"^```json\n(.*?)^```$", text, re.S | re.M) if '"schema_version"' in e]
    assert len(examples) == 1, "docs/results.md shows one example result JSON"
    example = examples[0]
    (tmp_path / "result_addition.json").write_text(example)
    shown = read_result(tmp_path / "result_addition.json")
    assert shown.schema_version == SCHEMA_VERSION

    def within(part, whole) -> bool:
        if isinstance(part, dict):
            return isinstance(whole, dict) and all(k in whole and within(v, whole[k]) for k, v in part.items())
        return part == whole

    valid, _ = load_results(REPO / "leaderboard" / "results", pattern="**/result_*.json")
    same = [path for path, r in valid if r.run_id == shown.run_id
            and within(json.loads(example), json.loads(path.read_text()))]
    assert same, f"no committed result {shown.run_id} holds every field of the example in docs/results.md"
    mentions = {f"{page.relative_to(REPO)}: {v}" for page in pages() for v in SCHEMA_MENTION.findall(page.read_text())}
    assert all(m.endswith(f": {SCHEMA_VERSION}") for m in mentions), mentions


def test_the_demo_output_shown_is_what_the_demo_prints_for_the_committed_results():
    """README.md and docs/getting-started.md show the demo's table as the demo's own `comparison` prints it for
    leaderboard/results/demo/ (`python -m dare.app.docs --write-readme`), and the claims around it hold there:
    the committed SFT and d1 accuracies lie in the ranges the pages tell a reader to expect, and the minutes a
    `make demo` took are at least the training time the results record."""
    from dare.results import read_result

    sft, d1 = docs.demo_results()
    accuracy = {"SFT": [read_result(sft).metric("accuracy").value],
                "d1": [read_result(p).metric("accuracy").value for p in d1]}
    trained_min = sum(read_result(p).training.wall_time_s for p in [sft, *d1]) / 60
    for page in docs.DEMO_PAGES:
        text = (REPO / page).read_text()
        assert docs.with_demo(text) == text, f"{page}: the demo's table is stale; run: {docs.REGENERATE}"
        ranges = re.findall(r"[Ee]xpect\s+SFT\s+within\s+([\d.]+)-([\d.]+)\s+and\s+d1\s+within\s+([\d.]+)-([\d.]+)", text)
        assert ranges, page
        for low_sft, high_sft, low_d1, high_d1 in ranges:
            for method, (low, high) in (("SFT", (low_sft, high_sft)), ("d1", (low_d1, high_d1))):
                assert all(float(low) <= 100 * a <= float(high) for a in accuracy[method]), (page, method, accuracy)
        took = [float(m) for m in re.findall(r"`make demo`\s+took\s+([\d.]+)\s+min", text)]
        assert took and all(m >= trained_min for m in took), (page, took, trained_min)


def test_the_demo_block_follows_the_results(tmp_path):
    """The generated block is read from the results: another SFT accuracy in the folder is another block."""
    sft, d1 = docs.demo_results()
    for path in [sft, *d1]:
        shutil.copytree(path.parent, tmp_path / path.parent.name)
    copy = tmp_path / sft.parent.name / sft.name
    data = json.loads(copy.read_text())
    metric = data["metrics"][0]
    metric["sum"] = metric["count"] * 0.25
    metric["value"] = 0.25
    copy.write_text(json.dumps(data))
    block = docs.demo_block(tmp_path)
    assert block != docs.demo_block() and re.search(r"sft +scratch +1 +0\.250 ", block), block
