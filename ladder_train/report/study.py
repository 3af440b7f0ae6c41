"""Repeats and studies: per group of seeds mean ± sd and the difference to the first group; for a study, each
layout's learning-rate curve and best rate, and the paired differences at the best rates with 95 % intervals."""

from __future__ import annotations

from pathlib import Path

from ..plots import new_figure, save_figure
from ..study import analysis
from ..study import groups as seed_groups
from .runs import final_train_loss, final_val_loss
from .tables import markdown_table


def seeds_section(groups: list[seed_groups.Group], out: Path) -> list[str]:
    """Repeats of one configuration: mean ± sd per group and the differences to the first group."""
    header, rows = seed_groups.seeds_table(groups, final_val_loss, final_train_loss)
    return [
        "Runs with equal configs apart from the seed are grouped. sd = sample standard deviation over the seeds "
        "(n − 1); s.e. of a difference = sqrt(sd₁²/n₁ + sd₂²/n₂); the paired column takes the per-seed "
        "differences (the same seed gives every layout the same data order and the same initial values of the weights "
        "they share: norms, which parallel has fewer of, start at one and draw nothing).",
        "",
        markdown_table(header, rows),
        "",
        f"![loss over seeds]({seed_groups.plot_bands(groups, out).name})",
    ]


def sweep_section(sweeps: list[analysis.Sweep], out: Path) -> list[str]:
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


def comparison_section(
    groups: list[seed_groups.Group], baseline: seed_groups.Group, resolution: float | None
) -> list[str]:
    """Mean ± sd over seeds and the paired difference to the baseline, with its 95 % interval, per metric."""
    header = ["metric", "group", "lr", "n", "mean ± sd", "paired difference", "95 % interval", "p", "reading"]
    rows = []
    for row in analysis.compare(groups, baseline):
        diff = row.difference
        mean = f"{row.mean:.4f}" + ("" if row.sd is None else f" ± {row.sd:.4f}")
        rows.append(
            [
                row.metric.name,
                row.group.label,
                f"{row.group.runs[0].config.train.optimizer.lr:g}",
                str(len(row.group.runs)),
                mean,
                "—" if diff is None else f"{diff.mean:+.4f}",
                "—" if diff is None else f"[{diff.low:+.4f}, {diff.high:+.4f}]",
                "—" if diff is None else f"{diff.p_value:.3f}",
                analysis.verdict(row, resolution),
            ]
        )
    return [
        f"Baseline: {baseline.label}. Paired difference = mean over seeds of (group − baseline), each seed giving both "
        "the same data order and initial weights; its 95 % interval is t(0.975, n − 1) x sd / sqrt(n). An interval "
        "that holds 0 cannot tell the two apart. Eval tasks are listed where the baseline scores above chance by "
        "two standard errors.",
        "",
        markdown_table(header, rows),
    ]


def plot_sweeps(sweeps: list[analysis.Sweep], out: Path) -> Path:
    fig, ax = new_figure(7, 4.5)
    for i, sweep in enumerate(sweeps):
        rates = sorted(sweep.losses)
        ax.plot(rates, [sweep.losses[lr] for lr in rates], "o-", color=f"C{i}", label=sweep.label)
        if sweep.choice is not None:
            ax.plot([sweep.choice.best], [sweep.choice.loss], "*", color=f"C{i}", markersize=14)
    ax.set_xscale("log")
    return save_figure(
        fig,
        ax,
        out / "lr_sweep.png",
        title="Learning-rate sweep (star: the rate chosen)",
        xlabel="peak learning rate",
        ylabel=f"validation loss at step {sweeps[0].horizon_step} (nats/token)",
        legend_size=8,
    )
