"""A refactor's check that nothing moved: runs twelve RL baselines in thirteen runs (coupled-GRPO on a plain and a block model) and VRPO (three families, a value model,
trajectories, tree rollouts, two mini-batches, draws backpropagated one at a time) for 3 steps on tiny models in
the tree given and prints, per baseline, a digest of every logged number (wall-clock times and throughput left out) and of the final weights. Run it in the tree before
and after a change (a `git worktree` of the old commit) and diff the two outputs:

    git worktree add /tmp/before <commit>
    python tests/same_numbers.py /tmp/before > before.txt; python tests/same_numbers.py . > after.txt
    diff before.txt after.txt        # nothing: the same numbers, bit for bit

`python tests/same_numbers.py TREE NAME...` runs only those baselines."""
import hashlib, json, os, sys, tempfile
tree = os.path.abspath(sys.argv[1])
sys.path[:0] = [tree + "/shared", tree, tree + "/tests"]
os.chdir(tree)
from conftest import TINY, tiny_overrides
from dare.app.runs import train
from dare.data import TASKS
TASKS["addition"].rewards = lambda texts, rows, style="default": [float(i % 2) for i in range(len(texts))]
D = "rl.diag_every=1"  # every diagnostic on every step
CASES = [("tracerl", "sdar", [D, "algo.value_model=true", "algo.value_lr=1e-3"]), ("d1", "llada", [D]),
         ("mdpo", "llada", [D]), ("agrpo", "llada", [D]), ("d_treerpo", "llada", [D]), ("cj_grpo", "llada", [D]),
         ("rldf", "dream", [D]), ("espo", "llada", [D, "rl.mini_batches=2"]), ("gdpo", "llada", [D]),
         ("coupled_grpo", "dream", [D]), ("coupled_grpo", "sdar", [D]), ("bgpo", "llada", [D]), ("ebpo", "sdar", [D]), ("vrpo", "llada", [])]
only = sys.argv[2:]
tmp = tempfile.mkdtemp(prefix="same-numbers-")  # the runs stay there to look at
sft = {}
for name, fam, extra in CASES:
    if only and name not in only:
        continue
    if fam not in sft:
        sft[fam] = train("sft", None, [*TINY, f"model.family={fam}", "train.steps=2", "algo.response_length=4",
                                       f"run.out_dir={tmp}/sft-{fam}"]) / "final"
    out = train(name, None, [f"model.path={sft[fam]}", f"model.family={fam}", *tiny_overrides(name, fam),
                             "train.steps=3", *extra, f"run.out_dir={tmp}/{name}-{fam}"])
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    keep = [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "memory/", "eta", "wall")) and k not in ("compute/wall_s", "time_s")} for r in recs]
    h = hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]
    w = hashlib.sha256()
    for f in sorted((out / "final").glob("*.safetensors")):
        w.update(f.read_bytes())
    print(f"{name + '/' + fam:20s} metrics {h} weights {w.hexdigest()[:16]} loss {[round(r.get('loss/total', 0), 6) for r in recs]}", flush=True)
