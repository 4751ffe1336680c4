"""Every model family: original checkpoints load, forward modes agree with each other, attention
rules hold, MoE routing follows the originals, and checkpoints move between environments."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

from dare.models import (
    FAMILIES, align, facts, load_pretrained, output_head, register_all, token_hidden, token_logits,
)
from dare.models.core import KVCache, make_layout, visible
from conftest import EVAL_PYTHON, dare_cli
from original_checkpoints import CONFIGS, VOCAB, weight_shapes, write_original_folder

register_all()
ALL = list(FAMILIES)
BLOCK = ["sdar", "sdar_moe", "llada2"]
BIDIRECTIONAL = ["llada", "dream", "lladamoe"]
ATOL = 2e-5


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """family -> (folder, tensors written, model loaded with AutoModel in float32)."""
    out = {}
    for fam in ALL:
        folder = tmp_path_factory.mktemp(fam)
        tensors = write_original_folder(fam, folder)
        out[fam] = (folder, tensors, load_pretrained(folder).eval())
    return out


def from_pretrained_with_info(folder, family):
    if family == "lladamoe":  # released config.json says model_type "llada": loaded by class, as load_pretrained does
        from dare.models.lladamoe import LLaDAMoEConfig, LLaDAMoEModelLM

        cfg = LLaDAMoEConfig.from_dict({k: v for k, v in CONFIGS[family].items() if k != "model_type"})
        return LLaDAMoEModelLM.from_pretrained(folder, config=cfg, dtype=torch.float32, output_loading_info=True)
    return AutoModel.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)


def ids(*lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 36, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("family", ALL)
def test_original_folder_loads_with_zero_missing_or_unexpected_keys(family, originals, tmp_path):
    folder, tensors, _ = originals[family]
    model, info = from_pretrained_with_info(folder, family)
    assert type(model).__name__ == CONFIGS[family]["architectures"][0]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    state = model.state_dict()
    assert set(state) == set(weight_shapes(family))  # nothing beyond the original names, not even buffers
    for name, t in tensors.items():
        torch.testing.assert_close(state[name], t, rtol=0, atol=0, msg=name)
    # save and load again: identical outputs
    x = torch.stack(ids(12, 12, seed=1))
    before = token_logits(model, x)
    model.save_pretrained(tmp_path)
    again = load_pretrained(tmp_path)
    torch.testing.assert_close(token_logits(again, x), before, rtol=0, atol=0)
    assert type(load_pretrained(folder)) is type(model)


@pytest.mark.parametrize("family", ALL)
def test_facts_come_from_the_checkpoint_config(family, originals):
    f = facts(originals[family][2])
    want = {"llada": (39, 38, False, "bidirectional", None), "dream": (39, 37, True, "bidirectional", None),
            "sdar": (151669, 37, False, "block_causal", 4), "sdar_moe": (151669, 37, False, "block_causal", 4),
            "llada2": (156895, 156892, False, "block_causal", 32),
            "lladamoe": (156895, 38, False, "bidirectional", None)}[family]
    # SDAR and LLaDA2 release configs carry no mask id / block size: the released values are the defaults
    assert (f.mask_token_id, f.eos_token_id, f.logits_shift, f.attention, f.block_size) == want


def test_block_size_and_mask_id_are_read_from_config(originals, tmp_path):
    cfg = dict(CONFIGS["sdar"], block_size=8, mask_token_id=5)
    write_original_folder("sdar", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    f = facts(AutoModel.from_pretrained(tmp_path))
    assert (f.block_size, f.mask_token_id) == (8, 5)


@pytest.mark.parametrize("family", ALL)
def test_packed_forward_equals_per_sequence_forward(family, originals):
    model = originals[family][2]
    seqs = ids(7, 11, 5, seed=2)
    packed = torch.cat(seqs)[None]
    cu = torch.tensor([0, 7, 18, 23], dtype=torch.int32)
    with torch.no_grad():
        out = token_logits(model, packed, cu_seqlens=cu)
        for s, e, seq in zip(cu[:-1], cu[1:], seqs):
            torch.testing.assert_close(out[:, s:e], token_logits(model, seq[None]), rtol=1e-4, atol=ATOL)


@pytest.mark.parametrize("family", ALL)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_unpadded_sequences(family, side, originals):
    model = originals[family][2]
    seqs = ids(9, 5, 13, seed=3)
    L = max(len(s) for s in seqs)
    batch = torch.full((3, L), 37)
    mask = torch.zeros(3, L, dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(L - len(s), L) if side == "left" else slice(0, len(s))
        batch[i, sl], mask[i, sl] = s, 1
    with torch.no_grad():
        out = token_logits(model, batch, mask)
        for i, s in enumerate(seqs):
            got = out[i][mask[i].bool()]
            torch.testing.assert_close(got, token_logits(model, s[None])[0], rtol=1e-4, atol=ATOL)
    # padding never changes a real token's output, whatever the pad ids are
    other = batch.masked_fill(~mask.bool(), 3)
    with torch.no_grad():
        # (MoE routing batches different row sets per expert: float32 rounding differs by a few ulp)
        torch.testing.assert_close(token_logits(model, other, mask)[mask.bool()], out[mask.bool()], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", BIDIRECTIONAL)
def test_prefix_cache_equals_full_forward_with_the_same_suffix(family, originals):
    model = originals[family][2]
    x = ids(20, seed=4)[0][None]
    with torch.no_grad():
        full = model(x, use_cache=True)
        cache = full.past_key_values.truncate(12)
        step = model(x[:, 12:], past_key_values=cache)  # read only
        torch.testing.assert_close(step.logits, full.logits[:, 12:], rtol=1e-4, atol=ATOL)
        assert len(cache) == 12


@pytest.mark.parametrize("family", BIDIRECTIONAL)
def test_dual_cache_replace_equals_full_forward(family, originals):
    model = originals[family][2]
    x = ids(20, seed=5)[0][None]
    with torch.no_grad():
        full = model(x, use_cache=True)
        cache = full.past_key_values
        step = model(x[:, 8:12], past_key_values=cache, replace_position=8)
        torch.testing.assert_close(step.logits, full.logits[:, 8:12], rtol=1e-4, atol=ATOL)
        # a changed block: its own keys are replaced in the cache, the rest stays as computed
        y = x.clone()
        y[:, 8:12] = 36
        model(y[:, 8:12], past_key_values=cache, replace_position=8)
        fresh = model(y, use_cache=True).past_key_values
        torch.testing.assert_close(cache.keys[0][:, :, 8:12], fresh.keys[0][:, :, 8:12], rtol=1e-5, atol=1e-6)
        assert len(cache) == 20


@pytest.mark.parametrize("family", BLOCK)
def test_block_causal_cache_equals_full_forward(family, originals):
    model = originals[family][2]
    bs = facts(model).block_size if family != "llada2" else 4
    if family == "llada2":
        model.config.block_size = 4
    try:
        x = torch.stack(ids(18, 18, seed=6))  # a partial last block
        mask = torch.ones_like(x)
        mask[1, :bs] = 0  # and a row left-padded by a block, so blocks share columns across rows
        with torch.no_grad():
            full = model(x, mask).logits
            cache = None
            for s in range(0, 18, bs):
                blk = slice(s, min(s + bs, 18))
                denoise = model(x[:, blk], mask[:, blk], past_key_values=cache or KVCache())  # read
                real = mask[:, blk].bool()
                torch.testing.assert_close(denoise.logits[real], full[:, blk][real], rtol=1e-4, atol=ATOL)
                cache = model(x[:, blk], mask[:, blk], past_key_values=cache, use_cache=True).past_key_values
            assert len(cache) == 18
    finally:
        model.config.block_size = CONFIGS[family].get("block_size", 32 if family == "llada2" else 4)


@pytest.mark.parametrize("family", ALL)
def test_a_later_block_changes_earlier_logits_only_for_bidirectional_models(family, originals):
    model = originals[family][2]
    bs = facts(model).block_size or 4
    x = ids(3 * bs, seed=7)[0][None]
    y = x.clone()
    y[0, 2 * bs:] = (y[0, 2 * bs:] + 1) % VOCAB  # change the last block
    with torch.no_grad():
        a, b = token_logits(model, x), token_logits(model, y)
    earlier = slice(0, 2 * bs - (1 if facts(model).logits_shift else 0))
    if family in BLOCK:  # (MoE experts see different token batches: float32 rounding only)
        torch.testing.assert_close(a[:, earlier], b[:, earlier], rtol=0, atol=1e-5)
        assert (a[:, 2 * bs:] - b[:, 2 * bs:]).abs().max() > 1e-2
    else:
        assert not torch.allclose(a[:, :bs], b[:, :bs])  # bidirectional: the first block sees the last


def test_dream_logits_are_shifted_and_realigned(originals):
    model = originals["dream"][2]
    x = ids(10, seed=8)[0][None]
    with torch.no_grad():
        raw = model(x).logits
        aligned = token_logits(model, x)
        torch.testing.assert_close(aligned[:, 1:], raw[:, :-1], rtol=0, atol=0)  # output i-1 predicts token i
        torch.testing.assert_close(aligned[:, 0], raw[:, 0], rtol=0, atol=0)  # no predecessor: its own
        # the prediction for token i does not depend on token i itself only through the shift:
        # position i-1's raw logits are what a masked LM head reads for i
        packed = torch.cat([x, x], dim=1)
        out = token_logits(model, packed, cu_seqlens=torch.tensor([0, 10, 20]))
        torch.testing.assert_close(out[:, 10], raw[:, 0], rtol=1e-4, atol=ATOL)  # not sequence 1's last output
    for fam in ["llada", "sdar", "llada2"]:
        t = torch.randn(1, 5, 3)
        assert align(originals[fam][2], t) is t


@pytest.mark.parametrize("family", ALL)
def test_hidden_states_output_gives_the_same_logits_through_the_head(family, originals):
    model = originals[family][2]
    x = ids(9, seed=9)[0][None]
    with torch.no_grad():
        h = token_hidden(model, x)
        assert h.shape == (1, 9, model.config.hidden_size if family != "llada" else model.config.d_model)
        torch.testing.assert_close(output_head(model)(h), token_logits(model, x), rtol=0, atol=1e-5)


def test_block_diffusion_layout_mask_follows_the_three_rules():
    bs, L = 2, 6
    pos = torch.arange(L).repeat(2)
    noisy = torch.arange(2 * L) < L
    m = visible(pos[:, None], pos[None, :], torch.ones(2 * L, dtype=torch.bool), bs,
                q_noisy=noisy[:, None], k_noisy=noisy[None, :])
    blk = pos // bs
    for q in range(2 * L):
        for k in range(2 * L):
            if noisy[q] and noisy[k]:
                want = blk[q] == blk[k]  # x_t: its own block only
            elif noisy[q]:
                want = blk[k] < blk[q]  # x_t -> strictly earlier clean blocks
            elif noisy[k]:
                want = False  # x_0 never sees x_t
            else:
                want = blk[k] <= blk[q]  # x_0 block-causal
            assert bool(m[q, k]) == bool(want), (q, k)


@pytest.mark.parametrize("family", BLOCK)
def test_block_diffusion_forward_equals_decoding_each_block_after_its_clean_prefix(family, originals):
    model = originals[family][2]
    model.config.block_size = 4
    try:
        x0 = ids(12, seed=10)[0][None]
        xt = x0.clone()
        xt[:, [1, 2, 5, 9, 10, 11]] = 39  # noised positions
        with torch.no_grad():
            bd = model(torch.cat([xt, x0], dim=1), block_diffusion=True).logits
            assert bd.shape[1] == 12
            for b in range(3):
                ctx = torch.cat([x0[:, :4 * b], xt[:, 4 * b:4 * b + 4]], dim=1)
                torch.testing.assert_close(bd[:, 4 * b:4 * b + 4], model(ctx).logits[:, 4 * b:], rtol=1e-4, atol=ATOL)
    finally:
        model.config.block_size = 32 if family == "llada2" else 4


def test_layout_errors_are_clear(originals):
    model = originals["llada"][2]
    with pytest.raises(ValueError, match="cu_seqlens must rise from 0"):
        model(torch.zeros(1, 5, dtype=torch.long), cu_seqlens=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="block-causal model"):
        model(torch.zeros(1, 4, dtype=torch.long), block_diffusion=True)
    with pytest.raises(ValueError, match="outside the cache"):
        model(torch.zeros(1, 4, dtype=torch.long), past_key_values=model(torch.zeros(1, 6, dtype=torch.long),
                                                                          use_cache=True).past_key_values,
              replace_position=4)
    with pytest.raises(TypeError, match="unsupported arguments"):
        model(torch.zeros(1, 4, dtype=torch.long), frobnicate=True)
    layout = make_layout(model, torch.zeros(2, 5, dtype=torch.long), torch.tensor([[0, 1, 1, 1, 1]] * 2))
    assert layout.mask.shape == (2, 1, 1, 5) and layout.positions[0].tolist() == [0, 0, 1, 2, 3]


# ------------------------------------------------------------------------------------------------
# MoE routing


def test_llada2_router_group_limited_topk_with_selection_only_bias(originals):
    from dare.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeGate

    c = LLaDA2MoeConfig(hidden_size=4, num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
                        routed_scaling_factor=2.5)
    gate = LLaDA2MoeGate(c)
    target = torch.tensor([[0.9, 0.1, 0.2, 0.3, 0.8, 0.85, 0.0, 0.95]])  # sigmoid scores we want
    logit = torch.logit(target)
    with torch.no_grad():
        gate.weight.copy_(torch.zeros(8, 4))
        gate.weight[:, 0] = logit[0]
        x = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
        # groups (of 2): g0={0.9,0.1} sum 1.0, g1={0.2,0.3} 0.5, g2={0.8,0.85} 1.65, g3={0.0,0.95} 0.95
        # keep g2 and g0 -> experts {0,1,4,5}; expert 7 (0.95) is dropped with its group; top-2 = 0, 5
        chosen, w, logits = gate(x)
        assert sorted(chosen[0].tolist()) == [0, 5]
        torch.testing.assert_close(w[0].sort().values, 2.5 * torch.tensor([0.85, 0.9]) / 1.75, rtol=1e-5, atol=1e-6)
        # a bias steers selection (expert 1 now wins its slot) but the weights are the unbiased scores
        gate.expert_bias[1] = 1.0
        chosen, w, _ = gate(x)
        assert sorted(chosen[0].tolist()) == [0, 1]
        torch.testing.assert_close(w[0].sort().values, 2.5 * torch.tensor([0.1, 0.9]) / 1.0, rtol=1e-5, atol=1e-6)
        assert w.dtype == torch.float32 and logits.dtype == torch.float32


def test_llada2_moe_block_is_routed_experts_plus_shared_expert(originals):
    model = originals["llada2"][2]
    moe = model.model.layers[1].mlp
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        y, _ = moe(x)
        chosen, w, _ = moe.gate(x.reshape(-1, 32))
        want = torch.stack([sum(w[t, j] * moe.experts[int(chosen[t, j])](x[0, t]) for j in range(2))
                            for t in range(5)])[None] + moe.shared_experts(x)
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    assert type(model.model.layers[0].mlp).__name__ == "SwiGLU"  # first_k_dense_replace = 1


def test_sdar_moe_softmax_topk_renormalised(originals):
    model = originals["sdar_moe"][2]
    moe = model.model.layers[0].mlp
    x = torch.randn(6, 32)
    with torch.no_grad():
        y, router_logits = moe(x)
        p = torch.softmax(router_logits.float(), -1)
        top = p.topk(2, -1)
        w = top.values / top.values.sum(-1, keepdim=True)
        want = torch.stack([sum(w[t, j] * moe.experts[int(top.indices[t, j])](x[t]) for j in range(2))
                            for t in range(6)])
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
        out = model(torch.zeros(1, 4, dtype=torch.long), output_router_logits=True)
        assert len(out.router_logits) == 2 and out.router_logits[0].shape == (4, 8)


# ------------------------------------------------------------------------------------------------
# Attention backends


@pytest.mark.parametrize("family", ["llada", "sdar", "llada2"])
def test_flex_attention_matches_sdpa(family, originals):
    model = originals[family][2]
    x = torch.stack(ids(10, 10, seed=11))
    mask = torch.ones_like(x)
    mask[0, :3] = 0
    packed, cu = torch.cat(ids(4, 6, seed=12))[None], torch.tensor([0, 4, 10])
    with torch.no_grad():
        ref, ref_packed = token_logits(model, x, mask), token_logits(model, packed, cu_seqlens=cu)
        model.set_attention_backend("flex")
        try:
            got, got_packed = token_logits(model, x, mask), token_logits(model, packed, cu_seqlens=cu)
        finally:
            model.set_attention_backend("sdpa")
    torch.testing.assert_close(got[mask.bool()], ref[mask.bool()], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_packed, ref_packed, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU machine's missing flash-attn")
def test_flash_attn_missing_is_an_error_when_asked_and_a_notice_when_configured(originals, tmp_path, capfd):
    model = originals["llada"][2]
    with pytest.raises(ImportError, match="flash-attn"):
        model.set_attention_backend("flash")
    with pytest.raises(ValueError, match="unknown attention backend"):
        model.set_attention_backend("xformers")
    write_original_folder("sdar", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(CONFIGS["sdar"], attn_implementation="flash_attention_2")))
    loaded = AutoModel.from_pretrained(tmp_path)
    assert loaded.attn_backend == "sdpa"
    assert "flash-attn is not installed" in capfd.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("family", ALL)
def test_flash_attn_matches_sdpa_on_gpu(family, originals):
    pytest.importorskip("flash_attn")
    model = AutoModel.from_pretrained(originals[family][0], dtype=torch.bfloat16).cuda().eval()
    x = torch.stack(ids(16, 16, seed=13)).cuda()
    packed, cu = torch.cat(ids(8, 16, seed=14))[None].cuda(), torch.tensor([0, 8, 24], device="cuda")
    with torch.no_grad():
        ref, ref_p = token_logits(model, x), token_logits(model, packed, cu_seqlens=cu)
        cache = model(x[:, :8], use_cache=True).past_key_values
        ref_step = model(x[:, 8:12], past_key_values=cache).logits
        model.set_attention_backend("flash")
        got, got_p = token_logits(model, x), token_logits(model, packed, cu_seqlens=cu)
        cache = model(x[:, :8], use_cache=True).past_key_values
        got_step = model(x[:, 8:12], past_key_values=cache).logits
    for a, b in [(got, ref), (got_p, ref_p), (got_step, ref_step)]:
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------------------------------------------
# LoRA targets, CLI, cross-environment


@pytest.mark.parametrize("family", ALL)
def test_lora_targets_select_attention_and_mlp_projections_not_the_head(family, originals):
    model = originals[family][2]
    pattern = facts(model).lora_targets
    picked = [n for n, m in model.named_modules() if re.fullmatch(pattern, n)]
    assert picked and all(isinstance(dict(model.named_modules())[n], torch.nn.Linear) for n in picked)
    head = [n for n, m in model.named_modules() if m is model.get_output_embeddings()][0]
    assert head not in picked
    assert not any(".experts." in n or n.endswith(".gate") for n in picked)  # routers and routed experts stay frozen
    per_layer = {"llada": 7, "dream": 7, "sdar": 7, "sdar_moe": 4, "llada2": 2, "lladamoe": 4}[family]
    extra = {"llada2": 3 + 3}.get(family, 0)  # the dense layer's MLP and the shared expert
    assert len(picked) == per_layer * 2 + extra


# Published sizes (total, active) in billions: model cards / papers (Qwen2.5-7B for Dream,
# Qwen3-8B and Qwen3-30B-A3B for SDAR, "16B total, 1.4B active" for LLaDA2-mini).
PUBLISHED = {"llada": (8.02, 8.02), "dream": (7.62, 7.62), "sdar": (8.19, 8.19), "sdar_moe": (30.5, 3.3),
             "llada2": (16.26, 1.4)}


def test_dare_models_lists_every_family_with_its_facts_and_the_published_sizes():
    """The released configs built on the meta device have the published parameter counts: a check
    of the architectures (widths, expert counts, shared expert, dense first layer) at full size."""
    r = dare_cli("models", "released")
    assert r.returncode == 0, r.stderr
    for fam, (_, model_type) in FAMILIES.items():
        cols = next(ln for ln in r.stdout.splitlines() if ln.startswith(fam + " ")).split()
        assert cols[1] == model_type
        if fam in PUBLISHED:
            total, active = (float(c.rstrip("B")) for c in cols[6:8])
            assert total == pytest.approx(PUBLISHED[fam][0], rel=0.02), fam
            assert active == pytest.approx(PUBLISHED[fam][1], rel=0.04), fam
    assert "151669" in r.stdout and "156895" in r.stdout and "126336" in r.stdout


def test_dare_models_show_reads_a_config_or_a_checkpoint(originals, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["llada2"]))
    r = dare_cli("models", "show", str(tmp_path / "config.json"))
    assert r.returncode == 0, r.stderr
    assert "LLaDA2MoeModelLM" in r.stdout and "block_causal" in r.stdout and "156895" in r.stdout
    r = dare_cli("models", "show", str(originals["dream"][0]))
    assert r.returncode == 0, r.stderr
    assert "logits_shift   True" in r.stdout
    r = dare_cli("models", "show", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "error:" in r.stderr


CROSS = """
import json, sys, torch
from pathlib import Path
import transformers
from transformers import AutoConfig, AutoModel, AutoTokenizer
from dare.models import register_all, token_logits
register_all()
out = {}
for folder in sys.argv[1:]:
    folder = Path(folder)
    model, info = AutoModel.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    x = torch.load(folder / "x.pt")
    torch.save(token_logits(model, x), folder / "logits_other.pt")
    tok = AutoTokenizer.from_pretrained(folder)
    model.config.save_pretrained(folder / "resaved")
    model.save_pretrained(folder / "from_eval")  # and the other way round
    tok.save_pretrained(folder / "from_eval")
    out[folder.name] = {"version": transformers.__version__, "problems": {k: v for k, v in info.items() if v},
                        "decoded": tok.decode(tok("12+34=")["input_ids"])}
print(json.dumps(out))
"""


@pytest.mark.skipif(not Path(EVAL_PYTHON).exists(), reason="no eval environment (make test builds $VENV/eval)")
def test_checkpoints_move_between_train_and_eval_environments(tmp_path):
    """Saved here (transformers 5), loaded in the eval env (transformers 4.57), saved there and
    loaded here again: identical logits, identical config fields, and the tokenizers load."""
    import transformers
    from transformers import AutoTokenizer

    from dare.config import ScratchModelConfig
    from dare.models import new_model
    from dare.models.tokenizer import char_tokenizer, save_tokenizer

    folders = []
    for fam in ALL:
        tok = char_tokenizer("0123456789+=", fam)
        model = new_model(fam, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), seed=0)
        folder = tmp_path / fam
        model.save_pretrained(folder)
        save_tokenizer(tok, folder)
        x = torch.randint(0, len(tok), (2, 9), generator=torch.Generator().manual_seed(0))
        torch.save(x, folder / "x.pt")
        with torch.no_grad():
            torch.save(token_logits(model, x), folder / "logits.pt")
        folders.append(folder)
    r = subprocess.run([EVAL_PYTHON, "-c", CROSS, *map(str, folders)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    for folder in folders:
        got = report[folder.name]
        assert got["version"].startswith("4.") and transformers.__version__.startswith("5.")
        assert not got["problems"] and got["decoded"] == "12+34="
        # same weights and code; the two processes may split float reductions differently (CPU load
        # changes oneDNN's thread partition), so the logits agree to float32 rounding, not bitwise
        torch.testing.assert_close(torch.load(folder / "logits_other.pt"), torch.load(folder / "logits.pt"),
                                   rtol=1e-5, atol=1e-6)
        ours = json.loads((folder / "config.json").read_text())
        theirs = json.loads((folder / "resaved" / "config.json").read_text())
        for key, value in ours.items():
            if key != "transformers_version":
                assert theirs.get(key) == value, (folder.name, key, value, theirs.get(key))
        assert "rope_parameters" not in ours and "rope_theta" in ours
        back = load_pretrained(folder / "from_eval")
        with torch.no_grad():
            again = token_logits(back, torch.load(folder / "x.pt"))
        torch.testing.assert_close(again, torch.load(folder / "logits.pt"), rtol=1e-5, atol=1e-6)
        tok = AutoTokenizer.from_pretrained(folder / "from_eval")
        assert tok.decode(tok("12+34=")["input_ids"]) == "12+34="


def test_lladamoe_router_adds_expert_bias_to_the_probabilities_and_never_renormalises(originals):
    model = originals["lladamoe"][2]
    moe = model.model.layers[0].mlp
    x = torch.randn(5, 32)
    with torch.no_grad():
        moe.expert_bias.copy_(torch.linspace(0, 0.3, 8))
        y, router_logits = moe(x)
        p = torch.softmax(router_logits.float(), -1) + moe.expert_bias  # the bias moves weights too
        top = p.topk(2, -1)
        want = torch.stack([sum(top.values[t, j] * moe.experts[int(top.indices[t, j])](x[t]) for j in range(2))
                            for t in range(5)])
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(top.values.sum(-1), torch.ones(5))  # not renormalised


def test_explicit_4d_masks_bool_or_additive_and_the_cache_keeps_pads_hidden(originals):
    model = originals["sdar"][2]
    x = ids(8, seed=15)[0][None]
    blocks = torch.arange(8) // 4
    allowed = (blocks[None, :] <= blocks[:, None])[None, None]  # the originals' block-causal mask
    additive = torch.zeros(1, 1, 8, 8).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        ref = model(x).logits
        torch.testing.assert_close(model(x, allowed).logits, ref, rtol=0, atol=1e-6)
        torch.testing.assert_close(model(x, additive).logits, ref, rtol=0, atol=1e-6)
        with pytest.raises(ValueError, match="4-D attention mask cannot be combined"):
            model(x, allowed, use_cache=True)
        with pytest.raises(TypeError, match="KVCache"):
            model(x, past_key_values=[])
    llada = originals["llada"][2]
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        cache = llada(x, mask, use_cache=True).past_key_values
        before = mask.clone()
        llada(x[:, :4], past_key_values=cache, replace_position=0)  # no mask given: pads stay pads
        assert cache.valid[0].tolist() == [False, False] + [True] * 6 and torch.equal(mask, before)


@pytest.mark.parametrize("family", ALL)
def test_the_torch_free_attention_table_matches_each_familys_facts(family, originals):
    from dare.models import ATTENTION

    assert facts(originals[family][2]).attention == ATTENTION[family]


def test_lladamoe_config_through_autoconfig_is_a_clear_error_and_load_pretrained_loads_it(originals):
    """LLaDA-MoE's released config.json says model_type "llada", so AutoConfig builds LLaDAConfig
    from it; that used to die inside transformers ('hidden_size' has no setter)."""
    from transformers import AutoConfig

    folder = originals["lladamoe"][0]
    with pytest.raises(ValueError, match="LLaDA-MoE's .*load_pretrained"):
        AutoConfig.from_pretrained(folder)
    assert type(load_pretrained(folder)).__name__ == "LLaDAMoEModelLM"
    assert type(AutoConfig.from_pretrained(originals["llada"][0])).__name__ == "LLaDAConfig"


@pytest.mark.parametrize("family", ALL)
def test_logits_at_some_positions_are_those_of_the_whole_forward(family):
    """A sampler asks for the logits of the block it decodes (`token_logits(..., at=)`, the shared forward's
    `logits_at`): the head runs on those positions only, and the values are the whole forward's, bit for bit
    (a shifted family reads each from the position before; a left-padded row keeps its own first token)."""
    from dare.config import ScratchModelConfig
    from dare.models import new_model, read_at
    from dare.models.tokenizer import char_tokenizer

    tok = char_tokenizer("0123456789+=", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0).eval()
    x = torch.randint(0, 12, (3, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(x)
    mask[0, :5] = 0
    with torch.no_grad():
        full = token_logits(model, x, mask)
        for at in (slice(8, 16), slice(6, 24), slice(20, None)):
            assert torch.equal(token_logits(model, x, mask, at=at), full[:, at]), at
        out = model(x, mask, logits_at=read_at(model, slice(8, 12)))
        assert out.logits.shape[1] == 4
    if facts(model).logits_shift:  # the first position's logit has no predecessor to read it from
        with pytest.raises(ValueError, match="after the first position"):
            read_at(model, slice(0, 4))
    else:
        assert read_at(model, slice(0, 4)) == slice(0, 4)
        assert torch.equal(token_logits(model, x, mask, at=slice(0, 4)), full[:, 0:4])
