"""Reward functions and answer parsers: one implementation per task (DESIGN rule 4).

Every reward takes the decoded completion text (special tokens removed, cut at the first EOS)
and the example's ground truth, and returns a float. A change to a parser or reward must bump
`VERSION` in its module; the task version recorded in every result includes it.
"""

from dare.rewards import arithmetic

__all__ = ["arithmetic"]
