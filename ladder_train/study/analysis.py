"""What a study's runs say: per layout the learning-rate curve and its best rate (on the validation loss at the
sweep's horizon), and at each layout's best rate the paired differences to the baseline over seeds, with their
95 % intervals, for the validation loss and every eval metric the baseline scores above chance.

Runs are ``report.Run`` records; repeats of one configuration (equal configs but for the seed) form a group
(``study.groups``). A sweep is a set of groups that differ only in the learning rate; the comparison takes the
groups with two or more seeds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..errors import ConfigError
from .groups import Group, flat_config, mean_sd
from .stats import PairedDifference, RateChoice, best_rate, paired_difference

LR_KEY = "train.optimizer.lr"
# the accuracy of guessing, per task: an accuracy the baseline does not clear by two standard errors is left out
CHANCE = {
    **dict.fromkeys(("arc_easy", "arc_challenge", "openbookqa", "hellaswag", "sciq"), 0.25),
    **dict.fromkeys(("piqa", "winogrande"), 0.5),
    **dict.fromkeys(("lambada", "lambada_openai"), 0.0),
}
# per task the metric compared, and whether lower is better; perplexity tasks compare bits per byte (a log scale)
TASK_METRICS = (("bits_per_byte", True), ("word_perplexity", True), ("acc", False))


def final_val_loss(run) -> float:
    if not run.val:
        raise ConfigError(f"{run.path}: no validation loss in metrics.jsonl (set eval.val_every)")
    return run.val[-1]["val_loss"]


@dataclass
class Sweep:
    """One layout's (family's) learning-rate curve at the horizon: the mean over its seeds at each rate."""

    label: str
    horizon_step: int
    losses: dict[float, float]
    choice: RateChoice | None  # None while fewer than two rates have reached the horizon
    unfinished: dict[float, int]  # rates whose runs have not reached the horizon yet: their last validated step
    config: object  # a run's config: what the sweep holds fixed beside the rate

    @property
    def bracketed(self) -> bool:
        """Whether the best rate has a worse rate tried on each side of it (else the optimum may lie outside)."""
        return self.choice is not None and not self.choice.at_edge


def sweeps(groups: list[Group], min_rates: int = 2) -> list[Sweep]:
    """Groups that differ only in the learning rate, at least ``min_rates`` of them (1: a probe of one rate counts),
    each with its best rate. The horizon is the last validation step the sweep's runs reach; a rate whose runs stop
    short of it (still running) is listed, not chosen."""
    families: dict[tuple, list[Group]] = {}
    for group in groups:
        flat = flat_config(group.runs[0].config)
        key = tuple(sorted((k, v) for k, v in flat.items() if k != LR_KEY))
        families.setdefault(key, []).append(group)
    swept = {}
    for key, family in families.items():
        rates = {group.runs[0].config.train.optimizer.lr: group for group in family}
        if len(rates) >= min_rates and all(run.val for group in family for run in group.runs):
            swept[key] = rates
    found = []
    for key, rates in swept.items():
        horizon = max(run.val[-1]["step"] for group in rates.values() for run in group.runs)
        losses, unfinished = {}, {}
        for lr, group in rates.items():
            done = [run for run in group.runs if run.val[-1]["step"] == horizon]
            if done:
                losses[lr] = statistics.fmean(final_val_loss(run) for run in done)
            else:  # a run still going (or cut off): shown, not chosen
                unfinished[lr] = max(run.val[-1]["step"] for run in group.runs)
        label = dict(key)["model.residual"] + _family_suffix(key, list(swept))
        choice = best_rate(losses) if len(losses) >= 2 else None
        config = next(iter(rates.values())).runs[0].config
        found.append(Sweep(label, horizon, losses, choice, unfinished, config))
    return found


def _family_suffix(key: tuple, families: list[tuple]) -> str:
    """What tells this sweep apart from the other sweeps of its layout (e.g. ``model.n_layers=6``)."""
    flat = dict(key)
    rivals = [
        dict(other) for other in families if other != key and dict(other)["model.residual"] == flat["model.residual"]
    ]
    differing = sorted({k for other in rivals for k in flat if other.get(k) != flat[k]})
    return f" ({', '.join(f'{k}={flat[k]}' for k in differing)})" if differing else ""


def seeded(groups: list[Group]) -> list[Group]:
    return [group for group in groups if len(group.runs) >= 2]


def default_baseline(groups: list[Group]) -> Group:
    """The standard layout with the most layers (a smaller standard model is a control, not the baseline)."""
    standard = [g for g in groups if g.runs[0].config.model.residual == "standard"]
    return max(standard, key=lambda g: g.runs[0].config.model.n_layers) if standard else groups[0]


@dataclass
class Metric:
    name: str
    lower_is_better: bool
    value: object  # run -> float


def metrics(baseline: Group) -> list[Metric]:
    """The validation loss, and each eval task's metric where the baseline scores above chance."""
    found = [Metric("validation loss (nats/token)", True, final_val_loss)]
    summary = baseline.runs[0].eval_summary
    for task in sorted(summary):
        for name, lower in TASK_METRICS:
            if name not in summary[task]:
                continue
            if name == "acc" and not _above_chance(task, baseline):
                break
            found.append(Metric(f"{task} {name}", lower, lambda run, t=task, m=name: run.eval_summary[t][m]))
            break
    return found


def _above_chance(task: str, group: Group) -> bool:
    chance = CHANCE.get(task.removesuffix("_local"))
    if chance is None:
        return True
    accs = [run.eval_summary[task]["acc"] for run in group.runs]
    stderr = statistics.fmean(run.eval_summary[task].get("acc_stderr", 0.0) for run in group.runs)
    return statistics.fmean(accs) > chance + 2 * stderr


@dataclass
class Comparison:
    group: Group
    metric: Metric
    mean: float
    sd: float | None
    difference: PairedDifference | None  # None for the baseline itself


def compare_groups(groups: list[Group], baseline: Group) -> list[Comparison]:
    """Per metric and group: mean ± sd over seeds and the paired difference to the baseline (seeds matched)."""
    rows = []
    for metric in metrics(baseline):
        base = {run.seed: metric.value(run) for run in baseline.runs}
        for group in groups:
            values = {run.seed: metric.value(run) for run in group.runs}
            mean, sd = mean_sd(list(values.values()))
            difference = None
            if group is not baseline:
                shared = sorted(set(values) & set(base))
                if len(shared) >= 2:
                    difference = paired_difference([values[s] for s in shared], [base[s] for s in shared])
            rows.append(Comparison(group, metric, mean, sd, difference))
    return rows


def verdict(comparison: Comparison, resolution: float | None = None) -> str:
    """In words: better/worse than the baseline at 95 %, or that the interval cannot tell them apart."""
    diff = comparison.difference
    if diff is None:
        return "baseline" if comparison.sd is not None else "—"
    if diff.excludes_zero:
        better = (diff.mean < 0) == comparison.metric.lower_is_better
        words = "better than the baseline" if better else "worse than the baseline"
    else:
        words = "cannot tell apart (the interval holds 0)"
    if resolution is not None and diff.half_width >= resolution:
        words += f"; half-width {diff.half_width:.4f} ≥ {resolution}: too wide to resolve a difference of that size"
    return words
