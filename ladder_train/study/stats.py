"""The statistics of a layout comparison: a paired t interval over seeds, and a learning rate chosen on a sweep."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# the fewest pairs whose t interval a table or chart shows: two pairs' spans t(0.975, 1) = 12.7 sd/sqrt(2), true
# but wide enough to hide every other layout's interval beside it; their mean is shown
PAIRS_FOR_AN_INTERVAL = 3


@dataclass(frozen=True)
class PairedDifference:
    """The mean of per-seed differences (group - baseline) with its two-sided t interval and p-value."""

    n: int
    mean: float
    sd: float  # sample sd of the differences (n - 1)
    half_width: float  # of the confidence interval: t(1 - alpha/2, n - 1) x sd / sqrt(n)
    p_value: float  # two-sided, of "the mean difference is 0"
    confidence: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def _scipy_stats():
    # scipy (~2 CPU-s to import) loads where a study is analysed, not where it runs: `ladder-train study` and every
    # Slurm array task of one import this package and never compute an interval
    from scipy import stats

    return stats


def paired_difference(values: list[float], baseline: list[float], confidence: float = 0.95) -> PairedDifference:
    """``values[i] - baseline[i]`` are the paired differences (same seed: same data order and initial weights)."""
    if len(values) != len(baseline):
        raise ValueError(f"paired samples differ in length: {len(values)} and {len(baseline)}")
    if len(values) < 2:
        raise ValueError("a paired interval needs at least two pairs")
    diffs = [a - b for a, b in zip(values, baseline, strict=True)]
    n, mean, sd = len(diffs), statistics.fmean(diffs), statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    scipy_stats = _scipy_stats()
    p_value = 1.0 if se == 0 and mean == 0 else (0.0 if se == 0 else 2 * scipy_stats.t.sf(abs(mean) / se, n - 1))
    return PairedDifference(n, mean, sd, half_width(sd, n, confidence), float(p_value), confidence)


def half_width(sd: float, n: int, confidence: float = 0.95) -> float:
    """The half-width of the two-sided t interval of a mean over ``n`` pairs whose sd is ``sd``: t(1 - alpha/2,
    n - 1) x sd / sqrt(n); with the sd of fewer pairs, what ``n`` pairs project."""
    return float(_scipy_stats().t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n))


@dataclass(frozen=True)
class RateChoice:
    """The learning rate with the lowest loss on a sweep, and whether it lies on the sweep's edge (the optimum may
    then lie outside the rates tried)."""

    best: float
    loss: float
    at_edge: bool


def best_rate(losses: dict[float, float]) -> RateChoice:
    """``{lr: loss at the horizon}`` -> the lowest loss's rate (the smaller rate on a tie)."""
    if len(losses) < 2:
        raise ValueError("a learning-rate choice needs at least two rates")
    rates = sorted(losses)
    best = min(rates, key=lambda lr: (losses[lr], lr))
    return RateChoice(best, losses[best], best in (rates[0], rates[-1]))


def power(effect: float, sd: float, n: int, confidence: float = 0.95) -> float:
    """The chance that n pairs with pair-to-pair sd ``sd`` give a two-sided t interval excluding 0 when the true mean
    difference is ``effect`` (the noncentral t: centred at effect / (sd / sqrt(n)), n - 1 degrees of freedom)."""
    if n < 2:
        raise ValueError("power needs at least two pairs")
    if sd <= 0:
        return 1.0 if effect else 1 - confidence
    df = n - 1
    scipy_stats = _scipy_stats()
    critical = scipy_stats.t.ppf(0.5 + confidence / 2, df)
    centre = effect / (sd / math.sqrt(n))
    # both tails as upper tails (the far lower tail's cdf can come back nan); a tail too far out to compute is 0
    tails = (scipy_stats.nct.sf(critical, df, centre), scipy_stats.nct.sf(critical, df, -centre))
    return float(sum(0.0 if math.isnan(tail) else tail for tail in tails))


def pairs_for_power(effect: float, sd: float, target: float = 0.8, confidence: float = 0.95, most: int = 10_000):
    """The fewest pairs whose paired t test detects a true ``effect`` with probability ``target`` at pair sd ``sd``;
    None when even ``most`` pairs do not."""
    if power(effect, sd, most, confidence) < target:
        return None
    # power grows with n: bisect for the first n that reaches the target (a linear walk took ~400 calls)
    low, high = 1, most  # power(low) < target <= power(high), n = 1 standing for "fewer than two"
    while high - low > 1:
        mid = (low + high) // 2
        if power(effect, sd, mid, confidence) < target:
            low = mid
        else:
            high = mid
    return high


def pooled_sd(differences: list[PairedDifference]) -> float:
    """The pair sd pooled over comparisons that share one spread: each comparison's variance weighted by its degrees
    of freedom, sqrt(sum (n_i - 1) sd_i^2 / sum (n_i - 1)), so that a comparison of thirteen pairs weighs six times
    one of three (an unweighted mean of variances would weigh them alike)."""
    if not differences:
        raise ValueError("a pooled sd needs at least one comparison")
    df = sum(d.n - 1 for d in differences)
    return math.sqrt(sum((d.n - 1) * d.sd**2 for d in differences) / df)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of p-values for testing them together (same order as given): the k-th smallest
    times the number not yet passed, never below an earlier adjusted one, at most 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
