"""d-OPSD, on-policy self-distillation for diffusion LLMs ("Learning from the Self-future: On-policy
Self-distillation for dLLMs", arXiv:2606.18195; reference code `xingzhejun/d-OPSD` @1b55cf3,
`d-opsd/d_opsd_trainer.py`, `d-opsd/utils.py` `generate`, `d-opsd/run/*/opsd.sh`; no license: ported from the paper
and the code's behaviour, its outputs pinned).

No reward-weighted gradient at all: the model is distilled, state by state along its own correct decoding
trajectory, toward a teacher that sees part of the future. The teacher is the frozen start model, shown the same
intermediate state plus a quarter of the positions from the next block on filled with the trajectory's own final
tokens (its verified answer). At each state, the two masked positions of the current block that the teacher is most
confident about are distilled: a divergence between the student's and the teacher's distributions over the
teacher's top 20 tokens (both renormalised there), each term capped at 0.05.

    trajectory : the first of the G completions that is correct (pass@G; none correct: nothing is trained)
    states x_t : the canvas before step t, for the steps of every block but the last while a position before the
                 first EOS is still masked (the reference's recorded trajectory)
    teacher    : x_t with a share `retain` of the positions from the next block on shown (the final tokens)
    L          = mean over prompts of (1 / #states) sum_t sum_{2 positions} sum_{top-20 tokens}
                 min(D(p_student || p_teacher), 0.05)        (D: reverse KL with beta 1, the scripts')

One step, in order (the loop is `dare.train.rl.run`; the hooks' contract is `dare.train.hooks`):
    rollout (G samples a prompt) -> rewards -> prepare (the chosen trajectory and its states) -> mu x sample_noise
    (update j's chunk of states and the teacher's view) -> reference_logps (the teacher, on its view)
    -> mu x [token_logps (the student) -> loss -> optimizer step]

Deviations (README.md): the G samples are drawn at once (the reference samples one at a time until one is correct);
the states' chunks and the teacher's shown positions come from the step's generator; full fine-tuning with a frozen
teacher (the reference: LoRA, the adapter-disabled base).
"""

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from dare.train import noise
from dare.train.estimators import check_masked_schedule, position_logits
from dare.train.objectives import group_advantages

RECIPE = "rl"
SCORE = "draw_vocab"  # (B, n, BL, V): the logits at each replayed state's current block


def check_config(cfg) -> None:
    check_masked_schedule(cfg, "d-OPSD's state replay")
    if cfg.rl.noise_draws != "per_update":
        raise ValueError("rl.noise_draws=once: d-OPSD's updates take the trajectory's states in turn (one draw each)")


def uses_reference(cfg) -> bool:
    return True  # the teacher


def uses_old_logps(cfg) -> bool:
    return False  # no ratio


def advantages(rewards: torch.Tensor, cfg) -> torch.Tensor:
    """(P, G): the group advantages, logged only (the loss is a distillation)."""
    return group_advantages(rewards, baseline="mean", std="none")


def steps_per_block(decoding) -> int:
    return decoding.steps // (decoding.gen_length // decoding.block_length)


def recorded_states(step_map: torch.Tensor, tokens: torch.Tensor, eos_id: int, decoding) -> torch.Tensor:
    """(B, steps) bool: the steps whose preceding state the reference's `generate` records: in every block but the
    last, while some position before the state's first EOS is still masked (no EOS yet: any masked position)."""
    B, G = step_map.shape
    t = torch.arange(decoding.steps, device=step_map.device)
    visible = (step_map[:, None, :] < t[None, :, None]) & (step_map[:, None, :] >= 0)  # (B, steps, G)
    pos = torch.arange(G, device=step_map.device)
    first = torch.where(visible & (tokens == eos_id)[:, None, :], pos, G).amin(dim=-1)  # (B, steps)
    open_before = (~visible & (pos < first[..., None])).any(dim=-1)
    last_block = decoding.gen_length // decoding.block_length - 1
    return open_before & (t // steps_per_block(decoding) < last_block)[None, :]


def prepare(batch, cfg):
    """extras "states" (B, steps) the chosen trajectory's recorded states (only the first correct row of each group),
    "eos_at" (B,) its first EOS; kept_groups: the groups with a correct completion."""
    if batch.block_size is not None:
        raise ValueError("d_opsd replays a masked model's states (LLaDA, Dream); block models decode per block")
    G = batch.group_size
    correct = (batch.rewards >= cfg.algo.solved_at).view(-1, G)
    has = correct.any(dim=1)
    chosen = torch.zeros_like(correct)
    chosen[torch.arange(correct.shape[0]), correct.int().argmax(dim=1)] = has
    states = recorded_states(batch.step_map, batch.responses, batch.eos_token_id, batch.decoding)
    L = batch.responses.shape[1]
    eos = batch.responses == batch.eos_token_id
    eos_at = torch.where(eos.any(dim=1), eos.int().argmax(dim=1), L)
    return replace(batch, extras={"states": states & chosen.view(-1, 1), "eos_at": eos_at}, kept_groups=has[:, None])


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """Update j's states (`batch.draw_index`): of each trajectory's recorded states, the j-th run of
    (#states - 1) // mu (the reference's `batch_divide` chunks); steps (B, n) (-1: padding), masked (B, n, P + G) the
    states, shown (B, n, P + G) the teacher's extra view: a share `retain` of the positions from the state's next block
    on, drawn uniformly, none when that block starts past the trajectory's first EOS."""
    a, mu, d = cfg.algo, cfg.rl.num_iterations, batch.decoding
    states = batch.extras["states"]
    T, device = states.shape[1], states.device
    size = ((states.sum(dim=1) - 1).clamp(min=0) // mu)[:, None]
    rank = states.cumsum(dim=1) - 1
    j = batch.draw_index
    pick = states & (rank >= j * size) & (rank < (j + 1) * size)
    n = max(1, int(pick.sum(dim=1).max()))  # one read a draw
    ordered = torch.where(pick, torch.arange(T, device=device), T).sort(dim=1).values[:, :n]
    steps = torch.where(ordered < T, ordered, -1)
    masked, _ = noise.step_states(batch.step_map, steps)  # (B, n, G)
    G = masked.shape[-1]
    start = (steps.clamp(min=0) // steps_per_block(d) + 1) * d.block_length  # the next block, in the completion
    pos = torch.arange(G, device=device)
    candidate = (pos >= start[..., None]) & ((start < batch.extras["eos_at"][:, None]) & (steps >= 0))[..., None]
    count = (candidate.sum(dim=-1).double() * a.retain).floor().long()
    u = torch.rand(masked.shape, generator=generator).to(device).masked_fill(~candidate, 2.0)
    shown = candidate & (u.argsort(dim=-1).argsort(dim=-1) < count[..., None])
    prompt = torch.zeros_like(masked[:, :, :1]).expand(-1, -1, batch.prompt_length)
    return noise.Draw(masked=torch.cat([prompt, masked], dim=2), steps=steps, shown=torch.cat([prompt, shown], dim=2))


def block_logits(model, batch, masked: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """(B, n, BL, V) float32 logits at the current block of each state (the block the state's step decodes), the
    input masked at `masked` (B, n, P + G)."""
    B, n, L = masked.shape
    x = torch.where(masked, batch.mask_token_id, batch.sequences[:, None, :]).reshape(B * n, L)
    d = batch.decoding
    lo = batch.prompt_length + d.block_length * (steps.clamp(min=0) // steps_per_block(d))
    at = (lo[..., None] + torch.arange(d.block_length, device=lo.device)).reshape(B * n, d.block_length)
    logits = position_logits(model, x, batch.attention_mask[:, None, :].expand(B, n, L).reshape(B * n, L), at)
    return logits.view(B, n, d.block_length, -1)


def token_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """The student: (B, n, BL, V) logits on the states themselves."""
    return block_logits(model, batch, draw.masked, draw.steps)


def reference_logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """The teacher: (B, n, BL, V) logits on the states with the shown positions filled with the final tokens."""
    return block_logits(model, batch, draw.masked & ~draw.shown, draw.steps)


def divergence(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """Elementwise terms of the generalized JSD between log-distributions (TRL's GKD form, the reference's
    `generalized_jsd_loss`): beta 0 KL(teacher || student), 1 KL(student || teacher), between: the mixture's."""
    if beta == 0:
        return F.kl_div(student, teacher, reduction="none", log_target=True)
    if beta == 1:
        return F.kl_div(teacher, student, reduction="none", log_target=True)
    mixture = torch.logsumexp(torch.stack([student + math.log1p(-beta), teacher + math.log(beta)]), dim=0)
    return beta * F.kl_div(mixture, teacher, reduction="none", log_target=True) \
        + (1 - beta) * F.kl_div(mixture, student, reduction="none", log_target=True)


def loss(logps, old_logps, ref_logps, batch, draw, cfg):
    a, P = cfg.algo, batch.prompt_length
    d = batch.decoding
    B, n, BL, V = logps.shape
    valid = draw.steps >= 0
    lo = d.block_length * (draw.steps.clamp(min=0) // steps_per_block(d))
    at = lo[..., None] + torch.arange(BL, device=lo.device)
    still = draw.masked[:, :, P:].gather(2, at)  # the block's positions masked in the state
    confidence = ref_logps.max(dim=-1).values.masked_fill(~still, -math.inf)  # the teacher's top logit
    top = confidence.topk(min(a.positions or max(d.gen_length // d.steps, 1), BL), dim=-1)
    picked = (top.values > -math.inf) & valid[..., None]  # (B, n, k)

    def at_picked(z):
        return z.gather(2, top.indices[..., None].expand(-1, -1, -1, V))

    teacher, student = at_picked(ref_logps), at_picked(logps)
    tokens = teacher.topk(min(a.top_k, V), dim=-1).indices
    teacher = teacher.gather(-1, tokens).log_softmax(dim=-1)
    student = student.gather(-1, tokens).log_softmax(dim=-1)
    terms = divergence(student, teacher, a.beta)
    clipped = (terms > a.token_clip) & picked[..., None]
    terms = terms.clamp(max=a.token_clip) * picked[..., None]
    states = valid.sum(dim=1).clamp(min=1)
    prompts = max(batch.num_sequences / batch.group_size, 1.0)
    loss = (terms.sum(dim=(1, 2, 3)) / states).sum() / prompts
    return loss, {"stats/states": float(valid.sum()) / prompts, "stats/clipped_terms": float(clipped.sum()) / prompts}
