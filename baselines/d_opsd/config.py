"""d-OPSD defaults: xingzhejun/d-OPSD @1b55cf3, `d-opsd/run/*/opsd.sh` over `d-opsd/opsd.yaml` and
`d-opsd/d_opsd_config.py` (LLaDA-8B-Instruct), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class DOPSD:
    solved_at: float = 1.0
    """A completion is correct when its reward reaches this (the task's full reward); each prompt trains on its first
    correct completion of the G sampled (pass@k, k = rl.group_size: the scripts' PASSK 8)."""
    retain: float = 0.25
    """The share of the positions from the next block on that the teacher sees with the completion's own final
    tokens, drawn per state (TEACHER_RETAIN_RATIO)."""
    positions: int = 0
    """The masked positions of a state's current block distilled, those the teacher is most confident about; 0: the
    tokens a step commits, gen_length / steps (the reference fixes 2, its sampler's two tokens a step)."""
    top_k: int = 20
    """The divergence runs over the teacher's top-k tokens, both distributions renormalised there (TOP_K_LOSS)."""
    beta: float = 1.0
    """The divergence: 0 forward KL(teacher || student), 1 reverse KL(student || teacher), between: the generalized
    JSD with mixture weight beta (BETA 1 in every script)."""
    token_clip: float = 0.05
    """Each (position, token) term of the divergence is capped here (JSD_TOKEN_CLIP)."""

    def validate(self):
        check(0 <= self.retain <= 1, "must be within [0, 1]", "retain")
        check(self.positions >= 0, "must be >= 0 (0: the tokens a step commits)", "positions")
        check(self.top_k >= 1, "must be >= 1", "top_k")
        check(0 <= self.beta <= 1, "must be within [0, 1]", "beta")
        check(self.token_clip > 0, "must be > 0", "token_clip")


# The paper starts from LLaDA-8B-Instruct: set model.path. The teacher is the frozen start (fixed_teacher).
Config = recipe(
    DOPSD,
    # AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, lr 5e-6 constant (opsd.yaml).
    train=TrainConfig(steps=1000, lr=5e-6, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # 8 processes x one prompt a step, up to 8 samples each (pass@8 at temperature 0.9); the chosen trajectory's
    # states split over mu = BATCH_DIVIDE = 4 updates. Rollout: 256 tokens, block 32, 128 steps.
    rl=RLConfig(
        prompts_per_step=8, group_size=8, num_iterations=4,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=128, temperature=0.9)))
