"""The documentation's generated parts, torch-free: the method table (README.md's and the site's
Baselines page), the demo's output (README.md's and docs/getting-started.md's), one site page per baseline
from `baselines/<name>/README.md`, and the link rewriting that keeps the site's build strict.

`python -m dare.app.docs --write-readme` rewrites README.md's method table from the baselines' front
matter (`dare.app.baselines.glossary`) and the demo's table in README.md and docs/getting-started.md from
the committed demo results (leaderboard/results/demo/, printed by the demo's own `comparison`); `--check`
exits 1 when one differs (tests/test_docs.py does the same). The MkDocs hook (docs/hooks.py) calls
`baseline_page` and `rewrite_links` at build time, so no baseline page is committed under docs/.
"""

from __future__ import annotations

import argparse
import posixpath
import re
import sys
from pathlib import Path

from dare.app import baselines

TABLE_START = "<!-- methods: generated from the baselines' front matter by `python -m dare.app.docs --write-readme` -->"
TABLE_END = "<!-- /methods -->"
REGENERATE = "python -m dare.app.docs --write-readme"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def method_table(link: str = "baselines/{name}/README.md") -> str:
    """The Markdown table of every baseline: its name (linked through `link`, formatted with the
    name), the paper on arXiv, the one-line objective, the model families and the status."""
    rows = ["| method | paper | objective | families | status |", "|---|---|---|---|---|"]
    for entry in baselines.glossary():
        name = entry["name"]
        paper = f"[arXiv:{entry['arxiv']}]({entry['url']})" if entry["url"] else "-"
        rows.append(f"| [{name}]({link.format(name=name)}) | {paper} | {_cell(entry['summary'])} | "
                    f"{', '.join(entry['families'])} | {_cell(entry['status'])} |")
    return "\n".join(rows)


def _between(text: str, start_marker: str, end_marker: str, body: str) -> str:
    """`text` with what lies between the two marker lines replaced by `body`."""
    start, end = text.find(start_marker), text.find(end_marker)
    if start < 0 or end < start:
        raise ValueError(f"no markers {start_marker!r} ... {end_marker!r}")
    return text[:start] + start_marker + "\n" + body + "\n" + text[end:]


def readme_with_table(text: str) -> str:
    """README.md's text with the block between the table's markers regenerated."""
    return _between(text, TABLE_START, TABLE_END, method_table())


# --- the demo's output, from its committed results ------------------------------------------------------

DEMO_START = "<!-- demo: generated from leaderboard/results/demo/ by `python -m dare.app.docs --write-readme` -->"
DEMO_END = "<!-- /demo -->"
DEMO_RESULTS = "leaderboard/results/demo"
DEMO_PAGES = ("README.md", "docs/getting-started.md")
"""The files that show the demo's table between the demo markers."""


def demo_results(folder: Path | None = None) -> tuple[Path, list[Path]]:
    """The committed demo results: the SFT run's result file and the d1 seeds' in seed order."""
    from dare.results import read_result

    paths = sorted((folder or repo() / DEMO_RESULTS).glob("*/result_addition.json"))
    by_method: dict[str, list[tuple[int, Path]]] = {}
    for path in paths:
        result = read_result(path)
        by_method.setdefault(result.method.baseline, []).append((result.training.seed, path))
    if len(by_method.get("sft", [])) != 1 or not by_method.get("d1"):
        raise ValueError(f"{folder or DEMO_RESULTS}: expected one sft result and the d1 seeds', found "
                         f"{ {k: len(v) for k, v in by_method.items()} }")
    return by_method["sft"][0][1], [path for _, path in sorted(by_method["d1"])]


def demo_block(folder: Path | None = None) -> str:
    """What the demo printed for its committed results (`dare.app.demo.comparison`), as Markdown, under the
    commit and the machine that made them."""
    from dare.app.demo import comparison
    from dare.results import read_result

    sft, d1 = demo_results(folder)
    made = read_result(sft).provenance
    hw = made.hardware
    return (f"\nThe committed results (`{DEMO_RESULTS}/`: commit {(made.git_commit or '?')[:7]}, {hw.cpu_model}, "
            f"torch dispatching {hw.cpu_capability} kernels, {hw.blas}, {hw.threads} threads):\n\n"
            "```text\n" + "\n".join(comparison(sft, d1)) + "\n```\n")


def with_demo(text: str) -> str:
    """A page's text with the block between the demo markers regenerated from the committed demo results."""
    return _between(text, DEMO_START, DEMO_END, demo_block())


def regenerated(page: str, text: str) -> str:
    """The text of `page`, one of `DEMO_PAGES`, with every generated block regenerated (README.md's method table
    too)."""
    if page == "README.md":
        text = readme_with_table(text)
    return with_demo(text) if page in DEMO_PAGES else text


# --- the site's pages from repository files ------------------------------------------------------------

LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)(\s+\"[^\"]*\")?\)")


def site_path(repo_path: str, docs_dir: str = "docs") -> str | None:
    """The site page (a path below the docs folder) that shows a repository file, or None."""
    if repo_path.startswith(docs_dir + "/"):
        return repo_path[len(docs_dir) + 1:]
    if repo_path == "README.md":
        return "index.md"
    if repo_path == "CONTRIBUTING.md":
        return "contributing.md"
    m = re.fullmatch(r"baselines/([A-Za-z0-9_]+)/README\.md", repo_path)
    if m and m.group(1) in baselines.names():
        return f"baselines/{m.group(1)}.md"
    return None


def repo() -> Path:
    """The checkout (baselines/ lies at its top)."""
    return baselines.root().parent


def rewrite_links(markdown: str, source: str, page: str, repo_root: Path | None = None) -> str:
    """The links of `markdown` (the text of repository file `source`, shown as site page `page`)
    that point into the repository: a file the site shows becomes a link to its page, any other file
    or folder that exists becomes its path as code (the site has no copy of it). Web links, anchors and
    links to nothing are left as they are, so `mkdocs build --strict` reports the broken ones."""
    root = repo_root or repo()

    def one(m: re.Match) -> str:
        bang, text, target, title = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target, re.I):
            return m.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        if resolved.startswith("../") or not (root / resolved).exists():
            return m.group(0)
        shown = site_path(resolved) if (root / resolved).is_file() else None
        if shown is not None:
            rel = posixpath.relpath(shown, posixpath.dirname(page) or ".")
            return f"{bang}[{text}]({rel}{'#' + anchor if anchor else ''}{title})"
        if bang:
            return m.group(0)
        return f"`{resolved}`" if text.strip("`") in (path, resolved, "") else f"{text} (`{resolved}`)"
    return LINK.sub(one, markdown)


ITEM = re.compile(r"^(?:([-*+])|(\d{1,9})[.)])( {1,4})(?=\S)")
FENCE = re.compile(r"^(`{3,}|~{3,})")


def github_lists(markdown: str) -> str:
    """Markdown written for GitHub (CommonMark lists) read the same by Python-Markdown, which MkDocs uses: a
    list that follows a paragraph line (or an item that follows an item's second paragraph) gets the blank
    line before it that Python-Markdown needs, and what a
    top-level list item holds (its paragraphs, fenced code) is indented to the 4 spaces Python-Markdown
    needs instead of the marker's width (`3. ` holds text at 3 spaces on GitHub). Fenced code is kept."""
    out: list[str] = []
    head = ""
    width = None  # the content column of the open top-level list item
    fence = None
    for line in markdown.split("\n"):
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        if fence is not None:
            if body.startswith(fence) and not body.strip(fence[0]).strip():
                fence = None
            out.append(" " * (indent - width + 4) + body if width and indent >= width else line)
            continue
        m = ITEM.match(line)
        prev_blank = not out or not out[-1].strip()
        if prev_blank:
            head = line  # the first line of this blank-separated block (Python-Markdown's unit)
        if m and (width or prev_blank or m.group(1) or m.group(2) == "1"):
            if not prev_blank and not ITEM.match(head):
                out.append("")  # a list after a paragraph, or an item after an item's second paragraph
                head = line
            width = len(m.group(0))
            out.append(line)
        elif width and body and indent >= width:
            out.append(" " * (indent - width + 4) + body)
        elif width and body and prev_blank:
            width = None  # the list ended at the blank line
            out.append(line)
        else:
            out.append(line)
        f = FENCE.match(body)
        if f and not m:
            fence = f.group(1)
    return "\n".join(out)


def baseline_page(name: str) -> str:
    """The site page of one baseline: its README without the front matter, a header from the front
    matter (paper, arXiv, families, status, reference code, folder) under its first heading."""
    text = (baselines.root() / name / "README.md").read_text()
    meta = baselines.front_matter(name)
    body = text[text.find("\n---", 4) + 4:].lstrip("\n") if text.startswith("---\n") else text
    lines = body.splitlines()
    if lines and lines[0].startswith("# "):
        heading, rest = lines[0], lines[1:]
    else:
        heading, rest = f"# {name}", lines
    arxiv = str(meta.get("arxiv", ""))
    facts = [f"**Paper**: {_cell(meta.get('title', name))}"
             + (f" ([arXiv:{arxiv}](https://arxiv.org/abs/{arxiv}))" if arxiv else "")]
    if meta.get("summary"):
        facts.append(f"**Objective**: {_cell(meta['summary'])}")
    facts.append(f"**Families**: {', '.join(meta.get('families') or []) or '-'}")
    facts.append(f"**Status**: {_cell(meta.get('status', '-'))}")
    if meta.get("reference_code"):
        facts.append(f"**Reference code**: {_cell(meta['reference_code'])}")
    facts.append(f"**Folder**: `baselines/{name}/` (this page is its `README.md`)")
    header = "\n".join(f"- {fact}" for fact in facts)
    page = "\n".join([heading, "", header, "", *rest]) + "\n"
    return rewrite_links(page, f"baselines/{name}/README.md", f"baselines/{name}.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dare.app.docs", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write-readme", action="store_true",
                       help="rewrite README.md's method table and the demo's table in " + " and ".join(DEMO_PAGES))
    group.add_argument("--check", action="store_true", help="exit 1 when a generated block is stale")
    args = parser.parse_args(argv)
    if not (args.write_readme or args.check):
        print(method_table())
        return 0
    stale = []
    for page in DEMO_PAGES:
        path = repo() / page
        text = path.read_text()
        new = regenerated(page, text)
        if new != text:
            stale.append(page)
            if args.write_readme:
                path.write_text(new)
    if args.check:
        for page in stale:
            print(f"{page}: a generated block is stale; run: {REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    print(f"README.md: method table of {len(baselines.names())} baselines; {', '.join(DEMO_PAGES)}: the demo's "
          f"table from {DEMO_RESULTS}/ ({', '.join(stale) or 'nothing'} rewritten)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
