"""A mixture of token folders (``data.sources``): how many instances each source gives to each global batch.

Source k's cumulative count after b global batches of G instances is the largest-remainder (Hamilton) rounding of
its target ``b * G * w_k`` (weights normalised to sum to 1): ``floor(b G w_k)``, plus one for the sources with the
largest fractional parts until the counts sum to ``b G`` (ties to the earlier source). So every source is within
one instance of its share at every global batch boundary, and the count is a closed form of b (nothing to replay
on a resume). It is computed in exact integer arithmetic (each float weight is a binary fraction), so it does not
depend on floating-point rounding. A source whose share of a global batch is under one instance is refused: with
``G w_k >= 1`` the cumulative counts never decrease (``floor`` gains at least 1 per batch).

Which instances a source gives, and where they sit in the batch, is global_order.py's business.
"""

from __future__ import annotations

import math
from fractions import Fraction

from ..errors import DataError


class Mixture:
    """The per-batch counts of a weighted mixture; ``weights[k]`` is source k's (positive) weight."""

    def __init__(self, weights: list[float], global_batch: int, names: list[str] | None = None):
        names = names or [f"data.sources[{k}].weight" for k in range(len(weights))]
        if not weights:
            raise DataError("data.sources: the mixture has no source")
        for name, weight in zip(names, weights, strict=True):
            if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
                raise DataError(f"{name}: must be a finite number > 0, got {weight!r}")
        fractions = [Fraction(w) for w in weights]  # exact: a float is a binary fraction
        scale = math.lcm(*(f.denominator for f in fractions))
        self.units = [int(f * scale) for f in fractions]  # integer weights, the same proportions
        self.total = sum(self.units)
        self.global_batch = global_batch
        for name, weight, unit in zip(names, weights, self.units, strict=True):
            if unit * global_batch < self.total:
                share = unit / self.total
                raise DataError(
                    f"{name}: {weight!r} is a share of {share:.3g}, under one instance of a global batch of "
                    f"{global_batch}; raise it or leave the source out"
                )

    @property
    def shares(self) -> list[float]:
        return [unit / self.total for unit in self.units]

    def consumed(self, batches: int) -> list[int]:
        """How many instances each source has given to global batches ``0 .. batches - 1``."""
        seats = batches * self.global_batch
        quotient = [divmod(seats * unit, self.total) for unit in self.units]
        counts = [q for q, _ in quotient]
        short = seats - sum(counts)  # < number of sources
        by_remainder = sorted(range(len(counts)), key=lambda k: (-quotient[k][1], k))
        for k in by_remainder[:short]:
            counts[k] += 1
        return counts

    def counts(self, batch: int) -> list[int]:
        """How many instances each source gives to global batch ``batch`` (they sum to the global batch)."""
        before, after = self.consumed(batch), self.consumed(batch + 1)
        return [b - a for a, b in zip(before, after, strict=True)]
