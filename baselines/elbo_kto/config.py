"""ELBO-KTO defaults: `elbo-kto:README.md` (its training command) and `train.py`'s arguments, unless noted."""

from dataclasses import dataclass
from typing import Literal

from dare.config import DataConfig, TrainConfig, check, recipe


@dataclass
class ELBOKTO:
    beta: float = 0.1
    """KTO's beta on r - z0 (the README's command: --kto_beta 0.1; train.py's default is 0.2)."""
    n_mc: int = 8
    """K: fixed-l masks per response for B(y) (--n_mc_samples 8)."""
    lambda_d: float = 1.0
    """Weight of the desirable examples (--kto_lambda_D)."""
    lambda_u: float = 1.0
    """Weight of the undesirable examples (--kto_lambda_U)."""
    z0: Literal["batch_mean", "zero"] = "batch_mean"
    """The reference point: the mean of r over the batch, detached (--z0_mode global_mean), or 0."""

    def validate(self):
        check(self.beta > 0, "must be > 0", "beta")
        check(self.n_mc >= 1, "must be >= 1", "n_mc")
        check(self.lambda_d > 0 and self.lambda_u > 0, "must be > 0", "lambda_d", "lambda_u")


# The paper starts from LLaDA-8B-Instruct on trl-lib/kto-mix-14k: set model.path and a preference task.
Config = recipe(
    ELBOKTO,
    data=DataConfig(task="addition_pairs", unpaired=True),
    # lr 1e-6 with 3% warmup (the README's command) then cosine to 0, AdamW (0.9, 0.95), weight decay 0.01, grad-norm
    # clip 1.0 (train.py; HF's default); 8 GPUs x 1 example: 8 a step; one epoch (train.steps = examples / 8).
    train=TrainConfig(batch_size=8, lr=1e-6, weight_decay=0.01, betas=(0.9, 0.95), warmup_ratio=0.03,
                      schedule="cosine"))
