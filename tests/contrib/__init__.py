"""Algorithms that exist only for the tests: written as a contributor would write a baseline, from
the hook contract (`dare.train.hooks`) alone, without touching `shared/`."""
