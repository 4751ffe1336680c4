"""The rows each training step takes: epochs of a seeded permutation, resumable exactly."""

from __future__ import annotations

import torch


class EpochSampler:
    """Draws example indices without replacement, reshuffling each epoch with its own generator."""

    def __init__(self, n: int, generator: torch.Generator):
        if n <= 0:
            raise ValueError("cannot sample from an empty split")
        self.n, self.generator = n, generator
        self.perm: list[int] = []
        self.pos, self.epoch = 0, 0

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos >= len(self.perm):
                self.perm = torch.randperm(self.n, generator=self.generator).tolist()
                self.pos = 0
                self.epoch += 1
            take = min(k - len(out), len(self.perm) - self.pos)
            out += self.perm[self.pos:self.pos + take]
            self.pos += take
        return out

    def state_dict(self) -> dict:
        return {"perm": self.perm, "pos": self.pos, "epoch": self.epoch, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.perm, self.pos, self.epoch = state["perm"], state["pos"], state["epoch"]
        self.generator.set_state(state["generator"])
