"""Attention dispatch (`dare.models.core`): no mask where every query sees every key, FlexAttention block
masks built from per-token vectors, and SDPA kept on its fused kernels on CUDA (grouped-query attention
with a mask repeats the key/value heads instead of falling to the math kernel)."""

import pytest
import torch

from dare.models import FAMILIES, load_pretrained, register_all, token_logits
from dare.models import core
from dare.models.core import make_layout
from original_checkpoints import CONFIGS, write_original_folder

register_all()
ALL = list(FAMILIES)
BLOCK = ["sdar", "sdar_moe", "llada2"]
DENSE = ["llada", "dream", "sdar"]  # no experts
BS = 4  # the block size of every block-causal model here


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> a tiny checkpoint folder shaped like the released one (written on first use)."""
    made = {}

    def folder(family):
        if family not in made:
            made[family] = tmp_path_factory.mktemp(family)
            write_original_folder(family, made[family])
        return made[family]

    return folder


def tiny(folders, family, dtype="float32"):
    model = load_pretrained(folders(family), dtype=dtype).eval()
    if family in BLOCK:
        model.config.block_size = BS
    return model


def ids(B, L, seed):
    return torch.randint(0, 36, (B, L), generator=torch.Generator().manual_seed(seed))


def every_layout(model, device="cpu"):
    """{layout name: (logits, rows to compare)} of one forward (or cache sequence) in each layout the
    model's family uses, on fresh caches; padded rows are left out of the comparison."""
    block = model.dllm_block_size()
    x = ids(2, 12, seed=1).to(device)
    pad = torch.ones_like(x)
    pad[0, :BS] = 0  # a row left-padded by a block (blocks share columns across rows)
    real = pad.bool()
    every = torch.ones_like(real)
    out = {}
    with torch.no_grad():
        out["plain"] = (model(x).logits, every)
        out["padded"] = (model(x, pad).logits, real)
        packed, cu = ids(1, 11, seed=2).to(device), torch.tensor([0, 5, 11], device=device)
        out["packed"] = (model(packed, cu_seqlens=cu).logits, torch.ones(1, 11, dtype=torch.bool, device=device))
        if block is not None:
            xt = x.masked_fill(ids(2, 12, seed=3).to(device) % 3 == 0, 39)
            out["block diffusion"] = (model(torch.cat([xt, x], 1), pad, block_diffusion=True).logits, real)
            for name, m in (("unpadded", None), ("padded", pad)):
                sl = (lambda a, b: None) if m is None else (lambda a, b: m[:, a:b])
                cache = model(x[:, :BS], sl(0, BS), use_cache=True).past_key_values  # fill: one block
                rows = every if m is None else real
                out[f"cache read one block {name}"] = (
                    model(x[:, BS:2 * BS], sl(BS, 2 * BS), past_key_values=cache).logits, rows[:, BS:2 * BS])
                out[f"cache read past a block {name}"] = (
                    model(x[:, BS:BS + 6], sl(BS, BS + 6), past_key_values=cache).logits, rows[:, BS:BS + 6])
                out[f"cache append {name}"] = (model(x[:, BS:2 * BS], sl(BS, 2 * BS), past_key_values=cache,
                                                     use_cache=True).logits, rows[:, BS:2 * BS])
                out[f"cache read after append {name}"] = (
                    model(x[:, 2 * BS:], sl(2 * BS, 12), past_key_values=cache).logits, rows[:, 2 * BS:])
        else:
            for name, m in (("unpadded", None), ("padded", pad)):
                sl = (lambda a, b: None) if m is None else (lambda a, b: m[:, a:b])
                rows = every if m is None else real
                cache = model(x[:, :8], sl(0, 8), use_cache=True).past_key_values
                out[f"prefix cache read {name}"] = (model(x[:, 8:], sl(8, 12), past_key_values=cache).logits,
                                                    rows[:, 8:])
                cache = model(x, m, use_cache=True).past_key_values
                out[f"dual cache replace {name}"] = (
                    model(x[:, 4:8], sl(4, 8), past_key_values=cache, replace_position=4).logits, rows[:, 4:8])
    return out


def compare(got, want, rtol, atol):
    assert got.keys() == want.keys()
    for name in want:
        (a, rows), (b, _) = got[name], want[name]
        torch.testing.assert_close(a[rows].float(), b[rows].float(), rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


# ------------------------------------------------------------------------------------------------
# FlexAttention from per-token vectors


@pytest.mark.parametrize("family", ["dream", "sdar"])  # bidirectional and block-causal, both with GQA
def test_flex_matches_sdpa_on_every_layout(family, folders):
    model = tiny(folders, family)
    want = every_layout(model)
    model.set_attention_backend("flex")
    compare(every_layout(model), want, rtol=1e-5, atol=1e-5)


def test_flex_block_masks_come_from_vectors_once_per_forward(folders, monkeypatch):
    model = tiny(folders, "sdar")
    model.set_attention_backend("flex")
    flex, create = core.flex_attention_functions()
    built = []

    def counting(*args, **kwargs):
        built.append(args[3:5])
        return create(*args, **kwargs)

    monkeypatch.setattr(core, "flex_attention_functions", lambda: (flex, counting))
    x = ids(2, 8, seed=4)
    bd = make_layout(model, torch.cat([x, x], 1), block_diffusion=True)
    packed = make_layout(model, ids(1, 9, seed=5), cu_seqlens=torch.tensor([0, 4, 9]))
    for layout in (bd, packed):  # no dense (L, L) mask: FlexAttention reads the per-token vectors
        assert layout.mask is None and layout.visibility is not None
    assert bd.visibility.q_noisy is not None and packed.visibility.q_doc is not None
    with torch.no_grad():
        model(torch.cat([x, x], 1), block_diffusion=True)
    assert built == [(16, 16)]  # one block mask, shared by the layers (two here)
    model.set_attention_backend("sdpa")  # the reference keeps its dense mask
    assert make_layout(model, torch.cat([x, x], 1), block_diffusion=True).mask.shape == (2, 1, 16, 16)


# ------------------------------------------------------------------------------------------------
# No mask where every query sees every key


def test_no_mask_where_every_query_sees_every_key(folders):
    sdar, dream = tiny(folders, "sdar"), tiny(folders, "dream")
    x, ones = ids(2, 8, seed=6), torch.ones(2, 8, dtype=torch.long)
    with torch.no_grad():
        cache = sdar(x[:, :BS], use_cache=True).past_key_values
        assert make_layout(dream, x).mask is None
        assert make_layout(dream, x, ones).mask is None  # a padding mask with no padding
        assert make_layout(sdar, x[:, :BS], ones[:, :BS]).mask is None  # one block, no cache
        assert make_layout(sdar, x[:, BS:], ones[:, BS:], past_key_values=cache, cache_mode="read").mask is None
        assert make_layout(sdar, x[:, BS:BS + 2], past_key_values=cache, cache_mode="read").mask is None
        # where something is hidden
        assert make_layout(sdar, x).mask.shape == (2, 1, 8, 8)  # two blocks
        assert make_layout(sdar, x[:, 2:6], position_ids=torch.arange(2, 6).expand(2, 4)).mask is not None
        pad = ones.clone()
        pad[0, :BS] = 0
        assert make_layout(dream, x, pad).mask.shape == (2, 1, 1, 8)  # key padding only
        padded = sdar(x[:, :BS], pad[:, :BS], use_cache=True).past_key_values
        layout = make_layout(sdar, x[:, BS:], ones[:, BS:], past_key_values=padded, cache_mode="read")
        assert layout.mask.shape == (2, 1, 1, 8)  # one block over a padded cache: key padding only
        full = sdar(x, use_cache=True).past_key_values
        assert make_layout(sdar, x[:, :BS], past_key_values=full, cache_mode="replace").mask is not None


@pytest.mark.parametrize("family", ["dream", "sdar"])
def test_the_unmasked_call_equals_the_masked_one(family, folders, monkeypatch):
    model = tiny(folders, family)
    unmasked = every_layout(model)
    monkeypatch.setattr(core, "_block_rule_hides_nothing", lambda *a: False)  # always the whole rule, as a mask
    assert make_layout(model, ids(1, 3, seed=0)).mask is not None
    compare(every_layout(model), unmasked, rtol=1e-6, atol=1e-6)


def test_masks_are_read_once_per_tensor_until_changed_in_place(folders, monkeypatch):
    model = tiny(folders, "sdar")
    asked = []
    ask = core._FACT_QUESTIONS["all"]
    monkeypatch.setitem(core._FACT_QUESTIONS, "all", lambda t: asked.append(t.shape) or ask(t))
    x = ids(2, 12, seed=7)
    valid = torch.ones(2, 12, dtype=torch.bool)
    with torch.no_grad():
        cache = model(x[:, :BS], valid[:, :BS], use_cache=True).past_key_values
        n = len(asked)
        for _ in range(3):  # the denoising steps of one block: the same view of the same mask each time
            layout = make_layout(model, x[:, BS:2 * BS], valid[:, BS:2 * BS], past_key_values=cache,
                                 cache_mode="read")
            assert layout.mask is None
        assert len(asked) - n == 1  # the block's mask, once (the cache was read when it was filled)
        valid[1, 2 * BS - 1] = False  # changed in place: read again
        layout = make_layout(model, x[:, BS:2 * BS], valid[:, BS:2 * BS], past_key_values=cache, cache_mode="read")
        assert layout.mask is not None and not layout.mask[1, 0, 0, -1]


# ------------------------------------------------------------------------------------------------
# SDPA on its fused kernels


@pytest.mark.parametrize("queries", [5, core.FOLD_QUERIES + 6])  # folded into the query length / repeated
def test_repeating_key_value_heads_equals_enable_gqa(queries):
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, h, n, 8, generator=g) for h, n in ((4, queries), (2, 7), (2, 7)))
    mask = torch.rand(2, 1, queries, 7, generator=g) > 0.5
    mask[..., 0] = True
    for m in (mask, mask[:, :, :1], mask[:1], None):
        torch.testing.assert_close(core._sdpa(q, k, v, m, repeat_kv=True), core._sdpa(q, k, v, m, repeat_kv=False),
                                   rtol=1e-6, atol=1e-6)
    assert not q.is_cuda or core._sdpa(q, k, v, None).shape == q.shape  # (CPU: enable_gqa, no repeat)


def gpu_model(folders, family, dtype):
    return tiny(folders, family, dtype).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("family", ALL)
def test_no_family_forward_needs_the_math_kernel_on_gpu(family, folders):
    """Every layout of every family, float32 and bfloat16, with SDPA allowed only its fused kernels: a
    call that would need the math kernel raises. The dense families also run the training layouts'
    backward, and their float32 logits agree with the math kernel's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for dtype in (torch.float32, torch.bfloat16):
        model = gpu_model(folders, family, str(dtype).split(".")[-1])
        with core.fused_attention_only():
            got = every_layout(model, "cuda")
            x = ids(2, 12, seed=9).cuda()
            pad = torch.ones_like(x)
            pad[0, :BS] = 0
            if family in DENSE:  # the backward of the kernels a training forward uses
                training = [model(x, pad)]
                if family in BLOCK:
                    training.append(model(torch.cat([x, x], 1), pad, block_diffusion=True))
                sum(out.logits.float().sum() for out in training).backward()
        for name, (logits, _) in got.items():
            assert torch.isfinite(logits.float()).all(), (family, dtype, name)
        if dtype == torch.float32 and family in DENSE:  # (MoE routing could flip on a near tie)
            with sdpa_kernel([SDPBackend.MATH]):
                want = every_layout(model, "cuda")
            compare(got, want, rtol=5e-3, atol=5e-3)


def flex_sdar(device):
    """A tiny SDAR with 16-dimensional heads (compiled FlexAttention in some torch versions takes no fewer)."""
    from dare.models.sdar import SDARConfig, SDARForCausalLM

    drop = ("architectures", "auto_map", "model_type", "transformers_version", "torch_dtype")
    config = SDARConfig(**{k: v for k, v in CONFIGS["sdar"].items() if k not in drop})
    config.head_dim, config.block_size = 16, BS
    torch.manual_seed(0)
    return SDARForCausalLM(config).eval().to(device)


@pytest.mark.gpu
def test_flex_on_gpu_matches_sdpa_from_per_token_vectors():
    """The compiled block-mask build and kernel on the two layouts whose masks come from vectors only."""
    model = flex_sdar("cuda")
    x = ids(2, 12, seed=10).cuda()
    pad = torch.ones_like(x)
    pad[0, :BS] = 0
    packed, cu = ids(1, 11, seed=11).cuda(), torch.tensor([0, 5, 11], device="cuda")
    with torch.no_grad():
        want = [model(torch.cat([x, x], 1), pad, block_diffusion=True).logits[pad.bool()],
                token_logits(model, packed, cu_seqlens=cu)]
        model.set_attention_backend("flex")
        got = [model(torch.cat([x, x], 1), pad, block_diffusion=True).logits[pad.bool()],
               token_logits(model, packed, cu_seqlens=cu)]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


def test_fused_attention_only_names_real_kernels():
    from torch.nn.attention import SDPBackend

    assert all(hasattr(SDPBackend, name) for name in core.FUSED_KERNELS)
    with core.fused_attention_only():
        pass
