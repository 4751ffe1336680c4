"""TraceRL defaults: `dLLM-RL:configs/rl_sdar.yaml` (SDAR / TraDo, MATH) and `reward/rl_reward.py`,
unless noted."""

from dataclasses import dataclass, field

from dare.config import (ADDED, BlockOptions, DecodingConfig, MaskedOptions, ModelConfig, RLConfig, TrainConfig,
                         check, recipe)


@dataclass
class TraceRL:
    shrink: int = 1
    """s: consecutive decoding steps aggregated into one trace step (rl_sdar.yaml 1; rl_llada.yaml 8)."""
    epsilon: float = 0.2
    """PPO clip range (training.eps)."""
    beta: float = 0.01
    """k3 KL coefficient, against pi_old (training.beta)."""
    filter_low: float = 0.2
    filter_high: float = 0.8
    """Groups whose accuracy lies outside [filter_low, filter_high] get no advantage (rl_reward.py drops them)."""
    # Added after the first results: hashed only when set (dare.config.ADDED), so earlier runs keep their keys.
    value_model: bool = field(default=False, metadata=ADDED)
    """Train the diffusion value model and use its token-level advantages (configs/rl_sdar_with_value.yaml;
    rl_sdar.yaml, the default, has none: group z-scores only)."""
    value_model_path: str = field(default="", metadata=ADDED)
    """The value model's starting checkpoint (model.value_base_model); empty: the policy's model.path."""
    value_lr: float = field(default=5e-6, metadata=ADDED)
    """The value model's learning rate (optimizer.params.value_learning_rate), constant like the policy's."""
    gamma: float = field(default=1.0, metadata=ADDED)
    lam: float = field(default=1.0, metadata=ADDED)
    """Step-level GAE over the trace steps (training.gam, training.lam)."""
    value_clip: float = field(default=0.2, metadata=ADDED)
    """Clip of the value update around the values before it (train_sdar_value.py uses training.eps)."""
    micro_batch_rows: int = field(default=0, metadata=ADDED)
    """Masked models: how the step's trace rows are weighted. 0: equally, the mean over the rows (ours). b >= 1:
    as rl_llada.py / rl_dream.py weight them, the rows in their order cut into micro-batches of b rows
    (training.batch_size_lm, 2 in rl_llada.yaml), each micro-batch's mean, then the mean over the micro-batches,
    so the rows of a partial last micro-batch weigh more (README, deviations)."""

    def validate(self):
        check(self.shrink >= 1, "must be >= 1", "shrink")
        check(self.epsilon > 0, "must be > 0", "epsilon")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(0 <= self.filter_low <= self.filter_high <= 1, "need 0 <= filter_low <= filter_high <= 1",
              "filter_low", "filter_high")
        check(self.value_lr > 0, "must be > 0", "value_lr")
        check(0 <= self.gamma <= 1, "must be in [0, 1]", "gamma")
        check(0 <= self.lam <= 1, "must be in [0, 1]", "lam")
        check(self.value_clip > 0, "must be > 0", "value_clip")
        check(self.micro_batch_rows >= 0, "must be >= 0 (0: every trace row weighs the same)", "micro_batch_rows")


Config = recipe(
    TraceRL,
    # The paper starts from SDAR-4B/8B-Chat (TraDo): set model.path.
    model=ModelConfig(family="sdar"),
    # AdamW (0.9, 0.999), weight decay 0, grad-norm clip 1, lr 1e-6 (cosine with min_lr_scale 1.0:
    # constant), 80 steps.
    train=TrainConfig(steps=80, lr=1e-6, weight_decay=0.0, betas=(0.9, 0.999), max_grad_norm=1.0),
    # 64 tasks x 16 responses per step; rollout: temperature 1.0, 2000 tokens, the model's block (4),
    # 4 denoising steps per block, dynamic low-confidence threshold 0.9.
    rl=RLConfig(
        prompts_per_step=64, group_size=16, num_iterations=1,
        decoding=DecodingConfig(gen_length=2000, steps=4, temperature=1.0,  # auto: masked or block, 0.9 either way
                                masked=MaskedOptions(threshold=0.9), block=BlockOptions(threshold=0.9))))
