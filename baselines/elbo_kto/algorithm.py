"""ELBO-KTO (Jindal et al., "Aligning Diffusion Language Models via Unpaired Preference Optimization",
arXiv:2510.23658; reference code `vaibhavjindal/elbo-kto` @80dc31e, `train.py` `ELBOKTOTrainer`,
`precompute_bref.py`; the repository has no license: ported from the paper and the code's equations, its outputs
pinned in tests/test_elbo_kto.py).

KTO (Kahneman-Tversky Optimization) on unpaired examples, each a prompt, one response and a label (desirable or
not), with the ELBO in place of the intractable log-likelihood of a masked diffusion model:

    B(y)  = 1/K sum_k (|y| / l_k) sum_{i masked in draw k} log pi(y^i | y_(k), x)   (l_k ~ U{1..|y|}, exactly
                                                                                  l_k response tokens masked)
    r     = B_theta(y) - B_ref(y)                        (the same K masks for the policy and the reference)
    z0    = mean of r over the batch, detached           (the reference point; "global_mean")
    s     = beta (r - z0)
    v     = lambda_D sigmoid(s) if desirable, lambda_U sigmoid(-s) if not
    L     = mean over the examples of (lambda_y - v)

The unpaired examples come from a preference task with `data.unpaired` (each pair -> its chosen response,
desirable, and its rejected one, undesirable: `dare.train.preference.unpaired`), as kto-mix-14k is built.

One step, in order (the loop is `dare.train.preference.run`; the hooks' contract is `dare.train.hooks`):
    batch of unpaired examples -> sample_noise (K fixed-l masks per response) -> ref logps (no grad)
    -> policy logps -> loss (z0 over the micro-batch) -> optimizer step

Deviations (README.md): the masks are drawn each step from the run's generator (the reference fixes them per
example before training, `precompute_bref.py`, and reads B_ref from that file); the response's EOS is scored with
it and padding is hidden (the reference scores the completion tokens only and attends EOS padding to 4096); z0 is
the mean over this process's micro-batch.
"""

import torch

from dare.train import noise
from dare.train.estimators import elbo

RECIPE = "preference"


def check_config(cfg) -> None:
    if not cfg.data.unpaired:
        raise ValueError("ELBO-KTO trains on unpaired examples: set data.unpaired=true (each pair of the preference "
                         "task becomes a desirable and an undesirable example)")


def sample_noise(batch, generator: torch.Generator, cfg) -> noise.Draw:
    """Per example, K draws of l ~ U{1..|y|} (each on its own), exactly l response tokens masked, weight |y| / l.
    masked: (B, K, L); t, weight: (B, K)."""
    return noise.elbo_draws(batch.response_mask[:, 0], cfg.algo.n_mc, generator, "count", stratified=False)


def logps(model, batch, draw: noise.Draw, cfg) -> torch.Tensor:
    """The ELBO estimate B(y) of each example's response. (B, 1)"""
    ids, attn = batch.input_ids[:, 0], batch.attention_mask[:, 0]
    return elbo(model, ids, attn, batch.response_mask[:, 0], draw, compute=batch.compute)[:, None]


def loss(policy, reference, batch, draw, cfg):
    """policy, reference: (B, 1) ELBOs; normalized by the step's examples (`batch.num_pairs`)."""
    a = cfg.algo
    r = (policy - reference)[:, 0]
    z0 = r.detach().mean() if a.z0 == "batch_mean" else torch.zeros((), device=r.device)
    s = a.beta * (r - z0)
    good = batch.labels == 1
    lam = torch.where(good, a.lambda_d, a.lambda_u)
    v = torch.where(good, a.lambda_d * torch.sigmoid(s), a.lambda_u * torch.sigmoid(-s))
    n = batch.num_pairs
    return (lam - v).sum() / n, {
        "loss/kto": (lam - v).sum().item() / n,
        "rewards/r": r.detach().sum().item() / n, "rewards/z0": z0.item(),
        "rewards/desirable_above_z0": ((s > 0) == good).float().sum().item() / n}
