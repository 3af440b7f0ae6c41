"""Studies: a grid of training runs over config keys (``ladder-train study``), and the statistics that compare
its layouts (each at its own best learning rate, paired seeds, 95 % intervals)."""

from .analysis import Sweep, compare_groups, default_baseline, final_val_loss, seeded, sweeps, verdict
from .groups import Group, group_runs, plot_bands, seeds_table
from .stats import PAIRS_FOR_AN_INTERVAL, half_width, holm, paired_difference, pairs_for_power, pooled_sd, power

__all__ = [
    "PAIRS_FOR_AN_INTERVAL",
    "Group",
    "Sweep",
    "compare_groups",
    "default_baseline",
    "final_val_loss",
    "group_runs",
    "half_width",
    "holm",
    "paired_difference",
    "pairs_for_power",
    "plot_bands",
    "pooled_sd",
    "power",
    "seeded",
    "seeds_table",
    "sweeps",
    "verdict",
]
