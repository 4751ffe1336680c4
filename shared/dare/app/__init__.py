"""The application wing: everything that knows the repository's folders.

The library (`dare.models`, `.rollout`, `.train`, `.data`, `.rewards`, `.eval`, `.results`,
`.config`, `.utils`) takes modules, configs and paths as arguments and never imports this wing;
this wing turns names and repository folders into those arguments:

- `dare.app.baselines`  discovery of `baselines/<name>/` (front matter, hooks, config) and the checklist
- `dare.app.runs`       `train(name, config, overrides)`: a baseline by name, in `runs/<name>/<key>`
- `dare.app.sweep`      sweep files (`reproductions/<name>/sweep.yaml`), submitit launches, collection
- `dare.app.targets`    a reproduction's paper numbers (`targets.yaml`) into `result.reference`
- `dare.app.ray_group`  a Ray worker group running `train` on every rank
- `dare.app.demo`, `dare.app.bench`, `.bench_estimators`   the embedded default and the benchmarks
- `dare.app.probes`    the benchmarks' memory probes, each run in a fresh process
- `dare.app.cli`        the `dare` command
"""
