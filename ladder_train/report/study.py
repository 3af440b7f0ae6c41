"""Repeats and studies: per group of seeds mean ± sd and the difference to the first group; for a study, each
layout's learning-rate curve and best rate, and the paired differences at the best rates with 95 % intervals."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..plots import new_figure, save_figure
from ..study import (
    PAIRS_FOR_AN_INTERVAL,
    Group,
    Sweep,
    compare_groups,
    final_val_loss,
    holm,
    paired_difference,
    pairs_for_power,
    plot_bands,
    power,
    seeds_table,
    verdict,
)
from .runs import final_train_loss, loss_unit
from .tables import markdown_table


def seeds_section(groups: list[Group], out: Path) -> list[str]:
    """Repeats of one configuration: mean ± sd per group and the differences to the first group."""
    header, rows = seeds_table(groups, final_val_loss, final_train_loss)
    return [
        "Runs with equal configs apart from the seed are grouped. sd = sample standard deviation over the seeds "
        "(n − 1); s.e. of a difference = sqrt(sd₁²/n₁ + sd₂²/n₂); the paired column takes the per-seed "
        "differences (the same seed gives every layout the same data order and the same initial values of the weights "
        "they share: norms, which parallel has fewer of, start at one and draw nothing).",
        "",
        markdown_table(header, rows),
        "",
        f"![loss over seeds]({plot_bands(groups, out).name})",
    ]


def sweep_section(sweeps: list[Sweep], out: Path) -> list[str]:
    """Per layout: the validation loss at the sweep's horizon for each rate, and the rate chosen."""
    rates = sorted({lr for sweep in sweeps for lr in (*sweep.losses, *sweep.unfinished)})
    header = ["layout", "horizon (step)", *(f"lr {lr:g}" for lr in rates), "best rate"]
    rows = []
    for sweep in sweeps:
        cells = [
            f"{sweep.losses[lr]:.4f}"
            if lr in sweep.losses
            else (f"running (step {sweep.unfinished[lr]})" if lr in sweep.unfinished else "—")
            for lr in rates
        ]
        if sweep.choice is None:
            best = "— (fewer than two rates at the horizon)"
        else:
            edge = " (on the sweep's edge: the optimum may lie outside)" if sweep.choice.at_edge else ""
            best = f"{sweep.choice.best:g}{edge}"
        rows.append([sweep.label, str(sweep.horizon_step), *cells, best])
    return [
        "Validation loss (nats/token) at the sweep's last step, the mean over its seeds; each layout's best rate is "
        "chosen here, on the sweep's runs, not on the runs compared below.",
        "",
        markdown_table(header, rows),
        "",
        f"![learning-rate sweep]({plot_sweeps(sweeps, out).name})",
    ]


def comparison_section(groups: list[Group], baseline: Group, resolution: float | None) -> list[str]:
    """Mean ± sd over seeds and the paired difference to the baseline, with its 95 % interval, p-value and Holm's
    adjustment over the metric's comparisons, per metric; with a resolution, the power of the pairs at a true
    difference of that size and the pairs that 80 % power needs at the measured pair sd."""
    header = ["metric", "group", "lr", "n", "mean ± sd", "paired difference", "95 % interval", "p", "Holm p"]
    if resolution is not None:
        header += [f"power at {resolution:g}", f"pairs for 80 % at {resolution:g}"]
    header.append("reading")
    comparisons = compare_groups(groups, baseline)
    adjusted = holm_by_metric(comparisons)
    rows = []
    for row in comparisons:
        diff = row.difference
        mean = f"{row.mean:.4f}" + ("" if row.sd is None else f" ± {row.sd:.4f}")
        cells = [
            row.metric.name,
            row.group.label,
            f"{row.group.runs[0].config.train.optimizer.lr:g}",
            str(len(row.group.runs)),
            mean,
            "—" if diff is None else f"{diff.mean:+.4f}",
            "—" if diff is None else f"[{diff.low:+.4f}, {diff.high:+.4f}]",
            "—" if diff is None else f"{diff.p_value:.3f}",
            "—" if diff is None else f"{adjusted[id(row)]:.3f}",
        ]
        if resolution is not None:
            cells += power_cells(diff, resolution)
        rows.append([*cells, verdict(row, resolution)])
    return [
        f"Baseline: {baseline.label}. Paired difference = mean over seeds of (group − baseline), each seed giving both "
        "the same data order and initial weights; its 95 % interval is t(0.975, n − 1) x sd / sqrt(n). An interval "
        "that holds 0 cannot tell the two apart. Holm p: the p-value adjusted (Holm's step-down) over the metric's "
        "comparisons with the baseline, as they are tested together. "
        + (
            ""
            if resolution is None
            else f"Power: the chance that n pairs at the measured pair sd exclude 0 when the true difference is "
            f"{resolution:g} (noncentral t); pairs for 80 %: how many such pairs reach 80 % power. "
        )
        + "Eval tasks are listed where the baseline scores above chance by two standard errors.",
        "",
        markdown_table(header, rows),
    ]


def holm_by_metric(comparisons: list) -> dict[int, float]:
    """Holm-adjusted p-values of each metric's paired differences, by ``id`` of the comparison row."""
    adjusted = {}
    for metric in {row.metric.name for row in comparisons}:
        tested = [row for row in comparisons if row.metric.name == metric and row.difference is not None]
        for row, p in zip(tested, holm([row.difference.p_value for row in tested]), strict=True):
            adjusted[id(row)] = p
    return adjusted


def power_cells(diff, effect: float) -> list[str]:
    if diff is None:
        return ["—", "—"]
    needed = pairs_for_power(effect, diff.sd)
    return [f"{power(effect, diff.sd, diff.n):.0%}", "—" if needed is None else str(needed)]


def plot_sweeps(sweeps: list[Sweep], out: Path) -> Path:
    fig, ax = new_figure(7, 4.5)
    for i, sweep in enumerate(sweeps):
        rates = sorted(sweep.losses)
        ax.plot(rates, [sweep.losses[lr] for lr in rates], "o-", color=f"C{i}", label=sweep.label)
        if sweep.choice is not None:
            ax.plot([sweep.choice.best], [sweep.choice.loss], "*", color=f"C{i}", markersize=14)
    ax.set_xscale("log")
    rates = sorted({lr for sweep in sweeps for lr in sweep.losses})
    ax.set_xticks(rates, [f"{lr:g}" for lr in rates])  # the rates tried, not log-scale decades
    ax.minorticks_off()
    return save_figure(
        fig,
        ax,
        out / "lr_sweep.png",
        title="Learning-rate sweep (star: the rate chosen)",
        xlabel="peak learning rate",
        ylabel=f"validation loss at step {sweeps[0].horizon_step} (nats/token)",
        legend_size=8,
    )


@dataclass
class PairedCurve:
    """A group's validation loss minus the baseline's, seed by seed, at the tokens every pair logged."""

    label: str
    pairs: int
    tokens: list[float]
    means: list[float]
    intervals: list[tuple[float, float]] | None  # 95 % t interval per point, from PAIRS_FOR_AN_INTERVAL pairs on
    per_seed: list[list[float]]  # each pair's own difference at those tokens


def paired_validation_curves(groups: list[Group], baseline: Group) -> list[PairedCurve]:
    base = {run.seed: {r["tokens"]: r["val_loss"] for r in run.val} for run in baseline.runs}
    curves = []
    for group in groups:
        runs = [run for run in group.runs if run.seed in base]
        if group is baseline or not runs:
            continue
        per_seed = [
            {r["tokens"]: r["val_loss"] - base[run.seed][r["tokens"]] for r in run.val if r["tokens"] in base[run.seed]}
            for run in runs
        ]
        tokens = sorted(set.intersection(*(set(diffs) for diffs in per_seed)))
        if len(runs) >= 2:
            paired = [paired_difference([diffs[t] for diffs in per_seed], [0.0] * len(runs)) for t in tokens]
            means = [d.mean for d in paired]
            # two pairs' band (t(0.975, 1) = 12.7) would hide every other curve: their mean and each pair only
            enough = len(runs) >= PAIRS_FOR_AN_INTERVAL
            intervals = [(d.low, d.high) for d in paired] if enough else None
        else:
            means, intervals = [per_seed[0][t] for t in tokens], None
        each = [[diffs[t] for t in tokens] for diffs in per_seed]
        curves.append(PairedCurve(group.label, len(runs), tokens, means, intervals, each))
    return curves


def plot_paired_validation(groups: list[Group], baseline: Group, out: Path, resolution: float | None) -> Path:
    """The paired validation differences over training: the mean with its 95 % band and each pair's own (thin), beside
    zero and ± the resolution."""
    fig, ax = new_figure(8, 4.5)
    for i, curve in enumerate(paired_validation_curves(groups, baseline)):
        if curve.intervals is not None:
            lows, highs = zip(*curve.intervals, strict=True)
            ax.fill_between(curve.tokens, lows, highs, color=f"C{i}", alpha=0.2)
        ax.plot(curve.tokens, curve.means, "o-", color=f"C{i}", markersize=3, label=f"{curve.label} (n={curve.pairs})")
        for diffs in curve.per_seed if curve.pairs > 1 else ():  # few pairs: each one shown, thin
            ax.plot(curve.tokens, diffs, "-", color=f"C{i}", linewidth=0.7, alpha=0.6)
    ax.axhline(0.0, color="black", linewidth=0.8)
    if resolution is not None:
        for sign in (1, -1):
            ax.axhline(sign * resolution, color="grey", linestyle=":", linewidth=0.8)
    return save_figure(
        fig,
        ax,
        out / "paired_validation.png",
        title=f"Validation loss minus {baseline.label}'s, seed by seed\n(band: 95 % t interval of the mean, "
        f"from {PAIRS_FOR_AN_INTERVAL} pairs; thin lines: each pair)",
        xlabel="tokens",
        ylabel=f"paired difference ({loss_unit([run for group in groups for run in group.runs])})",
        legend_size=8,
    )
