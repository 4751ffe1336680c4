"""DMPO defaults: yuchen-zhu-zyc/DMPO @96af1a4, `DMPO/run_dmpo.sh` over `DMPO/dmpo_train_config.yaml` and
`DMPO/DMPO_config.py` (LLaDA-8B-Instruct, GSM8K), unless noted."""

from dataclasses import dataclass

from dare.config import DecodingConfig, RLConfig, TrainConfig, check, recipe


@dataclass
class DMPO:
    loss: str = "wdce"
    """wdce: weighted denoising cross-entropy (the paper's and run_dmpo.sh's); ddo: the DDO-style objective the
    reference also implements (`ddo_alpha`, `ddo_beta`, independent halves)."""
    alpha: float = 0.04
    """Temperature of the target p_ref exp(r / alpha) (run_dmpo.sh --alpha)."""
    coeff: float = 1.0
    """The weights' step size: softmax(coeff (log_rnd + r / alpha)) over the group (1: the target itself)."""
    centering: float = 1.0
    """The weight baseline: the negative weights softmax(coeff (log_rnd - r / alpha)) times this are subtracted
    (run_dmpo.sh: advantage_centering_neg, centering_strength 1); 0: no baseline."""
    replicates: int = 4
    """Masks per completion, antithetic pairs (a mask and its complement), for the loss and the ELBOs of log_rnd
    (num_replicates = compute_ref_log_prob_elbo_size = 4)."""
    ddo_alpha: float = 1.0
    """ddo: weight of the fake-sample term (ddo_alpha)."""
    ddo_beta: float = 1.0
    """ddo: scale of the ELBO gaps inside the log-sigmoids (ddo_beta)."""

    def validate(self):
        check(self.loss in ("wdce", "ddo"), "must be wdce or ddo", "loss")
        check(self.alpha > 0, "must be > 0 (the target p_ref exp(r / alpha))", "alpha")
        check(self.coeff > 0, "must be > 0", "coeff")
        check(self.centering >= 0, "must be >= 0", "centering")
        check(self.replicates >= 2 and self.replicates % 2 == 0, "must be an even number >= 2 (antithetic pairs)",
              "replicates")
        check(self.ddo_beta > 0, "must be > 0", "ddo_beta")


# The paper starts from LLaDA-8B-Instruct: set model.path.
Config = recipe(
    DMPO,
    # AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, lr 1e-6 constant (dmpo_train_config.yaml).
    train=TrainConfig(steps=1000, lr=1e-6, weight_decay=0.1, betas=(0.9, 0.99), max_grad_norm=0.2),
    # G = 16 completions a prompt; 8 processes x 4 completions x accumulation 2 = 64 completions = 4 prompts a
    # rollout batch, reused for mu = 8 optimizer steps. Rollout: 256 tokens, block 32, 128 steps, temperature 0.2,
    # Fast-dLLM's prefix cache (run_dmpo.sh: sampler pd_cache_prefix, no threshold).
    rl=RLConfig(
        prompts_per_step=4, group_size=16, num_iterations=8,
        decoding=DecodingConfig(gen_length=256, block_length=32, steps=128, temperature=0.2,
                                masked={"cache": "prefix"})))
