"""MkDocs hooks (mkdocs.yml `hooks:`): the pages generated at build time, so nothing generated is
committed under docs/.

- one page per baseline, `baselines/<name>.md`, from `baselines/<name>/README.md` (the front matter
  shown as a small header: `dare.app.docs.baseline_page`), listed under Baselines in the navigation;
- `contributing.md`, CONTRIBUTING.md as it is;
- `<!-- method table -->` on a page becomes the method table (`dare.app.docs.method_table`);
- on every page, lists written for GitHub read as GitHub reads them (`dare.app.docs.github_lists`) and a
  relative link to a repository file the site does not show becomes its path as code
  (`dare.app.docs.rewrite_links`); a link to nothing is left, and `mkdocs build --strict` fails on it.
"""

import os
import sys

# MkDocs runs this file with docs/ first on sys.path, where docs/baselines/ (the baselines' pages) would be
# imported as a namespace package named `baselines`: import the repository's package first, without it.
_DOCS = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _DOCS]
import baselines  # noqa: E402,F401

from mkdocs.structure.files import File  # noqa: E402

from dare.app import baselines as found, docs  # noqa: E402

METHOD_TABLE = "<!-- method table -->"
GENERATED = set()


def on_config(config):
    for item in config["nav"] or []:
        if isinstance(item, dict) and "Baselines" in item:
            item["Baselines"] = ["baselines/index.md"] + [{name: f"baselines/{name}.md"} for name in found.names()]
    return config


def on_files(files, config):
    GENERATED.clear()
    for name in found.names():
        files.append(File.generated(config, f"baselines/{name}.md", content=docs.baseline_page(name)))
        GENERATED.add(f"baselines/{name}.md")
    text = (docs.repo() / "CONTRIBUTING.md").read_text()
    files.append(File.generated(config, "contributing.md",
                                content=docs.rewrite_links(text, "CONTRIBUTING.md", "contributing.md")))
    GENERATED.add("contributing.md")
    return files


def on_page_markdown(markdown, page, config, files):
    uri = page.file.src_uri
    markdown = docs.github_lists(markdown)
    if uri not in GENERATED:
        markdown = docs.rewrite_links(markdown, f"docs/{uri}", uri)
    if METHOD_TABLE in markdown:
        markdown = markdown.replace(METHOD_TABLE, docs.method_table(link="{name}.md" if uri.startswith("baselines/")
                                                                      else "baselines/{name}.md"))
    return markdown
