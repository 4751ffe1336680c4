"""Pinned 3-step loss trajectories, one per baseline, on a tiny model from `sft_checkpoint`
(TRL/torchtune-style regression tests): a refactor that changes any number a baseline computes
(noise draws, estimators, normalisation, optimizer, data order) fails here. Rewards are fixed
(alternating 1/0 within each group) so the RL losses do not depend on the model's luck.

Each baseline's trajectory is `baselines/<name>/pinned.json` ({"family": ..., "losses": [...]}), run with
its tiny-run overrides (`tiny_overrides` in tests/conftest.py) for three steps. Every baseline is
discovered (a folder under baselines/ with an algorithm.py); one without a pinned.json fails here
unless its README front matter says why it has none (`tests: {unpinned: "..."}`).

To pin a baseline, or when a change is meant to move the numbers, rerun with DARE_PIN=print
(`DARE_PIN=print pytest tests/test_pinned.py -k <name> -s`), check the new values are what the
change should give, and save the printed JSON as baselines/<name>/pinned.json, with the reason in
the commit message. Values from commit 'House before the next baselines' (CPU float32, one thread),
checked on this machine only: a CPU whose kernels round differently could need them re-printed
(DARE_PIN=print); rel 1e-4 is far below what a changed draw moves (the first refactor moved them
by 1e-3 to 1e0)."""

import json
import os

import pytest

from conftest import REPO, baseline_tests, tiny_overrides


def pinned_file(name: str):
    return REPO / "baselines" / name / "pinned.json"


def pinned_baselines() -> list[str]:
    """Every baseline, less those whose front matter says why they have no pinned trajectory."""
    from dare.app.baselines import names

    return [n for n in names() if "unpinned" not in baseline_tests(n)]


def test_every_baseline_is_pinned_or_says_why_not():
    from dare.app.baselines import front_matter, names

    for name in names():
        pinned, unpinned = pinned_file(name).is_file(), "unpinned" in baseline_tests(name)
        assert pinned != unpinned, (
            f"baselines/{name}: both a pinned.json and `tests: unpinned:` in its README front matter" if pinned else
            f"baselines/{name} has no pinned trajectory: run `DARE_PIN=print pytest tests/test_pinned.py -k {name} -s` "
            f"and save the printed JSON as baselines/{name}/pinned.json (or say why not: `tests: {{unpinned: ...}}` "
            "in its README front matter)")
        if pinned:
            pin = json.loads(pinned_file(name).read_text())
            assert set(pin) == {"family", "losses"} and pin["family"] in front_matter(name)["families"], name
            assert len(pin["losses"]) == 3 and all(isinstance(x, float) for x in pin["losses"]), name


@pytest.mark.parametrize("name", pinned_baselines())
def test_three_step_loss_trajectory_is_pinned(name, tmp_path, monkeypatch, sft_checkpoint):
    from dare.app.baselines import front_matter
    from dare.app.runs import train
    from dare.data import TASKS

    path = pinned_file(name)
    pin = json.loads(path.read_text()) if path.is_file() else None
    printing = os.environ.get("DARE_PIN") == "print"
    if pin is None and not printing:
        pytest.fail(f"baseline {name} has no pinned trajectory: run `DARE_PIN=print pytest tests/test_pinned.py "
                    f"-k {name} -s` and save the printed JSON as baselines/{name}/pinned.json (or say why not: "
                    f"`tests: {{unpinned: ...}}` in its README front matter)")
    families = front_matter(name)["families"]
    family = pin["family"] if pin else "llada" if "llada" in families else families[0]
    monkeypatch.setattr(TASKS["addition"], "rewards", lambda texts, rows, style="default": [
        float(i % 2) for i in range(len(texts))])
    run = train(name, None, [f"model.path={sft_checkpoint(family)}", f"model.family={family}",
                             *tiny_overrides(name, family), "train.steps=3", f"run.out_dir={tmp_path / name}"])
    losses = [json.loads(x)["loss/total"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    if printing:
        print(f"\nbaselines/{name}/pinned.json:\n" + json.dumps({"family": family, "losses": losses}))
        if pin is None:
            return
    assert losses == pytest.approx(pin["losses"], rel=1e-4, abs=1e-6), losses
