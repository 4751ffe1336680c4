"""RLDF defaults: the Drift reference (`ant-research/Drift@7abd99b`): `configs/llada_math.yaml` (LLaDA-8B-Instruct,
MATH), `configs/dream_math.yaml` and `configs/default.yaml` (Dream-7B-Instruct), the defaults read in
`trainer/main_rl.py` and `accelerate_configs/dp_zero3.json`, unless noted. Where the LLaDA and Dream configs differ
(KL coefficient, weight decay, loss normalisation) the default is the LLaDA one and the Dream value is named."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class RLDF:
    num_states: int = 4
    """Noisy states replayed per completion (`training.mask_num`, `sequential_masking`): decoding steps of the
    rollout's own trajectory, each giving the state just before it (the tokens it and every later step committed
    masked)."""
    step_temperature: float = 1.0
    """`training.sample_temperature`: steps are drawn with probabilities softmax(w / T), w = the mean surprisal
    -log p of the tokens the step committed (p at the commit, from the rollout); T >= 1e4 (or inf) uniform, 0 the
    top `num_states`."""
    low_prob_threshold: float = 0.6
    """`training.low_prob_threshold` (the configs' 0.6; the trainer's fallback 0.2): a masked token is trained on
    only where the policy (mu = 1) or the old policy (mu > 1) already predicts it with p >= this from the noisy
    state, plus the tokens the replayed step itself committed (always kept). 0: every masked token."""
    beta: float = 0.01
    """k3 KL to the reference model per token (`training.beta`, `kl_type: k3`; Dream's config: 0.04)."""
    eps_low: float = 0.2
    eps_high: float = 0.2
    """PPO's token clip when mu > 1 (`epsilon_low`, `epsilon_high`); mu = 1 is REINFORCE (-A log p)."""
    keep_groups: float = 0.5
    """The share of each process's groups trained on (`training.batch_size_lm` 4 of `rollout.batch_size` 8 prompts
    per GPU, `filter_rollout_samples`): groups whose rewards differ first, then all-correct ones, then all-wrong
    ones with the most decoding steps. 1: every group."""

    def validate(self):
        check(self.num_states >= 1, "must be >= 1", "num_states")
        check(self.step_temperature >= 0, "must be >= 0 (0: the top steps; >= 1e4: uniform)", "step_temperature")
        check(0 <= self.low_prob_threshold < 1, "must be within [0, 1)", "low_prob_threshold")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(0 <= self.eps_low < 1 and self.eps_high >= 0, "need 0 <= eps_low < 1 and eps_high >= 0", "eps_low",
              "eps_high")
        check(0 < self.keep_groups <= 1, "must be within (0, 1]", "keep_groups")


# The reference fine-tunes every weight of LLaDA-8B-Instruct / Dream-7B-Instruct in bfloat16 (ZeRO-3).
Config = recipe(
    RLDF,
    # AdamW lr 1e-6 constant, no warmup, betas (0.9, 0.999), eps 1e-8, weight decay 0 (LLaDA; Dream 0.01), gradient
    # clipping 1.0 (dp_zero3.json). Steps: 64 epochs of MATH_rldf's 6,106 prompts at 8 GPUs x 8 prompts = 95 batches
    # per epoch, 6,080 (the reference evaluates every 5 and keeps the best checkpoint).
    train=TrainConfig(steps=6080, lr=1e-6, weight_decay=0.0, betas=(0.9, 0.999), max_grad_norm=1.0),
    # 8 GPUs x 8 prompts (`rollout.batch_size`) x G = 4 (`num_generations`), mu = 1 (`num_iterations`). Rollout:
    # 256 tokens, block 32, 256 steps, temperature 1.0, low-confidence remasking with the dynamic threshold 0.9.
    rl=RLConfig(
        prompts_per_step=64, group_size=4, num_iterations=1,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=256, temperature=1.0)))
