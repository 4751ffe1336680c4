"""GDSD defaults: the reference (`GaryBall/GDSD@3fb6780`): `scripts/train_gdsd.yaml` (the base config every
launch script reads) with the GSM8K recipe's overrides (`scripts/run_gdsd_llada_gsm8k.sh`, LLaDA-8B-Instruct,
8 GPUs), unless noted. The Sudoku and Countdown demo scripts run the base config alone (psi 1, num_mc 1,
G = 6, 64 diffusion steps)."""

from dataclasses import dataclass
from typing import Literal

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class GDSD:
    psi: float = 10.0
    """Guidance scale of the advantage-guided teacher: the regression target of the length-normalised log-ratio is
    psi x A (`--psi 10.0` in the GSM8K and MATH scripts; `psi: 1.0` in train_gdsd.yaml and configs.py)."""
    beta: float = 1e-3
    """k2 KL coefficient against the reference, on the per-pair scores, divided by the generation length
    (`--beta 1e-3` GSM8K, 1e-4 MATH; `beta: 0.001` in train_gdsd.yaml)."""
    epsilon: float = 4e-4
    """The log-ratio is clamped to [log(1 - epsilon), log(1 + epsilon)] before the regression (`epsilon: 0.0004`
    in train_gdsd.yaml; TRL's `epsilon_high` defaults to `epsilon`). Outside it a completion gets no gradient."""
    num_mc: int = 2
    """Coupled mask pairs per completion and update (`--num_mc 2` GSM8K and MATH; `num_mc: 1` in the yaml): each
    pair is one term of the regression, summed (not averaged) over the pairs as the reference does."""
    variant: Literal["gdsd", "tlc"] = "gdsd"
    """`gdsd` (`--rl_loss_type gdsd`, gdsd_trainer_batchll.py): a pair's score is half the sum of the log-probs of
    the completion's tokens, each predicted in the one mask of the pair that hides it (no 1/t weights).
    `tlc` (`gdsd_tlc`, gdsd_trainer_tlc.py, the Dream Countdown recipe and the released checkpoints): each half
    weighted (L+1)/x and (L+1)/(L-x) (ESPO's coupled ELBO), with the logits centred (a no-op: README)."""
    scale_rewards: bool = False
    """Divide the leave-one-out advantages by the group's std + 1e-4 (`scale_rewards: false` in the yaml)."""

    def validate(self):
        check(self.psi >= 0, "must be >= 0", "psi")
        check(self.beta >= 0, "must be >= 0", "beta")
        check(self.epsilon > 0, "must be > 0", "epsilon")
        check(self.num_mc >= 1, "must be >= 1", "num_mc")
        check(self.variant in ("gdsd", "tlc"), "must be 'gdsd' or 'tlc'", "variant")


# The reference trains LoRA r 128 / alpha 64 / dropout 0.05 on a bfloat16 LLaDA-8B-Instruct
# (train_gdsd.yaml): set model.path and model.lora.*.
Config = recipe(
    GDSD,
    # AdamW (0.9, 0.99), weight decay 0.01, grad-norm clip 0.2, lr 3e-6 constant with warmup ratio 0.001; one epoch
    # of GSM8K's 7,473 problems at 20 prompts per rollout: 374 rollout batches of mu = 8 optimizer steps. A frozen
    # reference: the yaml's `sync_ref_model` is a no-op under its PEFT (TRL's SyncRefModelCallback skips a None
    # ref_model; the reference is the adapter-disabled base).
    train=TrainConfig(steps=374, lr=3e-6, weight_decay=0.01, betas=(0.9, 0.99), max_grad_norm=0.2, warmup_ratio=0.001),
    # 8 GPUs x 10 completions x grad-acc 4 = 320 completions = 20 prompts x G = 16 (num_generations = 2 x world
    # size) per rollout, mu = 8; rollouts of 256 tokens, LLaDA's block 32 (fixed in the trainer), 256 steps,
    # temperature 1.0 (train_gdsd.yaml's generation_temperature).
    rl=RLConfig(
        prompts_per_step=20, group_size=16, num_iterations=8,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=256, temperature=1.0)))
