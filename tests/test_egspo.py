"""EGSPO (baselines/egspo) against the ORIGINAL code, vishnutez/egspo-dllm-rl @a7d618b `egspo/egspo_trainer.py`, run
in a scratch folder (never committed) on `injected()`'s tiny LLaDA (tests/test_tracerl_masked.py) with every weight
x 3, its methods exec'd from the source text: `generate` with its metadata at temperature 0 (12 tokens, blocks of
6, 6 steps: two tokens a step), the step entropies and `_get_high_entropy_time_steps` (K = 3), the step-reward and
advantage block (lambda1 0.5, normalize_returns; a stand-in reward: the share of a completion's tokens equal to 15,
plus 1 when its first token is 3), and `compute_loss` (beta 0.04, eps 0.2 / 0.5) at each of the K updates with
its gradients, old log-probs = the rollout's + OFFSETS, reference = the rollout's + 0.05 (k + 1)."""

from dataclasses import replace

import pytest
import torch

from baselines.egspo import algorithm as egspo
from conftest import run_config
from dare.config import DecodingConfig, Invalid
from dare.rollout import generate
from dare.train import noise
from dare.train.noise import Draw
from test_tracerl_masked import injected

FINAL = [[15, 15, 15, 15, 15, 5, 5, 10, 10, 10, 10, 10], [0, 15, 13, 13, 13, 16, 16, 16, 16, 16, 3, 16], [3, 3, 3, 3, 3, 3, 3, 3, 17, 7, 7, 10], [3, 3, 3, 3, 3, 3, 3, 17, 17, 7, 7, 3]]
CHOSEN = [[0, 1, 2], [1, 0, 2], [3, 4, 2], [5, 4, 3]]
REWARDS_PER_STEP = [[0.8333333134651184, 0.9166666865348816, 0.6666666865348816, 0.4166666567325592], [0.0, 0.0, 0.0833333358168602, 0.0833333358168602], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
ADVANTAGES = [[0.0277777761220932, 0.013888880610466003, 0.0694444328546524], [-0.027777768671512604, -0.0138888880610466, -0.0694444328546524], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
OLD = [[-4.038215637207031, -3.6814863681793213, -3.392354726791382, -3.069694995880127], [-3.73075270652771, -3.8352158069610596, -3.624559164047241, -3.0522990226745605], [-3.344668388366699, -3.977130174636841, -2.893253803253174, -2.845768451690674]]
LOSS0 = 0.0011246055364608765
LOSS1 = -0.00032099566305987537
LOSS2 = 0.001810203306376934
STEP_ENTROPY = [[2.791536, 2.750288, 2.635026, 2.365262, 2.427764, 2.388092], [2.683956, 2.710186, 2.679264, 2.644928, 2.65387, 2.553685], [2.122644, 2.408914, 2.546425, 2.638099, 2.635499, 2.492035], [2.074859, 2.18414, 2.41135, 2.526798, 2.557093, 2.574683]]
GREEDY = [[[15, 15, 13, 15, 15, 15, 5, 15, 15, 15, 15, 15], [15, 15, 15, 15, 15, 15, 5, 15, 15, 15, 15, 15], [15, 15, 15, 15, 15, 5, 5, 5, 15, 15, 15, 5], [15, 15, 15, 15, 15, 5, 5, 10, 2, 18, 18, 10], [15, 15, 15, 15, 15, 5, 5, 10, 10, 10, 10, 10], [15, 15, 15, 15, 15, 5, 5, 10, 10, 10, 10, 10]], [[0, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13], [0, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13], [0, 15, 13, 13, 13, 16, 16, 16, 5, 5, 5, 5], [0, 15, 13, 13, 13, 16, 16, 16, 16, 3, 3, 3], [0, 15, 13, 13, 13, 16, 16, 16, 16, 16, 3, 16], [0, 15, 13, 13, 13, 16, 16, 16, 16, 16, 3, 16]], [[3, 3, 3, 3, 3, 3, 3, 3, 3, 18, 18, 18], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3, 3, 3, 7, 7, 7, 7], [3, 3, 3, 3, 3, 3, 3, 3, 17, 7, 7, 10]], [[3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3, 3, 7, 7, 7, 7, 3], [3, 3, 3, 3, 3, 3, 3, 17, 17, 7, 7, 3]]]
GRADS0 = {'model.transformer.wte.weight': (0.14950424432754517, 0.15367725491523743), 'model.transformer.blocks.0.attn_norm.weight': (0.003094314131885767, 0.0014707848895341158), 'model.transformer.blocks.0.ff_norm.weight': (0.002699901582673192, 0.0010155526688322425), 'model.transformer.blocks.0.q_proj.weight': (0.04245247319340706, 0.002080766949802637)}
GRADS1 = {'model.transformer.wte.weight': (0.0910305455327034, 0.0032948595471680164), 'model.transformer.blocks.0.attn_norm.weight': (0.002389884553849697, 0.0007763515459373593), 'model.transformer.blocks.0.ff_norm.weight': (0.001136474427767098, -0.0003409076889511198), 'model.transformer.blocks.0.q_proj.weight': (0.03654170781373978, -0.009730088524520397)}
GRADS2 = {'model.transformer.wte.weight': (0.3922312259674072, -0.0104144886136055), 'model.transformer.blocks.0.attn_norm.weight': (0.007850993424654007, 0.005626165308058262), 'model.transformer.blocks.0.ff_norm.weight': (0.006307579111307859, 0.006018578074872494), 'model.transformer.blocks.0.q_proj.weight': (0.14568549394607544, -0.18915319442749023)}


OFFSETS = [[0.1, -0.2, 0.05, 0.3], [-0.1, 0.15, -0.25, 0.0], [0.2, 0.0, -0.1, -0.3]]
DECODING = DecodingConfig(gen_length=12, block_length=6, steps=6, temperature=0.0, record=("entropies", "greedy"))


def reward(completion) -> float:
    c = list(completion)
    return sum(x == 15 for x in c) / len(c) + (1.0 if c[0] == 3 else 0.0)


def rolled_out():
    model, batch, _ = injected("llada")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    P = batch.prompt_length
    out = generate(model, batch.sequences[:, :P], batch.attention_mask[:, :P], DECODING)
    score = lambda completions, rows=None: torch.tensor([reward(c) for c in completions.tolist()])
    batch = replace(batch, rollout=out, rewards=score(out.responses), score=score,
                    totals=replace(batch.totals, num_sequences=4))
    return model, batch


def test_the_rollouts_records_are_the_originals():
    model, batch = rolled_out()
    assert batch.responses.tolist() == FINAL
    assert batch.greedy.tolist() == GREEDY  # the argmax fill of the canvas before each step
    entropy = egspo.step_entropies(batch.step_map, batch.entropies, 6)
    assert entropy.tolist() == [pytest.approx(r, abs=1e-5) for r in STEP_ENTROPY]  # the original adds 1e-8 in the log
    assert entropy.topk(3, dim=1).indices.tolist() == CHOSEN


def test_step_rewards_and_advantages_are_the_originals():
    model, batch = rolled_out()
    cfg = run_config("egspo", num_steps=3, lambda1=0.5, normalize_returns=True)
    prepared = egspo.prepare(batch, cfg)
    assert prepared.extras["steps"].tolist() == CHOSEN
    assert prepared.extras["step_advantages"].tolist() == [pytest.approx(r, abs=1e-6) for r in ADVANTAGES]
    rewards = torch.tensor(REWARDS_PER_STEP)
    assert egspo.step_returns(rewards[:, -1], rewards[:, :-1], 2, cfg).tolist() == \
        [pytest.approx(r, abs=1e-6) for r in ADVANTAGES]


@pytest.mark.parametrize("k", [0, 1, 2])
def test_step_log_probs_loss_and_gradients_are_the_originals(k):
    model, batch = rolled_out()
    cfg = run_config("egspo", num_steps=3, steps_per_update=1, beta=0.04, epsilon=0.2, epsilon_high=0.5)
    batch = egspo.prepare(batch, cfg)
    steps = batch.extras["steps"][:, k:k + 1]
    masked, _ = noise.step_states(batch.step_map, steps)
    draw = Draw(masked=torch.cat([torch.zeros(4, 1, batch.prompt_length, dtype=torch.bool), masked], dim=2), steps=steps)
    with torch.no_grad():
        rollout_logps = egspo.token_logps(model, batch, draw, cfg)
    assert rollout_logps[:, 0].tolist() == pytest.approx(OLD[k], abs=1e-5)
    old = torch.tensor(OLD[k])[:, None] + torch.tensor(OFFSETS[k])[:, None]
    ref = torch.tensor(OLD[k])[:, None] + 0.05 * (k + 1)
    model.zero_grad()
    loss, _ = egspo.loss(egspo.token_logps(model, batch, draw, cfg), old, ref, batch, draw, cfg)
    loss.backward()
    assert loss.item() == pytest.approx([LOSS0, LOSS1, LOSS2][k], rel=1e-4)
    grads = dict(model.named_parameters())
    for name, (norm, proj) in [GRADS0, GRADS1, GRADS2][k].items():
        g = grads[name].grad
        assert g.norm().item() == pytest.approx(norm, rel=1e-4)
        assert (g * torch.linspace(-1, 1, g.numel()).view_as(g)).sum().item() == pytest.approx(proj, rel=1e-3, abs=1e-7)


def test_updates_replay_the_chosen_steps_in_the_references_order_and_check_config():
    model, batch = rolled_out()
    cfg = run_config("egspo", num_steps=3, steps_per_update=2)
    batch = egspo.prepare(batch, cfg)
    # the reference's counter: micro-batches k = 1, 2, 0, 1, 2, 0 ...; two micro-batches an update
    assert [egspo.update_steps(u, cfg) for u in range(3)] == [[1, 2], [0, 1], [2, 0]]
    P = batch.prompt_length
    for u in range(3):
        draw = egspo.sample_noise(batch.drawing(u), torch.Generator().manual_seed(u), cfg)
        draw.check()
        ks = egspo.update_steps(u, cfg)
        assert torch.equal(draw.steps, batch.extras["steps"][:, ks])
        assert torch.equal(draw.masked[:, :, P:], batch.step_map[:, None, :] >= draw.steps[:, :, None])  # states before
        assert not draw.masked[:, :, :P].any()
    with pytest.raises(ValueError):
        egspo.check_config(replace(cfg, model=replace(cfg.model, family="sdar")))
    with pytest.raises(ValueError):
        egspo.check_config(replace(cfg, algo=replace(cfg.algo, num_steps=200)))


def test_greedy_and_entropies_need_the_fixed_schedule_without_cache():
    with pytest.raises(Invalid, match="greedy"):
        DecodingConfig(gen_length=12, block_length=6, steps=6, record=("greedy",), sampler="masked",
                       masked={"cache": "prefix"}).validate()


def test_an_update_of_two_steps_is_the_mean_of_its_two_micro_batches():
    model, batch = rolled_out()
    cfg1 = run_config("egspo", num_steps=3, steps_per_update=1, beta=0.04)
    cfg2 = run_config("egspo", num_steps=3, steps_per_update=2, beta=0.04)
    batch = egspo.prepare(batch, cfg2)
    both = egspo.sample_noise(batch, torch.Generator(), cfg2)  # update 0: k = 1, 2
    old = torch.tensor([OLD[1], OLD[2]]).T + 0.1
    ref = torch.tensor([OLD[1], OLD[2]]).T - 0.05
    with torch.no_grad():
        whole, _ = egspo.loss(egspo.token_logps(model, batch, both, cfg2), old, ref, batch, both, cfg2)
        parts = []
        for j, u in ((0, 0), (1, 1)):  # cfg1's updates 0 and 1 replay k = 1 and k = 2
            one = egspo.sample_noise(batch.drawing(u), torch.Generator(), cfg1)
            parts.append(egspo.loss(egspo.token_logps(model, batch, one, cfg1), old[:, j:j + 1], ref[:, j:j + 1],
                                    batch, one, cfg1)[0])
    assert whole.item() == pytest.approx((parts[0] + parts[1]).item() / 2, rel=1e-4)  # one forward of two draws vs two

