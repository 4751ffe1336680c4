# Two commands (README): `make demo` sets up and runs the embedded default, `make test` sets up
# and runs the tests. Both are idempotent: the venv is rebuilt only when pyproject.toml (the one
# source of the pins) changes, so a second run skips installs in seconds.

PYTHON ?= python3
VENV   ?= .venv
TRAIN  := $(VENV)/train
EVAL   := $(VENV)/eval
# The torch pin is read from the `train` extra in pyproject.toml, the single source of truth.
TORCH  := $(shell $(PYTHON) -c 'import tomllib; x = tomllib.load(open("pyproject.toml", "rb")); print(next(p for p in x["project"]["optional-dependencies"]["train"] if p.startswith("torch")))')
PIP_FLAGS ?= --quiet --disable-pip-version-check
PYTEST_ARGS ?=

.PHONY: demo test data checklist leaderboard setup eval-env browser slurm clean-venv help

# `make help` lists every target with the `## ` description on its line (tests/test_cli.py checks
# that each target has one).
help: ## list every target with what it does
	@awk -F ':.*## ' '/^[A-Za-z][A-Za-z0-9_-]*:.*## / {printf "make %-12s %s\n", $$1, $$2}' $(firstword $(MAKEFILE_LIST))

setup: $(TRAIN)/.installed ## create or update the train venv (.venv/train) only

# An editable install belongs to one checkout: installing this checkout into a venv whose editable
# install points at another clone would silently move that clone's environment here. Refuse, and
# say how to give this clone its own venv.
OWNER = $(1)/bin/python -I -c 'import json, sys, importlib.metadata as m; u = json.loads(m.distribution("dare-dllm").read_text("direct_url.json") or "{}").get("url", ""); here = "file://" + sys.argv[1]; sys.exit(0 if u in ("", here) else print(f"$(1) belongs to {u[7:]} (editable install); set VENV=<another folder> for this checkout") or 1)' $(CURDIR) 2>/dev/null || test ! -x $(1)/bin/python || ! $(1)/bin/python -I -c 'import importlib.metadata as m; m.distribution("dare-dllm")' 2>/dev/null

# The eval environment (transformers 4.x, numpy 1.x) from the `eval` extra; the tests use it to
# check that checkpoints move between the two environments.
$(EVAL)/.installed: pyproject.toml
	@$(call OWNER,$(EVAL))
	@test -x $(EVAL)/bin/python || $(PYTHON) -m venv $(EVAL)
	$(EVAL)/bin/pip install $(PIP_FLAGS) "$(TORCH)"
	$(EVAL)/bin/pip install $(PIP_FLAGS) -e ".[eval,dev]"
	@touch $@

# torch first, from its exact pin, so that nothing later resolves a CUDA build; then the project
# editable with the pinned `train` and `dev` extras.
$(TRAIN)/.installed: pyproject.toml
	@$(call OWNER,$(TRAIN))
	@test -x $(TRAIN)/bin/python || $(PYTHON) -m venv $(TRAIN)
	$(TRAIN)/bin/pip install $(PIP_FLAGS) "$(TORCH)"
	$(TRAIN)/bin/pip install $(PIP_FLAGS) -e ".[train,dev]"
	@touch $@

eval-env: $(EVAL)/.installed ## create or update the eval venv (.venv/eval, OpenCompass) only

demo: $(TRAIN)/.installed ## set up the train venv and run the embedded default (tiny SFT -> d1 -> eval)
	$(TRAIN)/bin/dare demo

test: $(TRAIN)/.installed $(EVAL)/.installed ## set up both venvs and run the test suite (PYTEST_ARGS=... passes options)
	DARE_VENV=$(abspath $(VENV)) DARE_EVAL_PYTHON=$(abspath $(EVAL))/bin/python $(TRAIN)/bin/python -m pytest $(PYTEST_ARGS)

# The offline tasks, rebuilt from code to the hashes in shared/dare/data/hashes.json (the same bytes
# and DVC hash as data.dvc). There is no project DVC remote: `dvc pull` needs a lab's own (README, Data).
data: $(TRAIN)/.installed ## build every offline task under data/ from code (byte-identical, no remote needed)
	$(TRAIN)/bin/dare data build

# What CONTRIBUTING.md asks of a baseline folder, without the eval environment or the suite.
checklist: $(TRAIN)/.installed ## the contribution checklist of every baseline folder (train venv only, seconds)
	$(TRAIN)/bin/dare checklist

# Debian's Chromium and its WebDriver, for the leaderboard's end-to-end browser test (the test calls
# this target itself, so `make test` works on a fresh machine). Needs root or sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser: ## install Chromium and its WebDriver for the leaderboard's browser test (needs root or sudo)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  ($(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver >/dev/null)
	@chromium --version

# Debian's SLURM and munge, for the sweep tests' one-node cluster (tests/slurm_cluster.py starts and
# stops the daemons itself; this only installs them). Needs root or sudo.
slurm: ## install SLURM and munge for the sweep tests' one-node cluster (needs root or sudo)
	@command -v slurmctld >/dev/null && command -v munged >/dev/null || \
	  ($(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq slurm-wlm munge >/dev/null)
	@slurmctld -V

leaderboard: $(TRAIN)/.installed ## open the Streamlit leaderboard on 127.0.0.1 (committed results + runs/)
	$(TRAIN)/bin/dare leaderboard --runs runs

clean-venv: ## delete both venvs (the VENV folder, default .venv)
	rm -rf $(VENV)
