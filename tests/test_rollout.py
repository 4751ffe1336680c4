import pytest
import torch
import torch.nn.functional as F

from dare.config import DecodingConfig
from dare.models import facts, token_logits
from dare.rollout import generate, left_pad, response_mask
from dare.rollout.core import num_transfer_tokens

PROMPTS = [[5, 10, 11, 7, 12, 13, 18, 6], [5, 14, 7, 15, 18, 6], [5, 17, 18, 9, 16, 15, 14, 6]]


def reference_generate(model, prompt, steps, gen_length, block_length, mask_id):
    """A plain transcription of the reference LLaDA `generate` at temperature 0 (one sequence,
    low-confidence remasking, torch.topk per step), used to check the batched engine."""
    x = torch.full((1, len(prompt) + gen_length), mask_id, dtype=torch.long)
    x[0, :len(prompt)] = torch.tensor(prompt)
    n_blocks = gen_length // block_length
    spb = steps // n_blocks
    for b in range(n_blocks):
        lo = len(prompt) + b * block_length
        block_masked = (x[:, lo:lo + block_length] == mask_id).sum(dim=1, keepdim=True)
        base, rem = block_masked // spb, block_masked % spb
        k = torch.zeros(1, spb, dtype=torch.long) + base
        for i in range(int(rem)):
            k[:, i] += 1
        for i in range(spb):
            mask_index = x == mask_id
            logits = model(x).logits
            x0 = torch.argmax(logits, dim=-1)
            p = F.softmax(logits, dim=-1)
            x0_p = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
            x0_p[:, lo + block_length:] = -float("inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -float("inf"))
            _, sel = torch.topk(confidence[0], k=int(k[0, i]))
            x[0, sel] = x0[0, sel]
    return x[0, len(prompt):]


def params(**kw):
    return DecodingConfig(**{"gen_length": 8, "block_length": 4, "steps": 4, **kw})


def batch(prompts=PROMPTS):
    return left_pad(prompts, pad_id=1)


@pytest.mark.parametrize("model_name", ["tiny_model", "trained_tiny"])
@pytest.mark.parametrize("steps,block", [(8, 8), (4, 4), (8, 2), (2, 8)])
def test_greedy_matches_reference_token_for_token(request, model_name, steps, block):
    model = request.getfixturevalue(model_name)
    mask_id = facts(model).mask_token_id
    ids, mask = batch()
    out = generate(model, ids, mask, params(steps=steps, block_length=block))
    for row, prompt in enumerate(PROMPTS):
        ref = reference_generate(model, prompt, steps, 8, block, mask_id)
        assert torch.equal(out.responses[row], ref), (row, out.responses[row], ref)


def test_no_mask_left_and_step_accounting(trained_tiny):
    ids, mask = batch()
    out = generate(trained_tiny, ids, mask, params(gen_length=8, block_length=4, steps=6, temperature=0.8),
                   torch.Generator().manual_seed(0))
    assert not (out.responses == facts(trained_tiny).mask_token_id).any()
    assert out.nfe == 6
    # Block 0 (positions 0-3) is fully committed in steps 0-2, block 1 in steps 3-5; per step the
    # commit counts follow the reference's even split (2, 1, 1).
    assert (out.step_map[:, :4] <= 2).all() and (out.step_map[:, 4:] >= 3).all()
    per_step = torch.stack([(out.step_map == s).sum(dim=1) for s in range(6)], dim=1)
    assert per_step.tolist() == [[2, 1, 1, 2, 1, 1]] * 3
    assert num_transfer_tokens(torch.tensor([4, 5]), 3).tolist() == [[2, 1, 1], [2, 2, 1]]


def test_seeded_sampling_is_deterministic(tiny_model):
    ids, mask = batch()
    p = params(temperature=1.0, masked={"remasking": "random"})
    a = generate(tiny_model, ids, mask, p, torch.Generator().manual_seed(7)).responses
    b = generate(tiny_model, ids, mask, p, torch.Generator().manual_seed(7)).responses
    c = generate(tiny_model, ids, mask, p, torch.Generator().manual_seed(8)).responses
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_mixed_prompt_lengths_equal_one_by_one(tiny_model):
    ids, mask = batch()
    together = generate(tiny_model, ids, mask, params()).responses
    for row, prompt in enumerate(PROMPTS):
        alone = generate(tiny_model, *left_pad([prompt], 1), params()).responses
        assert torch.equal(together[row], alone[0])


def test_gumbel_argmax_follows_the_temperature():
    """At a tiny temperature the sample is the argmax; at temperature 1 it follows softmax."""
    from dare.rollout.core import gumbel_argmax as sample_tokens

    logits = torch.tensor([[[2.0, 1.0, 0.0]]]).expand(1, 20000, 3)
    g = torch.Generator().manual_seed(0)
    assert (sample_tokens(logits, 1e-4, g) == 0).all()
    freq = torch.bincount(sample_tokens(logits, 1.0, g).flatten(), minlength=3).float() / 20000
    torch.testing.assert_close(freq, torch.softmax(logits[0, 0], -1), atol=0.015, rtol=0)


def test_cfg_and_response_mask(trained_tiny):
    ids, mask = batch()
    out = generate(trained_tiny, ids, mask, params(masked={"cfg_scale": 1.0}))
    assert out.nfe == 4 and not (out.responses == facts(trained_tiny).mask_token_id).any()
    r = torch.tensor([[3, 1, 4, 1], [3, 3, 3, 3], [1, 2, 2, 2]])
    assert response_mask(r, 1).tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]


def test_cfg_zero_equals_plain_logits(tiny_model):
    from dare.rollout.llada import _guided_logits as _logits

    x = torch.tensor([[5, 9, 10, 2, 2]])
    am = torch.ones_like(x)
    prompt = torch.tensor([[True, True, True, False, False]])
    torch.testing.assert_close(_logits(tiny_model, x, am, prompt, 2, 0.0, slice(3, 5)),
                               token_logits(tiny_model, x, am)[:, 3:5])  # the block's logits only


@pytest.mark.parametrize("family, end_of_turn", [("llada", "<|eot_id|>"), ("dream", "<|im_end|>"),
                                                 ("sdar", "<|im_end|>"), ("llada2", "<|role_end|>")])
def test_the_response_ends_at_eos_or_the_end_of_turn_the_tokenizer_names(family, end_of_turn, tmp_path):
    """Released configs name only EOS (LLaDA-8B-Instruct: 126081 <|endoftext|>), while the chat
    turn ends at the family's end-of-turn token (<|eot_id|> 126348; DiffuCoder cuts completions at
    <|im_end|>). Loading a checkpoint reads its id from the tokenizer files; the response mask,
    the decoded text (rewards, evaluation) and `confidence_eos_eot_inf` all use it."""
    from dare.config import ScratchModelConfig
    from dare.models import load_pretrained, new_model
    from dare.models.tokenizer import char_tokenizer, save_tokenizer
    from dare.rollout import decode_responses

    tok = char_tokenizer("0123456789+=", family)
    tok.add_special_tokens({"additional_special_tokens": [end_of_turn]})
    eot = tok.convert_tokens_to_ids(end_of_turn)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), seed=0)
    assert facts(model).eot_token_id is None  # a scratch model's config names none
    model.save_pretrained(tmp_path)
    save_tokenizer(tok, tmp_path)
    loaded = load_pretrained(tmp_path)
    f = facts(loaded)
    assert f.eot_token_id == eot and f.stop_ids == (f.eos_token_id, eot)
    one, two = tok.convert_tokens_to_ids(["1", "2"])
    r = torch.tensor([[one, eot, f.eos_token_id, two], [one, two, f.eos_token_id, eot], [one, two, two, two]])
    assert response_mask(r, f.stop_ids).tolist() == [[True, True, False, False], [True, True, True, False], [True] * 4]
    assert decode_responses(tok, r, f.stop_ids) == ["1", "12", "1222"]
    assert decode_responses(tok, r, f.eos_token_id) == ["1", "12", "1222"]  # special tokens are dropped either way...
    text_after = torch.tensor([[one, eot, two, two]])
    assert decode_responses(tok, text_after, f.stop_ids) == ["1"]  # ...but the text after the end of turn is not
    assert decode_responses(tok, text_after, f.eos_token_id) == ["122"]


def test_a_checkpoint_without_the_end_of_turn_token_keeps_eos_only(tmp_path, char_tok, tiny_model):
    from dare.models import load_pretrained
    from dare.models.tokenizer import save_tokenizer

    tiny_model.save_pretrained(tmp_path)
    save_tokenizer(char_tok, tmp_path)
    assert facts(load_pretrained(tmp_path)).stop_ids == (facts(tiny_model).eos_token_id,)
