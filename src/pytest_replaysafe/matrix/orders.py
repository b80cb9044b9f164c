"""Completion orders of parallel calls: which siblings have returned or been recorded when a crash fires, and
which return together.

Under the harness, the parallel calls of one assistant message pass from return to record in an order the harness
chooses (the runtime's ``set_completion_order``), one at a time or a group at a time: the calls of a group return
at the same moment and are recorded in one group commit, as siblings that return together in production are.
Order 0 is the seeded single-file one every cell has always used; order 1 (:data:`TOGETHER`) lets every call of a
batch return together (one record group of the batch's size). A default run uses both for a test whose clean run
had parallel calls (``--crash-orders=2``); ``--crash-orders=N`` adds N-2 seeded groupings (the batch shuffled and
cut into groups at seeded places); ``--crash-orders=1`` keeps order 0 only; ``--crash-orders=all`` runs every
permutation of each batch (for the widest batch of the test's clean run, up to 4 calls: 24 orders), so that every
subset of siblings is, in some cell, exactly the set that had returned or been recorded when the crash fired, and
order 1 too. ``--crash-order=K`` runs order K only (the repro of one cell).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

ALL_UP_TO = 4  # "all" enumerates every permutation of batches up to this many calls (4! = 24 orders)
#: The order in which every call of a batch returns together: one group commit of the whole batch.
TOGETHER = 1
#: Orders per hit of a test with parallel calls unless --crash-orders says otherwise: single file, and together.
DEFAULT_ORDERS = 2

Groups = list[list[int]]
"""A batch's completion order: groups of call indices, each group passing (returning, then recorded) together."""


@dataclass(frozen=True)
class Orders:
    count: int | None = DEFAULT_ORDERS  # None: all
    only: int | None = None  # --crash-order

    @classmethod
    def parse(cls, count: str | None, only: str | None) -> Orders:
        from pytest_replaysafe.matrix.cells import parse_number

        parsed: int | None = DEFAULT_ORDERS
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
        total = math.factorial(min(widest, ALL_UP_TO)) + 1 if self.count is None else self.count
        return list(range(total))

    def flag(self, variant: int, parallel: bool = True) -> str:
        """What a repro line adds to run *variant* again (of a test whose clean run had *parallel* calls)."""
        if not parallel:
            return ""  # (the only order)
        if self.count in (1, DEFAULT_ORDERS) and variant <= TOGETHER:
            return f" --crash-order={variant}"
        spec = "all" if self.count is None else str(self.count)
        return f" --crash-orders={spec} --crash-order={variant}"

    def pick(self, indices: list[int], variant: int, rng: random.Random) -> Groups:
        """One batch's order, as groups: order 1, every call together; with ``all``, else the variant-th
        permutation (in sorted order; order 0 the first) of a batch of up to 4 calls, one call at a time; else the
        seeded shuffle, one at a time, for order 0, and a seeded shuffle cut into seeded groups for each further
        order."""
        order = list(indices)
        if variant == TOGETHER:
            return [order]
        if self.count is None and len(order) <= ALL_UP_TO:
            permutations = sorted(itertools.permutations(order))
            return [[i] for i in permutations[(variant - 1 if variant > TOGETHER else 0) % len(permutations)]]
        if variant == 0:
            rng.shuffle(order)
            return [[i] for i in order]
        drawn = random.Random(f"{rng.random()}:{variant}")
        drawn.shuffle(order)
        groups: Groups = [[order[0]]]
        for index in order[1:]:
            if drawn.random() < 0.5:
                groups[-1].append(index)
            else:
                groups.append([index])
        return groups
