"""Training: generic recipes that baselines plug into, and `fit`, which runs one.

- `dare.train.hooks`   the hook contract (what a baseline's algorithm.py defines, per recipe)
- `dare.train.sft`, `.preference`, `.rl`   the recipes: generic loops that know no algorithm
- `dare.train.fit`     `fit(algorithm, cfg, run_dir)`: one run folder's life (status, resume, export)
- `dare.train.noise`, `.estimators`   the building blocks algorithms draw noise and estimate with
- `dare.train.trainer`, `.common`, `.packing`   the trainer (FSDP2, optimizer, checkpoints) and loop parts

Running a baseline by name (`dare train d1`) is the application's job: `dare.app.runs`.
"""
