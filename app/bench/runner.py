"""The order benchmarks run in: every prompt, every repeat, every variant once per round.

Rotated (the default), the variant that runs first moves on by one each round, so caches, frequency scaling and
neighbours' load hit all variants alike; unrotated, `ar` first, for benches whose other runs are measured against
the `ar` run of their round as they go.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Iterator, Sequence, TypeVar

V = TypeVar("V")


def rotated(variants: Sequence[V], shift: int) -> list[tuple[int, V]]:
    """(original index, variant) in the order of this round."""
    n = len(variants)
    return [(i % n, variants[i % n]) for i in range(shift % n, shift % n + n)]


@dataclass(frozen=True)
class Round:
    index: int  # the prompt's position
    prompt: object
    repeat: int
    order: list  # the variants, in the order they run this round
    last: bool  # the prompt's last repeat: per-prompt checks after its rounds go here


def rounds(prompts: Sequence, variants: Sequence, repeats: int, rotate: bool = True) -> Iterator[Round]:
    """Prompt by prompt, `repeats` rounds each; round r of prompt i runs the variants rotated by i * repeats + r."""
    for index, prompt in enumerate(prompts):
        for repeat in range(repeats):
            order = [v for _, v in rotated(variants, index * repeats + repeat)] if rotate else list(variants)
            yield Round(index, prompt, repeat, order, repeat == repeats - 1)


def progress(total: int, description: str | None = None):
    """A progress bar on stderr (stdout stays free for --json)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=description, file=sys.stderr, unit="run", dynamic_ncols=True)
