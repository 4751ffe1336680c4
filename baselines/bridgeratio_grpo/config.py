"""BridgeRatio-GRPO defaults: DARE's pull request #21 (yjyddq/DARE@6d4791f: `recipe/llada/
run_bridgeratio_grpo_llada_8b_instruct.sh`, which runs the coupled-GRPO recipe with `--algorithm
bridgeratio-grpo`, `bridge_ratio_correction=none`, `bridge_ratio_score_scale=token`; the actor's options
`llada_dp_actor_bridgeratio_grpo.py`; verl's `ppo_trainer.yaml` for what the recipe leaves at its default),
LLaDA-8B-Instruct on math, unless noted. There is no paper."""

from dataclasses import dataclass
from typing import Literal

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class BridgeRatioGRPO:
    t_min: float = 0.2
    t_max: float = 0.8
    """The coupled pair's mask ratio t ~ U(t_min, t_max) (`_forward_process_coupled_grpo`, reused by the PR)."""
    correction: Literal["none", "delta", "jackknife", "cumulant"] = "none"
    """Bias correction of the log path-sum ratio (`bridge_ratio_correction`; the recipe: none)."""
    detach_correction: bool = True
    """Stop the gradient through the delta term / the cumulant's path weights (`bridge_ratio_detach_correction`)."""
    score_scale: Literal["token", "valid_tokens", "sequence"] = "token"
    """A path's log-weight: its weighted log-prob sum divided by the padded completion length (token, the
    recipe's), that times the completion's loss tokens (valid_tokens), or the sum (sequence)
    (`bridge_ratio_score_scale`)."""
    ratio_log_clip: float | None = None
    """Clamp |log rho| to this before exp (`bridge_ratio_log_clip`; none by default)."""
    eps_low: float = 0.2
    eps_high: float = 0.2
    """PPO clip range (verl's clip_ratio_low / clip_ratio_high)."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (verl's clip_ratio_c)."""

    def validate(self):
        check(0 < self.t_min <= self.t_max < 1, "need 0 < t_min <= t_max < 1", "t_min", "t_max")
        check(self.ratio_log_clip is None or self.ratio_log_clip > 0, "must be > 0 (or null)", "ratio_log_clip")
        check(0 < self.eps_low < 1, "must be within (0, 1)", "eps_low")
        check(self.eps_high > 0, "must be > 0", "eps_high")
        check(self.clip_ratio_c > 1, "the dual clip needs c > 1", "clip_ratio_c")


# The recipe starts from LLaDA-8B-Instruct (or Dream-7B-Instruct: recipe/dream/): set model.path.
Config = recipe(
    BridgeRatioGRPO,
    # lr 5e-7 constant, weight decay 0.01 (the recipe), AdamW (0.9, 0.999) and grad-norm 1.0 (verl's defaults).
    # One epoch of the recipe's math data (MATH 7,500 + GSM8K 7,473 train prompts) at 16 prompts: 936 steps.
    train=TrainConfig(steps=936, lr=5e-7, weight_decay=0.01, betas=(0.9, 0.999), max_grad_norm=1.0),
    # 16 prompts x G = 8, one update per batch (ppo_mini_batch_size = the batch, ppo_epochs 1); math rollouts of 512
    # tokens, block 32, 256 steps, temperature 0.6 (LLaDA; Dream's recipe: 0.2).
    rl=RLConfig(
        prompts_per_step=16, group_size=8, num_iterations=1,
        decoding=DecodingConfig(gen_length=512, block_length=32, steps=256, temperature=0.6)))
