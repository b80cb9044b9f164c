"""Completion orders of parallel calls: which siblings have returned or been recorded when a crash fires.

Under the harness, the parallel calls of one assistant message pass from return to record one at a time, in an
order the harness chooses (the runtime's ``set_completion_order``). Order 0 is the seeded one every cell has
always used. ``--crash-orders=N`` runs each hit under N orders (0, then N-1 more drawn by seed);
``--crash-orders=all`` under every permutation of each batch (for the widest batch of the test's clean run, up
to 4 calls: 24 orders), so that every subset of siblings is, in some cell, exactly the set that had returned or
been recorded when the crash fired. ``--crash-order=K`` runs order K only (the repro of one cell).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

ALL_UP_TO = 4  # "all" enumerates every permutation of batches up to this many calls (4! = 24 orders)


@dataclass(frozen=True)
class Orders:
    count: int | None = 1  # None: all
    only: int | None = None  # --crash-order

    @classmethod
    def parse(cls, count: str | None, only: str | None) -> Orders:
        from pytest_replaysafe.matrix import parse_number

        parsed: int | None = 1
        if count is not None and count.strip().lower() == "all":
            parsed = None
        elif count is not None:
            parsed = parse_number(count, "--crash-orders", 1, "a number of orders (1 or more) or 'all'")
        chosen = None if only is None else parse_number(only, "--crash-order", 0, "an order number (0 or more)")
        return cls(parsed, chosen)

    def variants(self, widest: int) -> list[int]:
        """The orders to run for a test whose clean run's widest parallel batch had *widest* calls."""
        if self.only is not None:
            return [self.only]
        if widest < 2:
            return [0]  # nothing runs in parallel: one order is all there is
        total = math.factorial(min(widest, ALL_UP_TO)) if self.count is None else self.count
        return list(range(total))

    def flag(self, variant: int) -> str:
        """What a repro line adds to run *variant* again."""
        if self.count == 1 and variant == 0:
            return ""
        spec = "all" if self.count is None else str(self.count)
        return f" --crash-orders={spec} --crash-order={variant}"

    def pick(self, indices: list[int], variant: int, rng: random.Random) -> list[int]:
        """One batch's order: with ``all``, the variant-th permutation (in sorted order) of a batch of up to 4
        calls; else the seeded shuffle for order 0, another seeded shuffle for each further order."""
        order = list(indices)
        if self.count is None and len(order) <= ALL_UP_TO:
            permutations = sorted(itertools.permutations(order))
            return list(permutations[variant % len(permutations)])
        if variant == 0:
            rng.shuffle(order)
        else:
            random.Random(f"{rng.random()}:{variant}").shuffle(order)
        return order
