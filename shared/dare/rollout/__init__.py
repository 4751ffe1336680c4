"""The rollout engine: one interface that RL, evaluation and benchmarks all share.

    out = generate(model, prompt_ids, prompt_mask, params, generator)

`prompt_ids` are left-padded (B, P) with `prompt_mask` marking real tokens; padded positions are
never attended, so at temperature 0 a row decodes exactly as it would alone (sampled decoding
draws its noise for the whole batch from one generator). `params` is a `DecodingConfig`.
The output carries the token ids, the response mask (up to and including the first EOS), the
number of forward passes (NFE) and, per generated position, the step that committed it.
"""

from dare.rollout.core import RolloutOutput, decode_responses, left_pad, response_mask
from dare.rollout.llada import generate

__all__ = ["RolloutOutput", "generate", "left_pad", "response_mask", "decode_responses"]
