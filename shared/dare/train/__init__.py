"""Training: generic recipes that baselines plug into, and `fit`, which runs one.

- `dare.train.hooks`   the hook contract (what a baseline's algorithm.py defines, per recipe)
- `dare.train.sft`, `.preference`, `.rl`   the recipes: generic loops that know no algorithm
- `dare.train.fit`     `fit(algorithm, cfg, run_dir)`: one run folder's life (status, resume, export)
- `dare.train.noise`, `.estimators`   the building blocks algorithms draw noise and estimate with
- `dare.train.objectives`   group advantages and PPO's clipped surrogates, the small functions baselines share
- `dare.train.trainer`  the execution trainer (FSDP2, mixed precision, the optimizer step, the reference model)
- `dare.train.dist`, `.lora`, `.optim`   processes (data and sequence parallel), LoRA, optimizer and schedule
- `dare.train.loop`, `.sampler`, `.checkpoint`, `.metrics`   the loop parts: steps, training rows, sharded
  checkpoints with exact resume and export, the metrics log and sinks
- `dare.train.batches`, `.packing`   cutting batches (rows, micro-batches, backward by parts), sequence packing

Running a baseline by name (`dare train d1`) is the application's job: `dare.app.runs`.
"""
