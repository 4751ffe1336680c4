"""CONTRIBUTING.md is the route a newcomer takes from the docs alone (issue 49, item 7): its tiny-task
route is the one the results folders' rule accepts and the one `dare checklist` prints, its front matter
names every key the checklist requires, and its list of shared building blocks is the code's."""

import re
from pathlib import Path

import yaml

from dare.app import baselines
from dare.app.cli import main
from dare.app.baselines import (BLOCK_MODULES, REQUIRED_FRONT_MATTER, TINY_RESULTS, TINY_SWEEP, blocks,
                                blocks_markdown, checklist, front_matter, tiny_commands, tiny_family)

REPO = Path(__file__).resolve().parents[1]
GUIDE = (REPO / "CONTRIBUTING.md").read_text()
PLACEHOLDERS = {"name": "<name>", "family": "<family>"}


def section(title: str) -> str:
    start = GUIDE.index(f"\n## {title}")
    end = GUIDE.find("\n## ", start + 1)
    return GUIDE[start:end if end >= 0 else None]


def test_the_guide_lists_every_shared_block_the_code_defines(capsys):
    """The list is `dare checklist --blocks` (every public function and class of the block modules): a block
    added to the code and not to the guide fails here. completion_logps and clipped_sequence_objective, which
    baselines import, were missing from the hand-written list."""
    listed = re.search(r"<!-- shared blocks: .*? -->\n(.*?)\n<!-- end of shared blocks -->", GUIDE, re.S)
    assert listed, "CONTRIBUTING.md: no generated list of shared blocks (its markers are gone)"
    assert listed.group(1) == blocks_markdown(), "CONTRIBUTING.md's shared blocks differ from `dare checklist --blocks`"
    assert main(["checklist", "--blocks"]) == 0 and capsys.readouterr().out == blocks_markdown() + "\n"
    found = blocks()
    assert list(found) == list(BLOCK_MODULES)
    assert "completion_logps" in found["dare.train.estimators"]
    assert "clipped_sequence_objective" in found["dare.train.objectives"]
    # every name a baseline imports from a block module is in the list
    for path in sorted(REPO.glob("baselines/*/algorithm.py")):
        for module, names in re.findall(r"from (dare\.train\.\w+) import ([\w, ]+)", path.read_text()):
            if module in found:
                assert set(n.strip() for n in names.split(",")) <= set(found[module]), (path, module)


def test_the_tiny_route_is_one_sweep_and_one_results_folder_per_baseline():
    """The guide's section 6 gives the commands `dare checklist` prints (from the same constants), into a folder
    of its own directly under leaderboard/results/ (the unit of the one-commit rule), as every committed baseline
    since ESPO did it: each committed folder of that pattern was collected by the sweep file the route names."""
    tiny = section("6. Tiny-task results")
    for command in tiny_commands(**PLACEHOLDERS):
        assert command in tiny, command
    assert not re.search(r"--to leaderboard/results/tiny\b(?!-)", tiny)  # an earlier commit's folder
    assert Path(TINY_RESULTS.format(**PLACEHOLDERS)).parent == Path("leaderboard/results")
    followed = []
    for name in baselines.names():
        for family in ("llada", "sdar", "llada2", "dream"):
            sweep = REPO / TINY_SWEEP.format(family=family, name=name)
            if (REPO / TINY_RESULTS.format(family=family, name=name)).is_dir() and sweep.is_file():
                header = sweep.read_text()
                assert all(c in header for c in tiny_commands(name, family)), sweep
                followed.append(f"{family}-{name}")
    assert "llada-espo" in followed and len(followed) >= 10, followed
    # the guide's sweep file, filled in for ESPO, is ESPO's committed one
    [example] = re.findall(r"```yaml\n(.*?)```", tiny, re.S)
    example = re.sub(r"^ {3}", "", example, flags=re.M).replace("<name>", "espo").replace("<family>", "llada")
    espo = REPO / TINY_SWEEP.format(family="llada", name="espo")
    assert yaml.safe_load(example) == yaml.safe_load(espo.read_text())


def test_the_tiny_folder_and_dare_demo_tell_the_guides_route(capsys):
    """reproductions/tiny/README.md, the header of its sweep.yaml (an earlier commit's comparison) and
    `dare demo --compare` give the same route, not a collect into leaderboard/results/tiny (which collect refuses
    for a later commit's runs)."""
    readme = (REPO / "reproductions" / "tiny" / "README.md").read_text()
    header = "".join(line for line in (REPO / "reproductions" / "tiny" / "sweep.yaml").read_text().splitlines(True)
                     if line.startswith("#"))
    assert main(["demo", "--compare"]) != 0
    told = capsys.readouterr().err
    for text in (readme, told):
        assert all(c in text for c in tiny_commands(**PLACEHOLDERS)), text
    assert TINY_SWEEP.format(**PLACEHOLDERS) in header and TINY_RESULTS.format(**PLACEHOLDERS) in header
    for text in (readme, header, told):
        assert not re.search(r"--to leaderboard/results/tiny\b(?!-)", text), text


def test_the_checklist_prints_the_guides_route(tmp_path):
    """A baseline without a result is told the route of the guide, on its own family."""
    (tmp_path / "leaderboard" / "results").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    for name in ("espo", "ebpo"):
        family = tiny_family(front_matter(name)["families"])
        [hint] = [p for p in checklist(name, repo=tmp_path) if "no valid result JSON" in p]
        assert TINY_SWEEP.format(family=family, name=name) in hint
        assert all(c in hint for c in tiny_commands(name, family)), hint
        assert "reproductions/tiny/sweep.yaml" not in hint
    assert tiny_family(["llada", "dream"]) == "llada" and tiny_family(["sdar", "llada2"]) == "sdar"


def test_the_guides_front_matter_names_every_required_key():
    example = re.search(r"```yaml\n---\n(.*?)---\n```", section("4. `README.md`"), re.S)
    assert example and set(REQUIRED_FRONT_MATTER) <= set(yaml.safe_load(example.group(1)))
