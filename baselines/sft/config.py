"""SFT defaults: the LLaDA SFT recipe (LLaDA paper §2.3 and App. B.1; `LLaDA:GUIDELINES.md`)."""

from dataclasses import dataclass

from dare.config import TrainConfig, check, recipe


@dataclass
class SFT:
    eps: float = 1e-3
    """Masking probability p = (1 - eps) * t + eps with t ~ U(0, 1) (GUIDELINES.md)."""
    response_length: int | None = None
    """Pad every response with EOS to this many tokens (None: to the longest response in the batch
    plus one EOS, LLaDA's per-batch padding)."""
    max_length: int | None = None
    """Cut prompt + response to this many tokens from the right (None: no limit)."""

    def validate(self):
        check(0 < self.eps < 1, "must be within (0, 1)", "eps")
        check(self.max_length is None or self.max_length > 0, "must be > 0 or null", "max_length")
        check(self.response_length is None or self.response_length > 1, "must be > 1 or null", "response_length")


Config = recipe(
    SFT,
    # LLaDA-8B SFT: lr 2.5e-5 after a 50-step linear warmup, weight decay 0.1 (LLaDA App. B.1).
    # The paper then holds the lr and decays it linearly to 2.5e-6 over the final 10%; we hold it
    # (schedule `constant`); `train.schedule=linear train.min_lr_ratio=0.1` decays over the whole run.
    train=TrainConfig(lr=2.5e-5, weight_decay=0.1, warmup_steps=50))
