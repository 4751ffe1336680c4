"""dare: the shared core for post-training diffusion language models.

Importing `dare` is cheap and never imports torch: the leaderboard and the result schema
(`dare.results`) run in environments without it. Subpackages:

- `dare.models`   model families (LLaDA, ...) as transformers classes, plus their facts
- `dare.rollout`  the sampler engine (LLaDA low-confidence remasking, ...)
- `dare.train`    trainers: SFT and the RL loop that baselines plug into
- `dare.data`     task registry, synthetic generators, the parquet schema
- `dare.rewards`  one reward / answer parser per task
- `dare.eval`     the embedded evaluator
- `dare.results`  the versioned result JSON schema, writer and loader
- `dare.config`   dataclass configs: defaults -> YAML -> key=value overrides
"""

__version__ = "0.1.0"
