"""The documentation: README.md is a short front page whose method table is generated, and the MkDocs
site (mkdocs.yml, docs/) builds with `mkdocs build --strict`, one page per baseline, no broken link."""

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
