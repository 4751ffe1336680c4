"""One process of `tests/test_every_rank_backward.py`: one TraceRL update of a tiny LLaDA on the masked path, under
FSDP2 (torchrun over gloo: each process its contiguous rows) or in one plain process (the whole batch). The rows of
the second group answer with EOS only, so they hold no trained token: on two processes, every micro-batch of the
second one scores nothing. Writes the update's gradient norm and, from the first process, the weights after it."""

import json
import sys
from dataclasses import replace

import torch

from baselines.tracerl import algorithm as tracerl
from dare.config import ModelConfig, TrainConfig
from dare.models import facts, load_pretrained
from dare.rollout import left_pad
from dare.rollout.core import RolloutOutput, response_mask
from dare.train.batches import take, updates
from dare.train.noise import Draw
from dare.train.estimators import Compute
from dare.train.rl import RLBatch, Totals
from dare.train.dist import setup_dist
from dare.train.trainer import Trainer

checkpoint, spec_file, out = sys.argv[1:4]
spec = json.loads(open(spec_file).read())
torch.set_num_threads(1)
dist = setup_dist()
model = load_pretrained(checkpoint)
f = facts(model)
prompt_ids, prompt_mask = left_pad(spec["prompts"], f.pad_token_id)
responses = torch.tensor(spec["responses"])
n = responses.shape[0]
rollout = RolloutOutput(sequences=torch.cat([prompt_ids, responses], 1),
                        attention_mask=torch.cat([prompt_mask, torch.ones_like(responses)], 1),
                        prompt_length=prompt_ids.shape[1], response_mask=response_mask(responses, f.stop_ids),
                        step_map=torch.tensor(spec["steps"]), nfe=0)
batch = RLBatch(rollout=rollout, facts=f, rewards=torch.tensor(spec["rewards"]),
                advantages=torch.tensor(spec["advantages"]), group_size=spec["group_size"], totals=Totals(num_sequences=n),
                compute=Compute(pack=False, chunk=spec["chunk"]))
old_logps = torch.tensor(spec["old_logps"])
mine = dist.shard(n)
batch, old_logps = take(batch, mine, n), old_logps[mine]
cfg = spec["cfg"]
from conftest import run_config  # noqa: E402 (tests/ is on the path: the test launches from there)

cfg = run_config("tracerl", **cfg)
batch = tracerl.prepare(batch, cfg)
z = Draw()  # TraceRL draws nothing (no sample_noise)
batch = replace(batch, totals=replace(batch.totals, num_units=dist.sum({"u": tracerl.loss_units(batch, z, cfg)})["u"]))
trainer = Trainer(model, ModelConfig(family=f.family), TrainConfig(lr=1.0, max_grad_norm=0.0), dist, total_steps=1)
# plain SGD at lr 1 (weights - gradient): Adam's first step, lr g / (|g| + eps), would turn float rounding in
# gradients near eps into differences of up to lr
trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
micro = spec["micro_batch_size"]
rows = batch.sequences.shape[0]


def loss_of(mb, mz, it, rows):
    part = old_logps[rows]
    return tracerl.loss(tracerl.token_logps(trainer.model, mb, mz, cfg), part, None, mb, mz, cfg)


sums = updates(trainer, [(slice(0, batch.sequences.shape[0]), batch)], [z], micro, loss_of)
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: E402

weights = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if dist.main:
    torch.save({"sums": sums, "weights": weights, "targets": int(batch.extras["targets"].sum())}, f"{out}/result.pt")
torch.save({"targets": int(batch.extras["targets"].sum())}, f"{out}/rank{dist.process}.pt")
