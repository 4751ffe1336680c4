"""The monorepo's promises: layout, one source of pins, baseline folder shape, house rules."""

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from conftest import VENV
from dare.app import baselines
from dare.utils import lock_pins, package_name

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def test_layout():
    for path in ["baselines", "shared/dare", "leaderboard", "leaderboard/results", "reproductions", "tests",
                 "data.dvc", ".dvc/config", "environment-train.yml", "environment-eval.yml", "README.md",
                 "pyproject.toml", "Makefile", ".ci/run"]:
        assert (REPO / path).exists(), path
    assert set(EXTRAS) >= {"train", "eval", "gpu", "flash", "dev"}
    assert any(p.startswith("liger-kernel") for p in EXTRAS["gpu"])  # wheels: locked (locks/gpu-train.txt)
    assert any(p.startswith("flash-attn") for p in EXTRAS["flash"])  # built against CUDA at install: not locked


def test_ci_runs_exactly_make_test():
    lines = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[-1] == "exec make test"
    assert (REPO / ".ci/run").stat().st_mode & 0o111


# every lock: the extras it holds, and how torch appears in it (this machine's local CPU build in the
# venvs' locks, PyPI's CUDA build with its nvidia libraries in the conda files' GPU locks)
LOCKS = {"locks/train.txt": ("train", "dev", "docs"), "locks/eval.txt": ("eval", "dev"),
         "locks/gpu-train.txt": ("train", "gpu", "dev"), "locks/gpu-eval.txt": ("eval", "dev")}
CONDA_LOCKS = {"environment-train.yml": "locks/gpu-train.txt", "environment-eval.yml": "locks/gpu-eval.txt"}


def lock_disagreements(lock_text: str, extras: tuple[str, ...], pyproject: dict) -> list[str]:
    """Every pin of `extras` in pyproject.toml that the lock does not hold at the same version (a
    local version like +cpu aside), and every locked package without a hash."""
    locked = {name: version.split("+")[0] for name, version in lock_pins(lock_text).items()}
    problems = []
    for extra in extras:
        for req in pyproject["project"]["optional-dependencies"][extra]:
            name, _, version = req.partition("==")
            if locked.get(package_name(name)) != version:
                problems.append(f"{name}: pyproject {version}, lock {locked.get(package_name(name))}")
    unhashed = re.findall(r"^([A-Za-z0-9_.-]+==\S+)\n(?!\s+--hash)", lock_text, re.M)
    return problems + [f"{u}: no hash" for u in unhashed]


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_lock_agrees_with_pyprojects_pins(lock):
    """`make lock` regenerates the locks from pyproject.toml: a pin changed without regenerating fails
    here; the lock names the extras it was compiled from (its tool's header) and hashes every package."""
    text = (REPO / lock).read_text()
    assert not lock_disagreements(text, LOCKS[lock], PYPROJECT)
    header = text.split("\n\n")[0] if "pip-compile" in text[:200] else text[:600]
    assert all(f"--extra={e}" in header or f"--extra {e}" in header for e in LOCKS[lock]), header
    assert f"-o {lock}" in header or f"--output-file={lock}" in header  # generated for this file
    assert len(lock_pins(text)) > 50


def test_a_pin_changed_without_a_new_lock_is_caught():
    changed = json.loads(json.dumps(PYPROJECT))
    train = changed["project"]["optional-dependencies"]["train"]
    train[:] = [("transformers==5.99.0" if p.startswith("transformers==") else p) for p in train]
    for lock in ("locks/train.txt", "locks/gpu-train.txt"):
        problems = lock_disagreements((REPO / lock).read_text(), ("train", "dev"), changed)
        assert problems == ["transformers: pyproject 5.99.0, lock 5.23.0"], lock


def test_the_venvs_lock_the_local_cpu_torch_and_the_conda_files_pypis_cuda_build():
    for lock in ("locks/train.txt", "locks/eval.txt"):
        text = (REPO / lock).read_text()
        assert re.search(r"^torch==2\.13\.0\+cpu \\", text, re.M) and "nvidia-" not in text, lock
    for lock in CONDA_LOCKS.values():
        pins = lock_pins((REPO / lock).read_text())
        assert pins["torch"] == "2.13.0" and "nvidia-cublas" in pins and "triton" in pins, lock
        header = (REPO / lock).read_text()[:300]
        # uv's default index only (`--no-config` ignores this machine's pip configuration and its local CPU
        # wheels); no index is named, in the lock's header or in the Makefile
        assert "uv pip compile" in header and "--no-config" in header and "index-url" not in header, lock
    gpu_compile = next(line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith("GPU_COMPILE"))
    assert "--no-config" in gpu_compile and "index" not in gpu_compile and "://" not in gpu_compile


def test_environment_files_install_exactly_their_gpu_lock():
    """The conda files (GPU machines) install their lock, nothing else: hash checking makes pip
    refuse any package the lock does not name; the project goes in afterwards without dependencies."""
    for env_file, lock in CONDA_LOCKS.items():
        text = (REPO / env_file).read_text()
        env = yaml.safe_load(text)
        assert "python=3.11" in env["dependencies"]
        pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
        assert pip == [f"-r {lock}"], (env_file, pip)
        assert f"pip install --no-deps --no-build-isolation -e . && dare env --record-lock {lock}" in text


def test_a_record_names_the_lock_only_when_the_environment_holds_it(tmp_path):
    """`dare env --record-lock` (the last step of every install) refuses a lock whose versions this
    environment does not hold, naming the packages; a matching lock is recorded with its sha256."""
    import hashlib
    from importlib import metadata

    from dare.utils import UserError, environment_lock, record_lock

    held = tmp_path / "held.txt"
    held.write_text(f"pyyaml=={metadata.version('pyyaml')} \\\n    --hash=sha256:{'0' * 64}\n")
    other = tmp_path / "other.txt"
    other.write_text(f"pyyaml==0.0.1 \\\n    --hash=sha256:{'0' * 64}\n")
    with pytest.raises(UserError, match=r"does not hold .*other.txt: 1 packages differ: pyyaml .* \(lock 0\.0\.1\)"):
        record_lock(other)
    with pytest.raises(UserError, match="not a hashed lock file"):
        record_lock(REPO / "README.md")
    record = Path(sys.prefix) / "dare-lock.json"
    before = record.read_bytes() if record.exists() else None
    try:
        record_lock(held)
        assert environment_lock() == {"lock": str(held), "sha256": hashlib.sha256(held.read_bytes()).hexdigest()}
    finally:  # the test venv's own record is put back
        record.write_bytes(before) if before is not None else record.unlink()


def test_the_makefile_installs_the_locks():
    make = (REPO / "Makefile").read_text()
    assert "--no-deps --require-hashes -r $(2)" in make and "torch==" not in make  # no second copy of a pin
    assert "$(call INSTALL,$(TRAIN),locks/train.txt)" in make and "$(call INSTALL,$(EVAL),locks/eval.txt)" in make
    assert "$(1)/bin/dare env --record-lock $(2)" in make  # the record is checked against the venv


def test_setup_is_idempotent():
    """After `make test` installed the venv, the install target is up to date: a rerun skips it."""
    r = subprocess.run(["make", "-q", f"VENV={VENV}", f"{VENV}/train/.installed"], cwd=REPO, capture_output=True)
    assert r.returncode == 0, f"make would reinstall the train venv {VENV}"


def test_the_environment_under_test_is_this_checkouts_own():
    """An editable install belongs to one checkout: the `dare` the tests import, and the editable
    install recorded in the venv, are this checkout's (a second clone sets its own VENV=...)."""
    import dare

    assert Path(dare.__file__).resolve().is_relative_to(REPO), dare.__file__
    assert Path(_editable_url(sys.executable).removeprefix("file://")).resolve() == REPO


def _editable_url(python) -> str:
    """The checkout a venv's editable install points to (isolated mode: the working folder's own
    metadata, e.g. a stray egg-info, cannot answer instead of the venv's)."""
    code = "import importlib.metadata as m, json; print(json.loads(m.distribution('dare-dllm').read_text('direct_url.json'))['url'])"
    return subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_make_refuses_to_install_into_another_checkouts_venv(tmp_path):
    """`make setup VENV=<a venv whose editable install is another clone's>` stops before pip runs and
    says how to fix it. The venv here is a throwaway one (no pip in it) that claims to belong to
    another checkout, so a broken guard cannot touch a real environment."""
    other = tmp_path / "other-clone"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv / "train")], check=True, timeout=120)
    site = next((venv / "train" / "lib").glob("python3*/site-packages"))
    info = site / "dare_dllm-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dare-dllm\nVersion: 0.1.0\n")
    (info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": f"file://{other}"}))
    r = subprocess.run(["make", f"VENV={venv}", "setup"], cwd=REPO, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and f"belongs to {other}" in out and "set VENV=" in out, out
    assert "pip install" not in out and not (venv / "train" / ".installed").exists()


def test_pytest_exit_5_is_not_swallowed():
    """A run that collects no tests must fail `make test` (and therefore .ci/run)."""
    r = subprocess.run(["make", "test", f"VENV={VENV}", "PYTEST_ARGS=tests/test_layout.py -k no_such_test_anywhere"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "deselected" in r.stdout


@pytest.mark.parametrize("name", baselines.folders())
def test_every_baseline_passes_the_contribution_checklist(name):
    """CONTRIBUTING.md's checklist: front matter, sections, algorithm.py size and recipe, a test
    that exercises it, at least one valid result JSON. A PR missing a piece fails here, naming it."""
    problems = baselines.checklist(name)
    assert not problems, "\n".join(problems)


def test_the_checklist_names_what_is_missing(tmp_path, monkeypatch):
    """A half-made baseline folder gets one message per missing piece."""
    root = tmp_path / "baselines"
    (root / "half").mkdir(parents=True)
    monkeypatch.setattr(baselines, "root", lambda: root)
    assert baselines.checklist("half") == [f"baselines/half/{f}: missing" for f in baselines.REQUIRED_FILES]
    (root / "half" / "README.md").write_text("---\nname: other\nstatus: done\nfamilies: [gpt]\n---\n")
    (root / "half" / "algorithm.py").write_text("RECIPE = 'rl'\n")
    (root / "half" / "config.py").write_text("Config = None\n")
    (tmp_path / "tests").mkdir()
    found = "\n".join(baselines.checklist("half", repo=tmp_path))
    for piece in ("front matter lacks title, summary, arxiv, reference_code", "name 'other' is not the folder name",
                  "status 'done'", "families ['gpt']", "no '## Deviations' section", "no '## Results' section",
                  "no test under tests/", "no valid result JSON"):
        assert piece in found, (piece, found)


def test_wave_one_baselines_exist():
    assert {"sft", "peft", "vrpo", "d1", "coupled_grpo", "wd1"} <= set(baselines.names())


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_baselines_import_only_dare_and_themselves():
    for name in baselines.names():
        for py in (REPO / "baselines" / name).glob("*.py"):
            for mod in _imports(py):
                if mod.startswith("baselines."):
                    assert mod.split(".")[1] == name, f"{py} imports {mod}"


def test_core_never_branches_on_a_baseline_name():
    names = baselines.names()
    pattern = re.compile(r"""(==|!=|\bin)\s*[\(\[{]?\s*["'](%s)["']""" % "|".join(map(re.escape, names)))
    for py in (REPO / "shared" / "dare").rglob("*.py"):
        if py.name == "demo.py":  # the demo names the stages it runs; it is a script, not the core
            continue
        for i, line in enumerate(py.read_text().splitlines(), 1):
            assert not pattern.search(line), f"{py}:{i}: {line.strip()}"


def test_no_token_ids_outside_models():
    known_ids = ["126336", "126081", "126348", "151666", "151669", "156895", "156892", "151643", "151645"]
    for folder in ["baselines", "shared/dare/rollout", "shared/dare/train", "shared/dare/eval", "reproductions"]:
        for f in (REPO / folder).rglob("*.py"):
            text = f.read_text()
            for tid in known_ids:
                assert tid not in text, f"{f} hard-codes token id {tid}"
        for f in (REPO / folder).rglob("*.yaml"):
            assert "mask_token_id" not in f.read_text(), f


def test_baselines_draw_their_noise_from_the_shared_samplers():
    """CONTRIBUTING promises shared building blocks: every baseline draws its masks through
    `dare.train.noise` and estimates log-probs with `dare.train.estimators`, rather than a private copy."""
    for name in baselines.names():
        mods = _imports(REPO / "baselines" / name / "algorithm.py")
        text = (REPO / "baselines" / name / "algorithm.py").read_text()
        assert "dare.train" in mods and "from dare.train import noise" in text, name
        assert "dare.train.estimators" in mods, name


def test_the_rl_step_reads_top_to_bottom():
    """Issue 61's shape, held: `rl.run` is the step's outline (at most 80 lines: the phases are functions of their
    own), and `RLBatch` composes the rollout and the model's facts with at most 12 fields of its own."""
    import dataclasses

    from dare.train import rl

    tree = ast.parse((REPO / "shared" / "dare" / "train" / "rl.py").read_text())
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    assert run.end_lineno - run.lineno + 1 <= 80, f"rl.run is {run.end_lineno - run.lineno + 1} lines"
    own = [f.name for f in dataclasses.fields(rl.RLBatch)]
    assert len(own) <= 12 and {"rollout", "facts"} <= set(own), own
