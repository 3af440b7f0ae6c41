"""Runs that repeat one configuration under different seeds, grouped for ladder-report: per group the mean and
sample standard deviation of the final losses, the difference to the baseline group with its standard error,
and a loss plot with a band of one standard deviation across seeds.

Runs belong to one group when their configs are equal apart from the run's own identity (``run.seed``,
``run.name``, ``run.dir``) and its wandb settings; a group is labelled by its residual layout, plus the keys in
which it differs from another group of the same layout (e.g. ``train.optimizer.lr=0.001``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

from .stats import PairedDifference, paired_difference

# config keys that name a repeat rather than change the experiment
_IDENTITY_KEYS = ("run.seed", "run.name", "run.dir")
_IDENTITY_PREFIXES = ("wandb.",)


@dataclass
class Group:
    label: str
    runs: list  # report.Run, in the order given

    @property
    def seeds(self) -> list[int]:
        return [run.seed for run in self.runs]


def flat_config(config) -> dict[str, object]:
    """A resolved Config (load_config's: dataclasses, plain lists and dicts) as ``{"a.b.c": value}``, without the
    identity keys. It walks the dataclasses directly: a round trip through ``OmegaConf.structured`` costs ~12 ms a
    run, and the docs' tables group the same runs many times in one remake."""
    flat: dict[str, object] = {}

    def walk(node, prefix):
        if is_dataclass(node):
            for entry in fields(node):
                walk(getattr(node, entry.name), f"{prefix}{entry.name}.")
            return
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node if not isinstance(node, list) else tuple(node)

    walk(config, "")
    return {k: v for k, v in flat.items() if k not in _IDENTITY_KEYS and not k.startswith(_IDENTITY_PREFIXES)}


def group_runs(runs: list) -> list[Group]:
    """Groups of repeats, in order of first appearance."""
    configs = [flat_config(run.config) for run in runs]
    keys: list[tuple] = []
    members: dict[tuple, list] = {}
    for run, flat in zip(runs, configs, strict=True):
        key = tuple(sorted(flat.items()))
        if key not in members:
            keys.append(key)
            members[key] = []
        members[key].append(run)
    groups = []
    for key in keys:
        flat = dict(key)
        residual = flat["model.residual"]
        rivals = [dict(other) for other in keys if other != key and dict(other)["model.residual"] == residual]
        differing = sorted({k for other in rivals for k in flat if other.get(k) != flat[k]})
        suffix = ", ".join(f"{k}={flat[k]}" for k in differing)
        groups.append(Group(label=f"{residual} ({suffix})" if suffix else residual, runs=members[key]))
    return groups


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1); the deviation is None for a single value."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def difference(values: list[float], baseline: list[float]) -> tuple[float, float | None]:
    """Difference of means and its standard error sqrt(sd_a^2/n_a + sd_b^2/n_b) (None unless both have >= 2)."""
    diff = statistics.fmean(values) - statistics.fmean(baseline)
    if len(values) < 2 or len(baseline) < 2:
        return diff, None
    return diff, math.sqrt(statistics.variance(values) / len(values) + statistics.variance(baseline) / len(baseline))


def paired_by_seed(group: Group, baseline: Group, value) -> PairedDifference | None:
    """The per-seed differences of ``value`` when both groups ran the same seeds (same init and data order per
    seed, so the pairing removes the seed's share of the spread), else None."""
    if sorted(group.seeds) != sorted(baseline.seeds) or len(group.seeds) < 2:
        return None
    by_seed = {run.seed: value(run) for run in baseline.runs}
    return paired_difference([value(run) for run in group.runs], [by_seed[run.seed] for run in group.runs])


def _pm(mean: float, sd: float | None, digits: int = 4) -> str:
    return f"{mean:.{digits}f}" + ("" if sd is None else f" ± {sd:.{digits}f}")


def seeds_table(groups: list[Group], final_val, final_train) -> tuple[list[str], list[list[str]]]:
    """Header and rows: per group the seeds, final validation and train loss as mean ± sd, and the difference
    of the final validation loss to the first group (± its standard error; paired by seed where possible)."""
    header = [
        "group",
        "runs (seeds)",
        "final validation loss (mean ± sd)",
        "final train loss, mean of last 5 logs (mean ± sd)",
        f"validation loss − {groups[0].label} (± s.e.)",
        f"paired by seed − {groups[0].label} (mean ± sd)",
    ]
    rows = []
    base = [final_val(run) for run in groups[0].runs]
    for group in groups:
        vals = [final_val(run) for run in group.runs]
        trains = [final_train(run) for run in group.runs]
        first = group is groups[0]
        diff = None if first else difference(vals, base)
        paired = None if first else paired_by_seed(group, groups[0], final_val)
        rows.append(
            [
                group.label,
                f"{len(vals)} ({', '.join(map(str, group.seeds))})",
                _pm(*mean_sd(vals)),
                _pm(*mean_sd(trains)),
                "—" if diff is None else f"{diff[0]:+.4f}" + ("" if diff[1] is None else f" ± {diff[1]:.4f}"),
                "—" if paired is None else f"{paired.mean:+.4f} ± {paired.sd:.4f}",
            ]
        )
    return header, rows


def plot_bands(groups: list[Group], out: Path) -> Path:
    """Train loss against tokens: the mean over a group's seeds with a band of ± one sd; the validation loss
    as mean with error bars of one sd."""
    from ..plots import new_figure, save_figure  # matplotlib loads where a study is plotted, not where it runs

    fig, ax = new_figure(8, 5)
    for i, group in enumerate(groups):
        color = f"C{i}"
        for records, key, style in ((lambda r: r.train, "loss", "-"), (lambda r: r.val, "val_loss", "--")):
            by_tokens: dict[float, list[float]] = {}
            for run in group.runs:
                for record in records(run):
                    by_tokens.setdefault(record["tokens"], []).append(record[key])
            tokens = sorted(t for t, v in by_tokens.items() if len(v) == len(group.runs))  # steps all seeds logged
            if not tokens:
                continue
            means = [statistics.fmean(by_tokens[t]) for t in tokens]
            sds = [statistics.stdev(by_tokens[t]) if len(group.runs) > 1 else 0.0 for t in tokens]
            name = f"{group.label} ({'train' if key == 'loss' else 'validation'}, n={len(group.runs)})"
            if key == "loss":
                ax.plot(tokens, means, style, color=color, label=name)
                lower = [m - s for m, s in zip(means, sds, strict=True)]
                upper = [m + s for m, s in zip(means, sds, strict=True)]
                ax.fill_between(tokens, lower, upper, color=color, alpha=0.2)
            else:
                ax.errorbar(tokens, means, yerr=sds, fmt="o" + style, color=color, markersize=3, capsize=3, label=name)
    return save_figure(
        fig,
        ax,
        out / "loss_seeds.png",
        title="Loss against tokens: mean over seeds, band = ± 1 sd",
        xlabel="tokens",
        ylabel="loss (nats/token)",
        legend_size=8,
    )
