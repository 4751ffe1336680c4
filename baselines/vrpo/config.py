"""VRPO defaults: LLaDA 1.5 (arXiv:2505.19223) §3 and Appendix D, unless noted."""

from dataclasses import dataclass, field

from dare.config import ADDED, DataConfig, TrainConfig, check, recipe


@dataclass
class VRPO:
    beta: float = 0.2
    """DPO temperature (App. D)."""
    n_t: int = 8
    """Monte Carlo budget per response: n_t timesteps with one mask each (n = n_t = 8, n_yt = 1; App. D)."""
    sft_weight: float = 0.05
    """Weight of the SFT loss on the chosen response, added for stability (App. D)."""
    eps: float = 1e-3
    """Smallest timestep, so 1/t stays finite (LLaDA's p = (1 - eps) t + eps floor)."""
    memory_bounded: bool = field(default=True, metadata=ADDED)
    """Backpropagate the policy's ELBO one timestep's mask at a time (`draw_parts`): peak memory flat in n_t,
    the same loss and gradient, one more forward per draw; false keeps all n_t graphs alive (the paper's code)."""

    def validate(self):
        check(self.beta > 0, "must be positive", "beta")
        check(self.n_t >= 1, "must be >= 1", "n_t")
        check(self.sft_weight >= 0, "must be >= 0", "sft_weight")
        check(0 < self.eps < 1, "must be within (0, 1)", "eps")


# The paper starts from LLaDA-8B-Instruct, which is also the frozen reference: set model.path.
Config = recipe(
    VRPO,
    data=DataConfig(task="ultrafeedback"),
    # batch 64; AdamW weight decay 0.01, betas (0.9, 0.95); peak lr 5e-7 after 15 warmup steps, then
    # cosine (App. D). One epoch of 350K pairs = ~5,470 steps at batch 64.
    train=TrainConfig(
        steps=5470, batch_size=64, lr=5e-7, weight_decay=0.01, betas=(0.9, 0.95), warmup_steps=15,
        schedule="cosine"))
