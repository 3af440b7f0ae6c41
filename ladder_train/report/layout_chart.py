"""Every layout of the layout study on one chart: quality against communication and predicted speed.

Quality: a layout's paired difference of the final validation loss to the baseline (standard at the study's depth),
mean over the seeds with its 95 % t interval (from PAIRS_FOR_AN_INTERVAL pairs), from the committed seed runs.
Communication: the all-reduces one token makes per layer under tensor parallelism (standard 2; parallel 1; the ladder
2, each hidden behind the next module; desync-K 2/K). Speed: ladder-predict's PREDICTED decode speedup over standard
of the same layout at the paper's 1.2B shape, from committed prediction rows (never measured here), in the legend.
The study's controls (other depths) are left out.

    ladder-report docs/results/study_small/seeds --predictions docs/results/predict/layouts_1.2B_tp8.jsonl ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..option_errors import layout_name
from ..plots import new_figure, save_figure
from ..study import PAIRS_FOR_AN_INTERVAL, Group, compare_groups
from .runs import loss_unit
from .tables import markdown_table


@dataclass
class LayoutPoint:
    layout: str  # standard | parallel | ladder | desync-K
    pairs: int
    difference: float  # paired difference of the final validation loss to the baseline (0 for the baseline)
    interval: tuple[float, float] | None  # its 95 % t interval (None for the baseline and below PAIRS_FOR_AN_INTERVAL)
    all_reduces_per_layer: float
    overlapped: bool  # the ladder's all-reduces run behind the next module


def all_reduces_per_layer(model) -> float:
    """The all-reduces per token and layer the layout makes under TP (ModelArgs.layer_reduces; parallel: one for
    its two modules)."""
    from ..config import model_args

    args = model_args(model)
    count = sum(
        1 if layout == "parallel" else attention + mlp
        for layout, (attention, mlp) in zip(args.layer_layouts(), args.layer_reduces(), strict=True)
    )
    return count / args.n_layers


def layout_points(groups: list[Group], baseline: Group) -> list[LayoutPoint]:
    """One point per group of seeds at the baseline's depth (the controls of other depths left out) that shares two or
    more seeds with the baseline."""
    depth = baseline.runs[0].config.model.n_layers
    same_depth = [g for g in groups if g.runs[0].config.model.n_layers == depth]
    points = []
    for row in compare_groups(same_depth, baseline):
        if not row.metric.name.startswith("validation loss"):
            continue
        model = row.group.runs[0].config.model
        diff = row.difference
        if diff is None and row.group is not baseline:
            continue  # fewer than two seeds shared with the baseline: no paired difference to place
        interval = None if diff is None or diff.n < PAIRS_FOR_AN_INTERVAL else (diff.low, diff.high)
        pairs = len(row.group.runs) if diff is None else diff.n
        mean = 0.0 if diff is None else diff.mean
        reduces = all_reduces_per_layer(model)
        points.append(LayoutPoint(layout_name(model), pairs, mean, interval, reduces, model.residual == "ladder"))
    return points


def read_predictions(path: Path, batch: int = 1) -> tuple[dict[str, dict[str, float]], str]:
    """layout -> link -> ladder-predict's decode speedup over standard at ``batch`` (its ``--out`` rows of one
    model, profile and TP degree), and that setting in words."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: not ladder-predict rows ({err})") from None
    chosen = [row for row in rows if isinstance(row, dict) and row.get("prediction") and row.get("batch") == batch]
    settings = {(row["model"], row["gpu"], row["tp"]) for row in chosen}
    if len(settings) != 1:
        raise InputError(f"{path}: needs ladder-predict rows of one model, profile and TP degree at batch {batch}")
    speedups: dict[str, dict[str, float]] = {}
    for row in chosen:
        if row["layout"] != "none":
            speedups.setdefault(row["layout"], {})[row["link"]] = row["decode_speedup_vs_standard"]
    model, gpu, tp = settings.pop()
    return speedups, f"{model} at TP {tp}, batch {batch}, {gpu} profile"


def layout_section(groups: list[Group], baseline: Group, predictions: Path, out: Path) -> list[str]:
    """The chart and its table: quality, communication, predicted speed per layout."""
    speedups, setting = read_predictions(predictions)
    points = layout_points(groups, baseline)
    links = sorted({link for by_link in speedups.values() for link in by_link})
    header = ["layout", "pairs", "paired difference", "95 % interval", "all-reduces per token and layer"]
    header += [f"predicted decode speedup, {link}" for link in links]
    rows = []
    for point in points:
        interval = f"[{point.interval[0]:+.4f}, {point.interval[1]:+.4f}]" if point.interval else "—"
        hidden = " (hidden)" if point.overlapped else ""
        cells = [point.layout, str(point.pairs), f"{point.difference:+.4f}", interval]
        cells.append(f"{point.all_reduces_per_layer:g}{hidden}")
        cells += [
            f"{speedups[point.layout][link]:.2f}x" if link in speedups.get(point.layout, {}) else "—" for link in links
        ]
        rows.append(cells)
    unit = loss_unit([run for group in groups for run in group.runs])
    chart = plot_layouts(points, speedups, out / "layouts.png", setting, unit)
    return [
        f"Paired difference of the final validation loss to {baseline.label} (as above); all-reduces per token and "
        "layer under tensor parallelism (the ladder's run behind the next module); the decode speedup over standard "
        f"is PREDICTED by ladder-predict ({predictions}: {setting}), not measured. A layout needs 2 pairs for a point, "
        f"{PAIRS_FOR_AN_INTERVAL} for an interval.",
        "",
        markdown_table(header, rows),
        "",
        f"![layouts: quality against communication]({chart.name})",
    ]


def plot_layouts(points: list[LayoutPoint], speedups: dict, out: Path, title_setting: str, unit: str) -> Path:
    fig, ax = new_figure(8, 4.8)
    sharing = {}  # layouts with the same communication (parallel and desync-2: one all-reduce) stand side by side
    for point in points:
        sharing.setdefault(point.all_reduces_per_layer, []).append(point)
    for i, point in enumerate(points):
        color = f"C{i}"
        same_x = sharing[point.all_reduces_per_layer]
        rank = same_x.index(point)
        x = point.all_reduces_per_layer + 0.05 * (rank - (len(same_x) - 1) / 2)
        if point.interval is not None:
            low, high = point.interval
            ax.errorbar(
                x,
                point.difference,
                yerr=[[point.difference - low], [high - point.difference]],
                fmt="none",
                ecolor=color,
                capsize=4,
            )
        # the predicted speedups go in the legend: beside the points they crossed a neighbour's bar or marker
        predicted = speedups.get(point.layout, {})
        note = " / ".join(f"{v:.2f}x {link}" for link, v in sorted(predicted.items()))
        label = f"{point.layout} (n={point.pairs})" + (": all-reduces hidden" if point.overlapped else "")
        ax.plot(
            x,
            point.difference,
            "o",
            color=color,
            markerfacecolor="white" if point.overlapped else color,
            markersize=9,
            label=label + (f"; {note}" if note else ""),
        )
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlim(0, 2.4)
    return save_figure(
        fig,
        ax,
        out,
        title="Layouts: quality against communication\n"
        f"(legend: PREDICTED decode speedup vs standard, {title_setting})",
        xlabel="all-reduces per token and layer under tensor parallelism",
        ylabel=f"validation loss − standard's, paired ({unit}, 95 % t interval)",
        legend_size=8,
    )
