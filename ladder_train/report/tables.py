"""The runs side by side: the Table-3-style comparison and the loss and learning-rate plots; a markdown table, and
the cell of a figure measured several times (its median with the lowest and highest)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path

from ..plots import new_figure, save_figure, series_colour
from ..study import Group
from .runs import Run, final_train_loss, loss_unit, train_tokens_per_s

# per task, the metric the paper's tables use (acc_norm where lm-eval has it) and whether lower is better
TASK_METRICS = {
    "wikitext": ("word_perplexity", True),
    "wikitext2_local": ("word_perplexity", True),
    "lambada_local": ("acc", False),
}


def task_metric(task: str, metrics: dict[str, float]) -> tuple[str, float] | None:
    name = TASK_METRICS.get(task, ("acc_norm" if "acc_norm" in metrics else "acc", False))[0]
    return (name, metrics[name]) if name in metrics else None


def results_table(runs: list[Run]) -> list[list[str]]:
    """Rows of the markdown table: metric, then one column per run, then the last run's relative
    difference to the first (e.g. ladder vs standard)."""

    def fmt(value, digits=4):
        return "—" if value is None else f"{value:,.{digits}f}"

    def relative(values):
        first, last = values[0], values[-1]
        if len(values) < 2 or first in (None, 0) or last is None:
            return "—"
        return f"{100 * (last - first) / first:+.2f} %"

    rows = []
    finals = [final_train_loss(r) for r in runs]
    rows.append(["train loss (mean of last 5 logs)", *map(fmt, finals), relative(finals)])
    vals = [r.val[-1]["val_loss"] if r.val else None for r in runs]
    rows.append(["validation loss (final)", *map(fmt, vals), relative(vals)])
    ppls = [math.exp(v) if v is not None else None for v in vals]
    rows.append(["validation perplexity", *(fmt(p, 2) for p in ppls), relative(ppls)])
    tasks = sorted({task for r in runs for task in r.eval_summary})
    for task in tasks:
        found = [task_metric(task, r.eval_summary.get(task, {})) for r in runs]
        metric = next((f[0] for f in found if f), None)
        if metric is None:
            continue
        values = [f[1] if f else None for f in found]
        rows.append([f"{task} ({metric})", *map(fmt, values), relative(values)])
    speeds = [train_tokens_per_s(r) for r in runs]
    rows.append(["training tokens/s (median)", *(fmt(s, 0) for s in speeds), relative(speeds)])
    return rows


def runs_table(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """The same figures with one row per run (for many runs, or a study's, where no run is the baseline)."""
    rows = [row[:-1] for row in results_table(runs)]  # without the relative column
    header = ["run", *(row[0] for row in rows)]
    return header, [[run.label, *(row[i + 1] for row in rows)] for i, run in enumerate(runs)]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def spread(values: Iterable[float], spec: str, suffix: str = "") -> str:
    """``median (lowest–highest)`` of the values; the median alone where they all print the same."""
    values = list(values)
    middle = format(statistics.median(values), spec) + suffix
    low, high = format(min(values), spec), format(max(values), spec)
    return middle if low == high else f"{middle} ({low}–{high}{suffix})"


def _legend_label(group: Group) -> str:
    """A group of one run by the run's own label; repeats by the group's, with how many runs it draws."""
    return group.runs[0].label if len(group.runs) == 1 else f"{group.label}, {len(group.runs)} runs"


def draw_loss(ax, groups: list[Group]) -> None:
    """Each group's runs in one colour, training solid and validation dashed, one legend entry per group: a
    study's dozens of seeds stay one line of legend per configuration."""
    for i, group in enumerate(groups):
        for j, run in enumerate(group.runs):
            label = _legend_label(group) if j == 0 else None
            ax.plot(
                [r["tokens"] for r in run.train],
                [r["loss"] for r in run.train],
                color=series_colour(i, len(groups)),
                alpha=0.6,
                label=label,
            )
            if run.val:
                ax.plot(
                    [r["tokens"] for r in run.val],
                    [r["val_loss"] for r in run.val],
                    color=series_colour(i, len(groups)),
                    linestyle="--",
                    marker="o",
                    markersize=3,
                )
    if any(run.val for group in groups for run in group.runs):
        ax.plot([], [], color="gray", linestyle="--", marker="o", markersize=3, label="validation (dashed)")


def plot_loss(groups: list[Group], out: Path) -> Path:
    fig, ax = new_figure(8, 5)
    draw_loss(ax, groups)
    return save_figure(
        fig,
        ax,
        out / "loss.png",
        title="Loss against tokens",
        xlabel="tokens",
        ylabel=f"loss ({loss_unit([run for group in groups for run in group.runs])})",
        legend_below=True,
    )


def draw_lr(ax, groups: list[Group]) -> None:
    """One schedule per group: its runs differ only in seed, name and folder, which the schedule does not read."""
    for i, group in enumerate(groups):
        run = group.runs[0]
        ax.plot(
            [r["step"] for r in run.train],
            [r["lr"] for r in run.train],
            color=series_colour(i, len(groups)),
            label=_legend_label(group),
        )


def plot_lr(groups: list[Group], out: Path) -> Path:
    fig, ax = new_figure(8, 3.5)
    draw_lr(ax, groups)
    return save_figure(
        fig,
        ax,
        out / "lr.png",
        title="Learning-rate schedule",
        xlabel="step",
        ylabel="learning rate",
        legend_below=True,
    )
