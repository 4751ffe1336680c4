"""dare: the shared core for post-training diffusion language models.

Importing `dare` is cheap and never imports torch: the leaderboard and the result schema
(`dare.results`) run in environments without it. It registers the model families with
transformers' Auto classes (`AutoConfig.for_model("llada")`, `AutoModel.from_pretrained(<export>)`)
as soon as transformers is imported, before or after `import dare`. Subpackages:

- `dare.models`   model families (LLaDA, ...) as transformers classes, plus their facts
- `dare.rollout`  the sampler engine (LLaDA low-confidence remasking, ...)
- `dare.train`    trainers: SFT and the RL loop that baselines plug into
- `dare.data`     task registry, synthetic generators, the parquet schema
- `dare.rewards`  one reward / answer parser per task
- `dare.eval`     the embedded evaluator
- `dare.results`  the versioned result JSON schema, writer and loader
- `dare.config`   dataclass configs: defaults -> YAML -> key=value overrides
"""

import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"


def _register_families() -> None:
    """Import the families (each registers itself). Skipped while one of our own modules is being
    imported (it imported transformers first, and importing the families now would enter it half
    made); our loaders register on use (`dare.models.load_pretrained`)."""
    if any(name.startswith("dare.") and getattr(getattr(m, "__spec__", None), "_initializing", False)
           for name, m in list(sys.modules.items())):
        return
    try:
        from dare.models.registry import register_all

        register_all()
    except ImportError as e:  # an environment without torch: transformers' tokenizers still work
        warnings.warn(f"dare: model families not registered with transformers ({e})", stacklevel=2)


class _RegisterAfterTransformers(importlib.abc.MetaPathFinder):
    """Runs `_register_families` right after `transformers` itself has been imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "transformers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def load_then_register(module):
                load(module)
                _register_families()

            spec.loader.exec_module = load_then_register
        return spec


if "transformers" in sys.modules:
    _register_families()
elif not any(isinstance(f, _RegisterAfterTransformers) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterTransformers())
