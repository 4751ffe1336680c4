"""TraceRL's diffusion value model (`dare.train.critic`, `baselines/tracerl`): the value head reads
the hidden state the policy's log-prob of a token is read from, on every family; step-level GAE and
the clipped value loss against hand-computed numbers (and the reference's own two identities,
train_sdar_value.py: gamma = lambda = 1 gives R = A_i and A = A_i - V; lambda = 0 gives
A = r - V + V*_next); runs with the value model train it, checkpoint it and resume exactly."""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from baselines.tracerl import algorithm as tracerl
from conftest import RL, run_config
from dare.app.runs import train
from dare.config import ScratchModelConfig
from dare.models import facts, new_model, output_head
from dare.models.tokenizer import char_tokenizer
from dare.train.critic import attach_value_head, diffusion_values
from dare.train.estimators import diffusion_hidden, diffusion_logps


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2"])
def test_the_value_head_reads_the_hidden_state_that_scores_each_token(family):
    """The output head on `diffusion_hidden` gives exactly `diffusion_logps` (so values sit where the
    policy scores, shift and block layout included), and a fresh head is zero everywhere."""
    tok = char_tokenizer("0123456789+=", family)
    model = new_model(family, tok, ScratchModelConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64), 0).eval()
    attach_value_head(model)
    clean = torch.tensor([[5, 9, 7, 6, 8, 5, 10, 11], [6, 5, 9, 9, 7, 8, 6, 5]])
    where = torch.zeros_like(clean, dtype=torch.bool)
    where[:, 3:] = True
    x = torch.where(where & (torch.arange(8) % 2 == 1), facts(model).mask_token_id, clean)
    with torch.no_grad():
        hidden = diffusion_hidden(model, x, clean)
        from_hidden = torch.log_softmax(output_head(model)(hidden).float(), -1).gather(-1, clean[..., None])[..., 0]
        assert torch.allclose(torch.where(where, from_hidden, 0.0), diffusion_logps(model, x, clean, where), atol=1e-5)
        assert (diffusion_values(model, x, clean, where) == 0).all()
        model.value_head.weight.normal_()
        values = diffusion_values(model, x, clean, where)
        expected = (hidden @ model.value_head.weight[0]).float()
        assert torch.allclose(values, torch.where(where, expected, 0.0), atol=1e-5) and (values[:, :3] == 0).all()


def _batch():
    """Two groups of two rows; prompt 2, completion 4, block 2 (blocks: the prompt, tokens a b, c d).
    Rows 0, 1: rewards 1, 0 (kept, z = +1, -1); rows 2, 3: rewards 1, 1 (dropped: accuracy 1)."""
    rounds = torch.tensor([[-1, -1, 0, 1, 0, 0],  # steps in decoding order: a=0, b=1, c=d=2
                           [-1, -1, 1, 0, 0, 1],  # b=0, a=1, c=2 (d after the EOS: outside the loss)
                           [-1, -1, 0, 1, 0, 1],
                           [-1, -1, 0, 1, 0, 1]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    batch = SimpleNamespace(prompt_length=2, attention_mask=torch.ones(4, 6, dtype=torch.long), block_size=2,
                            response_mask=mask, rewards=rewards, group_size=2, num_sequences=4,
                            num_tokens=float(mask.sum()), responses=torch.zeros(4, 4))
    batch.advantages = tracerl.advantages(rewards.view(2, 2), run_config("tracerl")).reshape(-1)
    kept = tracerl.kept(rewards.view(2, 2), run_config("tracerl")).expand(-1, 2).reshape(-1)
    batch.extras = {"rounds": rounds, "targets": tracerl.targets(batch, rounds, run_config("tracerl")), "kept": kept}
    return batch


def value_targets(values, batch, cfg):
    """TraceRL's (token advantages, returns, value mask) from `values` as the values before the update."""
    batch.old_values = values
    t = tracerl.value_targets(batch, cfg)
    return t["token_advantages"], t["returns"], t["value_mask"]


VALUES = torch.tensor([[0.2, 0.4, 0.1, 0.3], [0.5, -0.5, 0.25, 9.0], [1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]])


# The reference's own output on this example: `compute_returns_and_advantages_from_fragments`
# (Gen-Verse/dLLM-RL @10b4fd1, train/train_sdar_value.py:716-900), run in a scratch folder on the two
# kept rows (one fragment row per trace step, d as post-EOS padding with post_num 0), 2026-11-25:
# (gamma, lam) -> (advantages, returns) of rows 0 and 1.
REFERENCE = {
    (0.5, 0.5): ([[-0.025, -0.1, 0.9, 0.7], [-0.6875, 0.578125, -1.25, 0.0]],
                 [[0.25, 0.5, 1.0, 1.0], [-0.5, -0.25, -1.0, 0.0]]),
    (1.0, 1.0): ([[0.8, 0.6, 0.9, 0.7], [-1.5, -0.5, -1.25, 0.0]], [[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, 0.0]]),
    (1.0, 0.0): ([[0.2, -0.2, 0.9, 0.7], [-0.25, 1.0, -1.25, 0.0]], [[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, 0.0]]),
}


@pytest.mark.parametrize("gamma,lam", list(REFERENCE))
def test_step_level_gae_equals_the_reference_code(gamma, lam):
    batch = _batch()
    adv, ret, _ = value_targets(VALUES, batch, run_config("tracerl", gamma=gamma, lam=lam))
    ref_adv, ref_ret = REFERENCE[(gamma, lam)]
    assert torch.allclose(adv[:2], torch.tensor(ref_adv), atol=1e-6)
    assert torch.allclose(ret[:2], torch.tensor(ref_ret), atol=1e-6)


def test_step_level_gae_hand_computed():
    """gamma = lambda = 0.5, worked by hand: row 0 (z = +1): r* = (0, 0, 1), V* = (0.2, 0.4, 0.2),
    R* = (0.25, 0.5, 1), A* = (-0.025, -0.1, 0.8); row 1 (z = -1, steps b, a, c): r* = (0, 0, -1),
    V* = (-0.5, 0.5, 0.25), R* = (-0.25, -0.5, -1), A* = (0.578125, -0.6875, -1.25)."""
    batch = _batch()
    assert batch.advantages.tolist() == [1.0, -1.0, 0.0, 0.0]
    adv, ret, _ = value_targets(VALUES, batch, run_config("tracerl", gamma=0.5, lam=0.5))
    assert torch.allclose(ret[0], torch.tensor([0.25, 0.5, 1.0, 1.0]))
    assert torch.allclose(adv[0], torch.tensor([-0.025, -0.1, 0.9, 0.7]))
    assert torch.allclose(ret[1], torch.tensor([-0.5, -0.25, -1.0, 0.0]))
    assert torch.allclose(adv[1], torch.tensor([-0.6875, 0.578125, -1.25, 0.0]))
    assert (adv[2:] == 0).all() and (ret[2:] == 0).all()  # dropped groups: nothing, whatever their values


def test_gae_identities_of_the_reference():
    batch = _batch()
    loss_tokens = batch.response_mask[:2]
    adv, ret, _ = value_targets(VALUES, batch, run_config("tracerl"))  # gamma = lambda = 1
    z = batch.advantages[:2, None].expand(-1, 4)
    assert torch.allclose(ret[:2][loss_tokens], z[loss_tokens])
    assert torch.allclose(adv[:2][loss_tokens], (z - VALUES[:2])[loss_tokens])
    adv0, _, _ = value_targets(VALUES, batch, run_config("tracerl", lam=0.0))  # A = r - V + V*_next
    assert torch.allclose(adv0[0], torch.tensor([-0.2 + 0.4, -0.4 + 0.2, 1 - 0.1, 1 - 0.3]))
    assert torch.allclose(adv0[1], torch.tensor([-0.5 + 0.25, 0.5 + 0.5, -1 - 0.25, 0.0]))
    fresh, _, mask = value_targets(torch.zeros(4, 4), batch, run_config("tracerl"))
    assert torch.allclose(fresh[:2][loss_tokens], z[loss_tokens])  # a zero head: the group z-scores
    assert mask.tolist() == [[True] * 4, [True] * 3 + [False], [False] * 4, [False] * 4]  # kept groups' loss tokens


def test_value_loss_hand_computed_with_its_clip():
    """0.5 max((V - R)^2, (V_old + clip(V - V_old, +-0.2) - R)^2), summed over the kept groups' loss
    tokens, / (L1 = 4 x B = 4). Row 0: V = (0.5, -0.1, 0.3, 0) from 0, R = (1, 0, 0, 0):
    0.5 (0.64 + 0.01 + 0.09 + 0) = 0.37; row 1 sits on its targets; rows 2, 3 are dropped."""
    batch = _batch()
    batch.old_values = torch.zeros(4, 4)
    mask = torch.tensor([[True] * 4, [True] * 3 + [False], [False] * 4, [False] * 4])
    returns = torch.tensor([[1.0, 0, 0, 0], [0.3, 0.3, 0.3, 0.3], [5.0] * 4, [5.0] * 4])
    batch.extras.update(returns=returns, value_mask=mask)  # injected targets
    values = torch.tensor([[0.5, -0.1, 0.3, 0.0], [0.3, 0.3, 0.3, 7.0], [0.0] * 4, [0.0] * 4])
    batch.old_values[1] = 0.3
    loss, metrics = tracerl.value_loss(values, batch, None, run_config("tracerl"))
    assert loss.item() == pytest.approx(0.37 / 16, rel=1e-6)
    assert metrics["clip_ratio"] == pytest.approx(2 / 15)  # 0.5 and 0.3 in row 0 (7.0 is past the EOS)


def _value_weights(run):
    return load_file(str(run / "value" / "model.safetensors"))


def test_tracerl_with_the_value_model_trains_it_checkpoints_it_and_resumes_exactly(tmp_path, monkeypatch, sft_checkpoint):
    """Two steps on a tiny SDAR with the value model: it is trained (its head leaves zero), logged
    (`value/*`), saved beside each checkpoint and exported to `<run>/value/`; resuming from the
    step-2 checkpoint reaches the same policy and value weights as the straight run."""
    from dare.data import TASKS

    monkeypatch.setattr(TASKS["addition"], "rewards", lambda texts, rows, style="default": [
        float(i % 2) for i in range(len(texts))])
    args = [f"model.path={sft_checkpoint('sdar')}", "model.family=sdar", *RL, "train.steps=3", "run.save_every=2",
            "algo.value_model=true", "algo.value_lr=1e-3"]
    a = train("tracerl", None, [*args, f"run.out_dir={tmp_path / 'a'}"])
    records = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["value/loss"] > 0 and r["value/grad_norm"] > 0 for r in records)
    assert records[-1]["value/mean"] != 0.0  # (the zero head at the start: the first test)
    assert (a / "checkpoints" / "step_0000002" / "value" / "trainer_state.pt").is_file()
    # TraceRL's noise is the rollout's own (drawn once per step), yet both models make mu = 2 updates a step
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = a / "checkpoints" / "step_0000002"
    for folder in (ckpt, ckpt / "value"):  # the optimizer states, read whole from the sharded checkpoints
        dcp_to_torch_save(folder / "dcp", tmp_path / "whole.pt")
        state = torch.load(tmp_path / "whole.pt", weights_only=False)
        steps = {float(s["step"]) for s in state["optimizer"]["state"].values()}
        assert steps == {4.0}, steps
    head = _value_weights(a)["value_head.weight"]
    assert head.abs().sum() > 0

    b = tmp_path / "b"
    shutil.copytree(a / "checkpoints", b / "checkpoints")
    (b / "run.json").write_text(json.dumps({**json.loads((a / "run.json").read_text()), "status": "running"}))
    train("tracerl", None, [*args, f"run.out_dir={b}"])
    for weights in (lambda r: load_file(str(r / "final" / "model.safetensors")), _value_weights):
        wa, wb = weights(a), weights(b)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_policy_loss_takes_the_token_advantages_when_there_are_some():
    """With a value model, A_k replaces the row's A_i in TraceRL's clipped objective."""
    cfg = run_config("tracerl", epsilon=0.2, beta=0.0)
    mask = torch.tensor([[True, True, False]])
    token_adv = torch.tensor([[2.0, -1.0, 5.0]])
    batch = SimpleNamespace(advantages=torch.tensor([9.0]), old_values=torch.zeros(1, 3), response_mask=mask,
                            num_tokens=2.0, num_sequences=1, responses=torch.zeros(1, 3), block_size=4,
                            extras={"targets": mask, "token_advantages": token_adv})  # A_k from the values
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    new = old + torch.tensor([[0.5, 0.1, 0.0]])
    loss, _ = tracerl.loss(new, old, None, batch, None, cfg)
    rho = torch.exp(torch.tensor([0.5, 0.1]))
    a = torch.tensor([2.0, -1.0])
    expected = -torch.min(rho * a, rho.clamp(0.8, 1.2) * a).sum() / 3
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar_moe", "llada2"])
def test_tracerl_with_the_value_model_runs_on_every_family(family, tmp_path, monkeypatch, sft_checkpoint):
    from dare.data import TASKS

    monkeypatch.setattr(TASKS["addition"], "rewards", lambda texts, rows, style="default": [
        float(i % 2) for i in range(len(texts))])
    out = train("tracerl", None, [f"model.path={sft_checkpoint(family)}", f"model.family={family}", *RL,
                                  "algo.value_model=true", "algo.value_lr=1e-3", f"run.out_dir={tmp_path / family}"])
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["value/loss"] > 0 and r["value/grad_norm"] > 0 for r in records)
    assert _value_weights(out)["value_head.weight"].abs().sum() > 0


def test_value_training_in_micro_batches_that_split_groups_matches_the_whole_batch(tmp_path, monkeypatch,
                                                                                   sft_checkpoint):
    """Micro-batches of 3 rows cut groups of 4: the kept-group mask comes from the whole batch, and
    the value loss is normalized by the step's totals, so the policy and the value model reach the
    weights of the whole-batch run."""
    from dare.data import TASKS

    monkeypatch.setattr(TASKS["addition"], "rewards", lambda texts, rows, style="default": [
        float(i % 2) for i in range(len(texts))])
    args = [f"model.path={sft_checkpoint('sdar')}", "model.family=sdar", *RL, "algo.value_model=true",
            "algo.value_lr=1e-3"]
    whole = train("tracerl", None, [*args, f"run.out_dir={tmp_path / 'whole'}"])
    parts = train("tracerl", None, [*args, "train.micro_batch_size=3", f"run.out_dir={tmp_path / 'parts'}"])
    for weights in (lambda r: load_file(str(r / "final" / "model.safetensors")), _value_weights):
        a, b = weights(whole), weights(parts)
        assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def test_a_value_model_without_its_hooks_is_refused_before_any_model_is_loaded(tmp_path):
    """`value_model(cfg)` asks for one but `value_loss` is missing: a clear error naming the hook,
    raised before the (here nonexistent) checkpoint is read."""
    import dataclasses

    from dare.train import rl
    from dare.train.hooks import RLHooks, bind
    from dare.utils import UserError

    default = next(f.default for f in dataclasses.fields(RLHooks) if f.name == "value_loss")
    hooks = dataclasses.replace(bind(tracerl), value_loss=default)
    cfg = run_config("tracerl", value_model=True)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(tmp_path / "no-such-checkpoint")))
    with pytest.raises(UserError, match=r"does not define \['value_loss'\]"):
        rl.run(cfg, hooks, tmp_path / "run")
