"""A run killed in the middle of a step, for the resume tests of the trainers that call a reference model."""

from __future__ import annotations

from collections.abc import Callable


class Interrupted(Exception):
    pass


def dies_at_call(reference: Callable, n: int) -> Callable:
    """The reference, raising `Interrupted` at its n-th call: a run killed in the middle of a step."""
    calls = []

    def call(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise Interrupted
        return reference(*args, **kwargs)
    return call
