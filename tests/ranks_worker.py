"""One rank of `tests/test_rank_agreement.py` (launched by torchrun over gloo): the checkpoint sharded with
FSDP2 as training shards it, this rank's own prompts decoded, the output saved for the test to compare."""

import json
import sys

import torch

from dare.config import DecodingConfig
from dare.models import facts, load_pretrained
from dare.rollout import generate, left_pad
from dare.train.dist import setup_dist
from dare.train.trainer import shard

checkpoint, spec, out = sys.argv[1:4]
spec = json.loads(open(spec).read())
dist = setup_dist()
model = load_pretrained(checkpoint).eval()
shard(model, bf16=False)
ids, mask = left_pad(spec["prompts"][dist.rank], facts(model).pad_token_id)
with torch.no_grad():
    result = generate(model, ids, mask, DecodingConfig(**spec["decoding"]), torch.Generator().manual_seed(0))
torch.save({"sequences": result.sequences, "nfe": result.nfe}, f"{out}/rank{dist.rank}.pt")
