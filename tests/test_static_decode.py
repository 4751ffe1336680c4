"""A static decode state and a captured step (issue 47, item 2): the static KV cache computes what the growing
one does without reallocating; the masked and block samplers read no tensor on the host per denoising step
(once per block, or every `LOOK_EVERY` steps while a rule may end a block early); the step captured with
torch.compile (fullgraph, static shapes) decodes the eager step's tokens."""

import pytest
import torch

import dare.rollout.core as rollout_core
from dare.config import DecodingConfig, ScratchModelConfig
from dare.models import facts, new_model
from dare.models.core import KVCache
from dare.models.tokenizer import char_tokenizer
from dare.rollout import generate, left_pad

PROMPTS = [[5, 6, 7], [5, 6, 7, 8, 9, 10, 11], [9, 8], [4, 5, 6, 7, 8]]


def tiny(family: str):
    tok = char_tokenizer("0123456789+=", family)
    return new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64),
                     seed=0).eval()


@pytest.fixture(scope="module")
def models():
    return {f: tiny(f) for f in ("llada", "sdar")}


def run(model, decoding):
    ids, mask = left_pad(PROMPTS, facts(model).pad_token_id)
    return generate(model, ids, mask, decoding)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_static_cache_computes_what_the_growing_cache_does(family, models):
    model = models[family]
    x = torch.randint(3, 10, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[0, :4] = 0
    grow, static = KVCache(), KVCache(capacity=16)
    with torch.no_grad():
        for cache in (grow, static):
            model(x[:, :8], mask[:, :8], past_key_values=cache, use_cache=True)
        ptrs = [k.data_ptr() for k in static.keys]
        for lo, hi, append in ((8, 12, False), (8, 12, True), (12, 16, False)):
            a, b = (model(x[:, lo:hi], mask[:, lo:hi], past_key_values=c, use_cache=append).logits for c in (grow, static))
            torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-5)  # (row 0's first 4 tokens are padding)
        assert len(static) == 12 and static.valid.shape == (2, 16) and not static.valid[:, 12:].any()
        assert [k.data_ptr() for k in static.keys] == ptrs  # written in place, never reallocated
        grow, static = KVCache(), KVCache(capacity=16)  # the dual cache: replace a window (start a device scalar)
        for cache in (grow, static):
            model(x, mask, past_key_values=cache, use_cache=True)
        a = model(x[:, 4:8], mask[:, 4:8], past_key_values=grow, replace_position=4).logits
        b = model(x[:, 4:8], mask[:, 4:8], past_key_values=static, replace_position=torch.tensor(4)).logits
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        grow.truncate(6), static.truncate(6)  # the prefix cache
        a, b = (model(x[:, 6:], mask[:, 6:], past_key_values=c).logits for c in (grow, static))
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    f = KVCache.allocate(3, 40, layers=2, kv_heads=4, head_dim=8, dtype=torch.bfloat16, device="cpu")
    assert sum(t.nbytes for t in f.keys + f.values) == KVCache.nbytes(3, 40, 2, 4, 8, torch.bfloat16) == 2 * 2 * 3 * 4 * 40 * 8 * 2


class Syncs:
    """Counts the Python calls that read a tensor on the host (a device sync on CUDA)."""

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch):
        self.n = 0
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(t, *a, _original=original, **k):
                self.n += 1
                return _original(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("family, settings", [
    ("llada", {"masked": {"cache": "dual"}}),
    ("llada", {"masked": {"cache": "prefix"}}),
    ("llada", {"masked": {"cache": "none"}}),
    ("sdar", {}),
])
def test_a_fixed_schedule_reads_nothing_on_the_host_per_step(family, settings, models, monkeypatch):
    """The same host reads with 2 and with 8 steps per block: none per step."""
    monkeypatch.setattr(rollout_core, "REFERENCE_TIES", ())  # the batched (CUDA) commit rules
    counts = []
    for steps in (2, 8):
        syncs = Syncs(monkeypatch)
        out = run(models[family], DecodingConfig(gen_length=16, block_length=8, steps=steps * (2 if family == "llada" else 1),
                                                 **settings))
        counts.append(syncs.n)
        monkeypatch.undo()
        monkeypatch.setattr(rollout_core, "REFERENCE_TIES", ())
        assert not (out.responses == facts(models[family]).mask_token_id).any()
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("family, settings", [
    ("llada", {"masked": {"cache": "dual", "threshold": 0.99}}),
    ("llada", {"masked": {"factor": 0.5}}),
    ("sdar", {"block": {"threshold": 0.99}}),
])
def test_rules_that_run_until_clean_look_every_few_steps(family, settings, models, monkeypatch):
    """A rule that may end a block early: the host looks every LOOK_EVERY steps, and the steps run after the
    block is clean change nothing (tokens, step map and nfe as when looking after every step)."""
    model = models[family]
    decoding = DecodingConfig(gen_length=16, block_length=8, steps=16 if family == "llada" else 8,
                              record=("states",), **settings)
    every = run(model, decoding)
    monkeypatch.setattr(rollout_core, "LOOK_EVERY", 1)
    looked_each = run(model, decoding)
    for a, b in ((every.sequences, looked_each.sequences), (every.step_map, looked_each.step_map),
                 (every.trajectory, looked_each.trajectory)):
        assert torch.equal(a, b)
    assert every.nfe == looked_each.nfe
    monkeypatch.setattr(rollout_core, "REFERENCE_TIES", ())
    counts = {}
    for k in (1, 4):
        monkeypatch.setattr(rollout_core, "LOOK_EVERY", k)
        syncs = Syncs(monkeypatch)
        run(model, decoding)
        counts[k] = syncs.n
        monkeypatch.undo()
        monkeypatch.setattr(rollout_core, "REFERENCE_TIES", ())
    forwards = looked_each.nfe  # steps and fills: every step looked at once with k = 1
    assert counts[4] < counts[1] and counts[1] - counts[4] >= (forwards // 2) - 4, counts


CAPTURED = [  # (family, settings, backend): one inductor case, the others traced by the cheaper backends
    ("llada", {"masked": {"cache": "dual", "threshold": 0.5}}, "inductor"),
    ("llada", {"masked": {"cache": "prefix"}}, "aot_eager"),
    ("sdar", {"block": {"threshold": 0.3}}, "aot_eager"),
]


@pytest.mark.parametrize("family, settings, backend", CAPTURED, ids=["dual-inductor", "prefix", "block"])
def test_the_captured_step_decodes_the_eager_tokens(family, settings, backend, monkeypatch, capfd):
    model = tiny(family)  # a fresh model: its compiled step is made here
    monkeypatch.setattr(rollout_core, "BACKEND", None if backend == "inductor" else backend)
    common = dict(gen_length=16, block_length=8, steps=16 if family == "llada" else 4, record=("states",),
                  **settings)
    eager = run(model, DecodingConfig(**common, compile=False))
    captured = run(model, DecodingConfig(**common, compile=True))
    assert model.__dict__["_dare_steps"][rollout_core.BACKEND]  # compiled (fullgraph: a graph break raises) ...
    assert "captured step failed" not in capfd.readouterr().err  # ... and not fallen back to eager
    for name in ("sequences", "step_map", "trajectory", "commit_logps"):
        a, b = getattr(eager, name), getattr(captured, name)
        assert torch.equal(a, b) if name != "commit_logps" else torch.allclose(a, b, atol=1e-5), name
    assert eager.nfe == captured.nfe


def test_compile_is_checked_and_leaves_the_hash_alone():
    from dare.config import Invalid
    from dare.decoding import hashed

    assert hashed(DecodingConfig(compile=True)) == hashed(DecodingConfig()) == hashed(DecodingConfig(compile=False))
    DecodingConfig(compile=True, masked={"cache": "dual"}).validate()
    with pytest.raises(Invalid, match="masked.cache=prefix or dual"):
        DecodingConfig(compile=True, sampler="masked").validate()
    with pytest.raises(Invalid, match="decodes eagerly"):
        DecodingConfig(compile=True, sampler="dream").validate()
    assert rollout_core.compiles(DecodingConfig(), "cpu") is False and rollout_core.compiles(DecodingConfig(), "cuda")


@pytest.mark.parametrize("family, settings", [("llada", {"masked": {"cache": "dual"}}), ("sdar", {})])
def test_a_captured_step_on_cuda_keeps_one_cache_across_rollouts(family, settings, monkeypatch):
    """Where the step is captured on CUDA the cache's addresses must not move between rollouts (a moved static
    input records the CUDA graph again, and torch stops after 128): the model keeps one cache per (capacity,
    batch), emptied for each rollout. Played on CPU with the step compiled by aot_eager and the CUDA flag set."""
    model = tiny(family)
    monkeypatch.setattr(rollout_core, "BACKEND", "aot_eager")
    init = rollout_core.StepForward.__init__

    def as_on_cuda(self, model, compiled):
        init(self, model, compiled)
        self.cuda = True

    monkeypatch.setattr(rollout_core.StepForward, "__init__", as_on_cuda)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: None)
    common = dict(gen_length=16, block_length=8, steps=16 if family == "llada" else 4, **settings)
    eager = run(model, DecodingConfig(**common, compile=False))
    assert "_dare_caches" not in model.__dict__  # eager rollouts make their own
    first = run(model, DecodingConfig(**common, compile=True))
    (key, cache), = model.__dict__["_dare_caches"].items()
    address = cache.keys[0].data_ptr()
    second = run(model, DecodingConfig(**common, compile=True))
    assert model.__dict__["_dare_caches"] == {key: cache} and cache.keys[0].data_ptr() == address
    assert key == (cache.capacity, len(PROMPTS))
    assert torch.equal(first.sequences, eager.sequences) and torch.equal(second.sequences, eager.sequences)


@pytest.mark.parametrize("family, settings", [("llada", {"masked": {"cache": "dual"}}), ("sdar", {})])
def test_a_captured_step_compiles_once_per_bucket_of_prompt_lengths(family, settings, monkeypatch):
    """20 prompts of random lengths (3 to 100 tokens): a captured step compiles once per bucket of prompt widths
    (`rollout_core.BUCKET`, 64: the prompts left-padded, the padding hidden), not once per length; the rollout
    keeps the caller's layout (its own prompt width). Counted with a backend that records each graph it is given."""
    import math
    import random

    def compilations(bucket: int) -> int:
        monkeypatch.setattr(rollout_core, "BUCKET", bucket)
        model, graphs = tiny(family), []
        monkeypatch.setattr(rollout_core, "BACKEND", lambda gm, inputs: graphs.append(1) or gm.forward)
        rng = random.Random(0)
        d = DecodingConfig(gen_length=16, block_length=8, steps=16 if family == "llada" else 4, compile=True,
                           **settings)
        for n in lengths:
            ids, mask = left_pad([[rng.randint(0, 9) for _ in range(n)], [rng.randint(0, 9) for _ in range(n // 2)]], 0)
            out = generate(model, ids, mask, d, torch.Generator().manual_seed(0))
            assert out.sequences.shape[1] == n + 16 and out.prompt_length == n
        return len(graphs)

    lengths = [random.Random(i).randint(3, 100) for i in range(20)]
    buckets = len({math.ceil(n / 64) for n in lengths})
    assert compilations(64) == buckets == 2
    assert compilations(4) > 2 * buckets  # the control: a width per few tokens compiles once per width


def test_the_uncached_block_sampler_decodes_a_prompt_shorter_than_a_block():
    """The block sampler without its cache computes the head on the block it decodes (`logits_at`); a prompt
    shorter than a block leaves that block at column 0, which an unshifted family reads at column 0."""
    model = tiny("sdar")
    ids, mask = left_pad([[3, 4], [5]], 0)
    d = DecodingConfig(gen_length=8, steps=4, block={"cache": "none"})
    out = generate(model, ids, mask, d, torch.Generator().manual_seed(0))
    cached = generate(model, ids, mask, DecodingConfig(gen_length=8, steps=4), torch.Generator().manual_seed(0))
    assert torch.equal(out.sequences, cached.sequences)  # the same tokens as with the cache
