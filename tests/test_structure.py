"""The house's structure, read from the code's imports (no module is run): the library's arrows
point only down, into the library; nothing imports in a circle; only the application wing
(`dare.app`) knows the repository's folders (baselines/, reproductions/, leaderboard/, tests/)."""

import ast
import re
from pathlib import Path

SHARED = Path(__file__).resolve().parent.parent / "shared"
FILES = {".".join(p.relative_to(SHARED).with_suffix("").parts).removesuffix(".__init__"): p
         for p in sorted((SHARED / "dare").rglob("*.py"))}
APP = "dare.app"
REPO_FOLDERS = re.compile(r"^(baselines|reproductions|leaderboard|tests)(/|$)")


def is_app(module: str) -> bool:
    return module == APP or module.startswith(APP + ".")


def imports(module: str) -> set[str]:
    """Every project module `module` imports, at any level (function-level imports too)."""
    path = FILES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in FILES else base for a in node.names]
        else:
            continue
        out |= {n for n in names if n in FILES or n.split(".")[0] == "baselines"}
    return out - {module}


GRAPH = {m: imports(m) for m in FILES}


def test_the_graph_was_read():
    assert len(FILES) > 50 and "dare.train.rl" in GRAPH["dare.train.fit"]
    assert "dare.app.baselines" in GRAPH["dare.app.runs"]


def test_the_library_never_imports_the_application_or_the_baselines():
    wrong = [f"{m} -> {t}" for m, targets in GRAPH.items() if not is_app(m)
             for t in targets if is_app(t) or t.split(".")[0] == "baselines"]
    assert not wrong, "\n".join(wrong)


def test_no_import_circle():
    """Tarjan's strongly connected components of the module graph: every one is a single module.
    A package's __init__ that only re-exports its submodules counts like any module."""
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in FILES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                circles.append(sorted(scc))

    for v in FILES:
        if v not in index:
            visit(v)
    assert not circles, circles


def _strings(path: Path):
    """String constants of the code, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value


def test_only_the_application_names_the_repository_folders():
    found = [f"{m}: {s!r}" for m, path in FILES.items() if not is_app(m)
             for s in _strings(path) if REPO_FOLDERS.match(s)]
    assert not found, "\n".join(found)
    # the checkout itself is reached only through dare.utils' workspace locations (runs/, data/, .venv/)
    users = [m for m, path in FILES.items() if not is_app(m) and m != "dare.utils" and "REPO_ROOT" in path.read_text()]
    assert not users, users


def test_no_private_submitit():
    """The library uses submitit through its public API only: no name starting with `_` is imported from a
    submitit module or read (attribute or getattr) from one (its private writer and tables are the reference of
    tests/test_sweep.py's parity tests, never used by the code)."""
    found = []
    for m, path in FILES.items():
        tree = ast.parse(path.read_text())
        bound = set()  # local names of submitit modules and objects
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "submitit"}
                found += [f"{m}: import {a.name}" for a in node.names
                          if a.name.split(".")[0] == "submitit" and any(p.startswith("_") for p in a.name.split("."))]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "submitit":
                bound |= {a.asname or a.name for a in node.names}
                found += [f"{m}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") or any(p.startswith("_") for p in node.module.split("."))]

        def root(node):
            while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
                node = node.func if isinstance(node, ast.Call) else node.value
            return node.id if isinstance(node, ast.Name) else None

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and root(node.value) in bound:
                found.append(f"{m}:{node.lineno}: {ast.unparse(node)}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                  and len(node.args) > 1 and root(node.args[0]) in bound and isinstance(node.args[1], ast.Constant)
                  and str(node.args[1].value).startswith("_")):
                found.append(f"{m}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)
    assert any("submitit" in path.read_text() for path in FILES.values())  # the rule has something to read


def test_every_rl_baseline_has_one_meaning_per_hook():
    """Each RL baseline binds to the hook contract (no retired hook: what it derives from the rollout is in
    `prepare`), and its noise is drawn or not by whether it defines `sample_noise`: the loop then checks that
    every draw is a `Draw` (`dare.train.rl.run`), which the two-step runs of every baseline exercise."""
    import importlib

    from dare.app.baselines import names
    from dare.train.hooks import RETIRED, bind

    rl = 0
    for name in names():
        module = importlib.import_module(f"baselines.{name}.algorithm")
        assert not [h for h in RETIRED if hasattr(module, h)], name
        hooks = bind(module)
        if module.RECIPE == "rl":
            rl += 1
            assert hooks.draws_noise == hasattr(module, "sample_noise"), name
    assert rl >= 14


def test_a_retired_hook_is_refused_with_what_replaces_it():
    import types

    from dare.train.hooks import bind

    module = types.ModuleType("m")
    module.RECIPE = "rl"
    for hook in ("advantages", "token_logps", "loss", "random_noise"):
        setattr(module, hook, lambda *a: None)
    try:
        bind(module, "m")
    except ValueError as e:
        assert str(e) == "m: the hook random_noise is gone: leave sample_noise undefined when nothing is drawn " \
                         "(see dare.train.hooks)"
    else:
        raise AssertionError("a retired hook was bound")


def test_no_baseline_imports_a_recipes_loop():
    """A baseline's algorithm.py imports the small helpers it uses (`dare.train.objectives`, `.noise`,
    `.estimators`, `.batches`, ...), never a recipe's loop or the trainer (`dare.train.rl`, `.sft`,
    `.preference`, `.loop`, `.trainer`, `.fit`)."""
    loops = {"dare.train.rl", "dare.train.sft", "dare.train.preference", "dare.train.loop", "dare.train.trainer",
             "dare.train.fit"}
    found = []
    for path in sorted(Path(__file__).resolve().parents[1].glob("baselines/*/algorithm.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.parent.name}: {n}" for n in names if n in loops]
    assert not found, found


def test_each_rl_baseline_declares_what_token_logps_returns_and_the_bound_hook_checks_it():
    """Issue 61: `token_logps` returns seven shapes across the baselines; each declares its kind (`SCORE`, one of
    `dare.train.hooks.SCORES`), bind refuses a module without one, and the bound hook raises a clear error when a
    result does not fit the declaration (the two-step runs of every baseline call it, so every declaration is
    checked against what the baseline returns)."""
    import importlib
    import types

    import pytest
    import torch

    from dare.app.baselines import names
    from dare.train.hooks import SCORES, bind

    kinds = {}
    for name in names():
        module = importlib.import_module(f"baselines.{name}.algorithm")
        if module.RECIPE == "rl":
            kinds[name] = module.SCORE
    assert set(kinds.values()) == set(SCORES) and len(kinds) >= 14
    module = types.ModuleType("m")
    module.RECIPE = "rl"
    for hook in ("advantages", "loss"):
        setattr(module, hook, lambda *a: None)
    module.token_logps = lambda model, batch, noise, cfg: torch.zeros(batch.sequences.shape[0])
    with pytest.raises(ValueError, match="SCORE = None; declare what token_logps returns"):
        bind(module, "m")
    module.SCORE = "token"
    batch = types.SimpleNamespace(sequences=torch.zeros(4, 10), prompt_length=6)
    with pytest.raises(ValueError, match=r"returned shape \(4,\) for 4 completions of 4 positions, but the baseline "
                                         r"declares SCORE = 'token'"):
        bind(module, "m").token_logps(None, batch, None, None)
    module.SCORE = "sequence"
    assert bind(module, "m").token_logps(None, batch, None, None).shape == (4,)
