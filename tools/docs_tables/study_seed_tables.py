"""The layout study's seeds (docs/results.md): every group against the baseline with paired intervals, the
ladder − standard pairs seed by seed as the extension ran them, and the desync arms' seeds beside standard's. Each
table's folders and the study's plan: ``manifest.toml``."""

from __future__ import annotations

import statistics
from datetime import datetime
from itertools import pairwise
from pathlib import Path

from ladder_train.option_errors import desync_every, layout_name
from ladder_train.report.runs import read_metrics, train_tokens_per_s
from ladder_train.report.study import comparison_section
from ladder_train.report.tables import markdown_table
from ladder_train.study import (
    PAIRS_FOR_AN_INTERVAL,
    default_baseline,
    final_val_loss,
    group_runs,
    half_width,
    holm,
    paired_difference,
)

from .study_runs import interval, loss_differences, seed_runs, study_runs


def seeds(root: Path, seeds: str, planned_runs: int, plan: str) -> str:
    """The layout study's seeds: per metric and group mean ± sd and the paired difference to standard with its 95 %
    interval, read against the study's resolution of 0.01 nats per byte (``report.study.comparison_section``)."""
    runs = study_runs(root, seeds)
    groups = group_runs(runs)
    baseline = default_baseline(groups)
    speeds = sorted(train_tokens_per_s(run) for run in runs)
    lines = comparison_section(groups, baseline, resolution=0.01)
    per_group = "; ".join(f"{group.label}: {', '.join(map(str, sorted(group.seeds)))}" for group in groups)
    return (
        "\n".join(lines)
        + f"\n\n{len(runs)} of the study's {planned_runs} planned seed runs finished ({plan}; seeds per group: "
        f"{per_group}); from `{seeds}`. A difference needs two paired seeds for an interval. Training speed (each run's "
        f"median logged tokens/s; the median run, then the slowest–fastest): {statistics.median(speeds):,.0f} "
        f"({speeds[0]:,.0f}–{speeds[-1]:,.0f}); the 2-core VM was shared with other work during part of some runs."
        f"{_wall_note(runs)}\n"
    )


def _wall_note(runs: list) -> str:
    """The wall time of the runs whose metrics rows carry clock times (rows written since 2026-11-27): first to last
    row, the end-of-run evaluation and any cut-off-and-resumed run's pause included."""
    timed = [(run, wall) for run in runs if (wall := _wall(run)) is not None]
    if not timed:
        return ""
    minutes = sorted(wall[0] for _, wall in timed)
    resumed = sum(wall[1] for _, wall in timed)
    first = sorted({wall[2] for _, wall in timed})
    seeds = _seed_ranges(sorted({run.seed for run, _ in timed}))
    return (
        f" Wall time of the {len(timed)} runs whose metrics rows carry clock times (seeds {seeds}), from the first "
        f"logged row (step {', '.join(map(str, first))}) to the last (the end-of-run evaluation): median "
        f"{statistics.median(minutes):.0f} min ({minutes[0]:.0f}–{minutes[-1]:.0f}); {resumed} of them "
        f"{'was' if resumed == 1 else 'were'} cut off and resumed, their pause and replayed steps included."
    )


def _wall(run) -> tuple[float, bool, int] | None:
    """Minutes from the run's first metrics row to its last, whether it was resumed (a training row's step at or
    below an earlier one's) and the first row's step; None where a row carries no time."""
    records = read_metrics(run.path / "metrics.jsonl")
    if not records or any("time" not in record for record in records):
        return None
    times = [datetime.fromisoformat(record["time"]) for record in records]
    steps = [record["step"] for record in records if "loss" in record]
    resumed = any(b <= a for a, b in pairwise(steps))
    return (max(times) - min(times)).total_seconds() / 60, resumed, records[0]["step"]


def _seed_ranges(seeds: list[int]) -> str:
    """[3, 4, 5, 7] -> '3-5, 7'."""
    spans: list[list[int]] = []
    for seed in seeds:
        if spans and seed == spans[-1][-1] + 1:
            spans[-1].append(seed)
        else:
            spans.append([seed])
    return ", ".join(str(s[0]) if len(s) == 1 else f"{s[0]}-{s[-1]}" for s in spans)


def ladder_pairs(root: Path, seeds: str, pairs_planned: list[int]) -> str:
    """The ladder − standard pairs seed by seed in the order the extension ran them, each row with the figures of
    the pairs so far (mean, 95 % t interval, pair sd, p, Holm p over the seeds table's comparisons as they stood),
    the validation steps at which the ladder was above, and when the later run of the pair finished."""
    runs = seed_runs(root, seeds)
    groups = group_runs(list(runs.values()))
    baseline = default_baseline(groups)
    depth = baseline.runs[0].config.model.n_layers
    # the other comparisons' p-values, as the seeds table has them; the ladder's is recomputed row by row
    others = [
        row.difference.p_value
        for row in loss_differences(groups, baseline)
        if row.difference is not None and not row.group.label.startswith("ladder")
    ]
    paired = sorted(seed for (residual, seed, layers) in runs if residual == "ladder" and layers == depth)
    paired = [seed for seed in paired if ("standard", seed, depth) in runs]
    rows, ladder, standard = [], [], []
    for seed in paired:
        pair = runs[("ladder", seed, depth)], runs[("standard", seed, depth)]
        ladder.append(final_val_loss(pair[0]))
        standard.append(final_val_loss(pair[1]))
        gaps = _step_gaps(*pair)
        row = [
            str(seed),
            f"{standard[-1]:.4f}",
            f"{ladder[-1]:.4f}",
            f"{ladder[-1] - standard[-1]:+.4f}",
            f"{sum(gap > 0 for gap in gaps)} of {len(gaps)}",
            _finished(pair),
            str(len(ladder)),
        ]
        if len(ladder) < 2:
            rows.append(row + [""] * 6)
            continue
        gap = paired_difference(ladder, standard)
        adjusted = holm([gap.p_value, *others])[0]
        row += [f"{gap.mean:+.4f}", interval(gap), f"{gap.half_width:.4f}", f"{gap.sd:.4f}", f"{gap.p_value:.3f}"]
        rows.append(row + [f"{adjusted:.3f}"])
    header = ["seed", "standard", "ladder", "ladder − standard", "val steps ladder above", "finished (UTC)"]
    header += ["pairs", "mean", "95 % interval", "half-width", "pair sd", "p", "Holm p"]
    text = markdown_table(header, rows)
    text += (
        f"\n\nValidation loss (nats/byte) at step 2,200, both layouts at their chosen rate, from `{seeds}`; "
        "each row's last seven columns are the paired t figures of the pairs up to it (the seeds table's at the "
        f"last row); Holm p adjusts over the seeds table's {len(others) + 1} validation-loss comparisons, the "
        "others' p as that table has them. Val steps ladder above: the validation steps at which the ladder's "
        "loss exceeds standard's. Finished: the later run's last metrics row (rows written before "
        "2026-11-27 carry no time: —)."
    )
    if len(ladder) > 1:
        sd = statistics.stdev([a - b for a, b in zip(ladder, standard, strict=True)])
        projected = ", ".join(f"{m} pairs {half_width(sd, m):.4f}" for m in pairs_planned if m > len(ladder))
        if projected:
            text += f" At the last row's pair sd ({sd:.4f}) the projected half-width is: {projected}."
    return text + "\n"


def _step_gaps(run, baseline) -> list[float]:
    """The run's validation loss minus the baseline's at each validation step both logged."""
    base = {row["step"]: row["val_loss"] for row in baseline.val}
    return [row["val_loss"] - base[row["step"]] for row in run.val if row["step"] in base]


def _finished(pair) -> str:
    times = [run.val[-1].get("time") for run in pair]
    return "—" if None in times else max(times)[:16].replace("T", " ")


def desync_seeds(root: Path, seeds: str, desync_seeds: str) -> str:
    """The desync arms seed by seed beside standard's run of the same seed (the seeds table's, at its chosen rate),
    with each arm's paired difference to standard: its mean from two pairs; its t interval and Holm-adjusted p-value
    (over the desync arms with three or more pairs) from three."""
    standard = seed_runs(root, seeds)
    arms: dict[str, dict[int, object]] = {}
    for run in study_runs(root, desync_seeds, required=False):
        arms.setdefault(layout_name(run.config.model), {})[run.seed] = run
    names = sorted(arms, key=desync_every)
    depth = {name: next(iter(arms[name].values())).config.model.n_layers for name in names}
    found = sorted({seed for runs in arms.values() for seed in runs})
    rows, gaps = [], {name: ([], []) for name in names}
    for seed in found:
        cells, deltas = [], []
        base = {name: standard.get(("standard", seed, depth[name])) for name in names}
        for name in names:
            run = arms[name].get(seed)
            if run is None or base[name] is None:
                cells.append("not yet" if run is None else f"{final_val_loss(run):.4f}")
                deltas.append("not yet" if run is None else "no standard run")
                continue
            loss, reference = final_val_loss(run), final_val_loss(base[name])
            gaps[name][0].append(loss)
            gaps[name][1].append(reference)
            cells.append(f"{loss:.4f}")
            deltas.append(f"{loss - reference:+.4f}")
        reference = next((final_val_loss(b) for b in base.values() if b is not None), None)
        rows.append([str(seed), "—" if reference is None else f"{reference:.4f}", *cells, *deltas])
    differences = {name: paired_difference(*gaps[name]) for name in names if len(gaps[name][0]) > 1}
    blank = [""] * (1 + len(names))
    if differences:
        rows.append(["mean", *blank, *(f"{differences[n].mean:+.4f}" if n in differences else "" for n in names)])
    tested = [name for name in names if name in differences and differences[name].n >= PAIRS_FOR_AN_INTERVAL]
    if tested:
        adjusted = dict(zip(tested, holm([differences[name].p_value for name in tested]), strict=True))
        rows.append(["95 % t interval", *blank, *(interval(differences[n]) if n in tested else "" for n in names)])
        rows.append(["p (Holm)", *blank, *(f"{adjusted[n]:.3f}" if n in tested else "" for n in names)])
    labels = [f"{name} (t = {next(iter(arms[name].values())).config.model.desync_tp})" for name in names]
    header = ["seed", "standard", *labels, *(f"{name} − standard" for name in names)]
    pairs = ", ".join(f"{name} {len(gaps[name][0])}" for name in names) or "none yet"
    return (
        markdown_table(header, rows)
        + f"\n\nValidation loss (nats/byte) at step 2,200, one run per cell; the desync arms at their rate from "
        f"`{desync_seeds}`, standard at its rate from `{seeds}`; pairs by seed: {pairs}. A mean needs two "
        "pairs, an interval three (paired t, as the seeds table); Holm's adjustment is over the desync arms "
        "tested here, a family apart from the seeds table's four comparisons.\n"
    )
