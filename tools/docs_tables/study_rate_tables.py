"""The layout study's learning rates (docs/results.md): the sweep, its check at the horizon (full-length runs at
another rate than the sweep chose) and the ladder's seeds at that other rate. Each table's folders:
``manifest.toml``."""

from __future__ import annotations

from pathlib import Path

from ladder_train.option_errors import desync_every, layout_name
from ladder_train.report.tables import markdown_table
from ladder_train.study import (
    PAIRS_FOR_AN_INTERVAL,
    Group,
    compare_groups,
    default_baseline,
    final_val_loss,
    group_runs,
    holm,
    paired_difference,
    sweeps,
)

from .study_runs import interval, ladder_difference, loss_differences, seed_runs, study_runs

LAYOUTS = ("standard", "parallel", "ladder")


def lr_sweep(root: Path, sweep: str, desync: str) -> str:
    """The layout study's learning-rate sweep: validation loss at the sweep's horizon per layout and rate, a
    layout's best rate in bold once worse rates bracket it; a layout or rate without a finished run says so."""
    sweep_runs, desync_runs = study_runs(root, sweep), study_runs(root, desync, required=False)
    by_layout = {layout_name(s.config.model): s for s in sweeps(group_runs(sweep_runs + desync_runs), min_rates=1)}
    rates = sorted({lr for found in by_layout.values() for lr in found.losses})
    desync_layouts = sorted((name for name in by_layout if desync_every(name)), key=desync_every)
    rows = []
    for layout in (*LAYOUTS, *desync_layouts):
        found = by_layout.get(layout)
        best = found.choice.best if found is not None and found.bracketed else None
        cells = []
        for lr in rates:
            if found is None or lr not in found.losses:
                cells.append("not run")
            else:
                value = f"{found.losses[lr]:.4f}"
                cells.append(f"**{value}**" if lr == best else value)
        name = f"{layout} (t = {found.config.model.desync_tp})" if layout in desync_layouts else layout
        rows.append([name, *cells])
    steps = {found.horizon_step for found in by_layout.values()}
    also = f" and the {len(desync_runs)} in `{desync}`" if desync_runs else ""
    return (
        markdown_table(["layout \\ peak lr", *(f"{lr:g}" for lr in rates)], rows)
        + f"\n\nValidation loss in nats/byte at step {', '.join(map(str, sorted(steps)))}, one seed each; "
        f"from the {len(sweep_runs)} runs in `{sweep}`{also}. Bold: the layout's best rate, where a worse rate was "
        "tried on each side of it.\n"
    )


def horizon(root: Path, horizon: str, seeds: str) -> str:
    """The learning-rate check at the horizon: full-length seed-0 runs at another rate than the sweep chose (on a
    quarter of the tokens), each beside the seed-0 run of its layout at the chosen rate."""
    chosen = seed_runs(root, seeds)
    rows = []
    for run in study_runs(root, horizon):
        base = chosen[(run.residual, 0, run.config.model.n_layers)]
        other, at_chosen = final_val_loss(run), final_val_loss(base)
        rows.append(
            [
                run.residual,
                f"{base.config.train.optimizer.lr:g}",
                f"{at_chosen:.4f}",
                f"{run.config.train.optimizer.lr:g}",
                f"{other:.4f}",
                f"{other - at_chosen:+.4f}",
            ]
        )
    header = ["layout", "chosen lr", "val loss, chosen lr", "other lr", "val loss, other lr", "other − chosen"]
    groups = group_runs(list(chosen.values()))
    ladder = ladder_difference(loss_differences(groups, default_baseline(groups)))
    return (
        markdown_table(header, rows)
        + f"\n\nValidation loss (nats/byte) at step 2,200, seed 0, one run per cell; from `{horizon}` and "
        f"`{seeds}`. One seed: a difference inside the seeds' pair-to-pair sd (ladder − standard: "
        f"{ladder.sd:.3f} over {ladder.n} pairs) does not show that either rate is better.\n"
    )


def ladder_rate(root: Path, horizon: str, ladder_4e3: str, seeds: str) -> str:
    """The ladder at 4e-3 seed by seed (seed 0 is the horizon run), beside its 8e-3 run and standard's 8e-3 run of
    the same seed, with the paired differences to standard and between the two rates; their mean from two seeds,
    their t interval and p from three, with the Holm-adjusted p of ladder 4e-3 − standard over the family the
    protocol names (the seeds table's validation-loss comparisons and this one) and WikiText-2 beside it."""
    at_4e3 = study_runs(root, horizon) + study_runs(root, ladder_4e3, required=False)
    at_4e3 = [run for run in at_4e3 if run.residual == "ladder" and run.config.train.optimizer.lr == 4e-3]
    at_8e3 = seed_runs(root, seeds)
    rows, news, olds, bases = [], [], [], []
    for run in sorted(at_4e3, key=lambda r: r.seed):
        depth = run.config.model.n_layers
        ladder8, standard8 = at_8e3[("ladder", run.seed, depth)], at_8e3[("standard", run.seed, depth)]
        new, old, base = final_val_loss(run), final_val_loss(ladder8), final_val_loss(standard8)
        news, olds, bases = [*news, new], [*olds, old], [*bases, base]
        rows.append(
            [
                str(run.seed),
                *(f"{loss:.4f}" for loss in (old, new, base)),
                *(f"{gap:+.4f}" for gap in (old - base, new - base, new - old)),
            ]
        )
    pairs = len(rows)
    if pairs > 1:
        gaps = (paired_difference(olds, bases), paired_difference(news, bases), paired_difference(news, olds))
        rows.append(["mean", "", "", "", *(f"{gap.mean:+.4f}" for gap in gaps)])
    beside = ""
    if pairs >= PAIRS_FOR_AN_INTERVAL:
        rows.append(["95 % t interval", "", "", "", *map(interval, gaps)])
        rows.append(["p", "", "", "", *(f"{gap.p_value:.3f}" for gap in gaps)])
        groups = group_runs(list(at_8e3.values()))
        baseline = default_baseline(groups)
        family = [row.difference.p_value for row in loss_differences(groups, baseline) if row.difference]
        adjusted = holm([gaps[1].p_value, *family])[0]
        rows.append([f"Holm p ({len(family) + 1} comparisons)", "", "", "", "", f"{adjusted:.3f}", ""])
        ladder_8e3 = Group("ladder 8e-3", [at_8e3[("ladder", run.seed, run.config.model.n_layers)] for run in at_4e3])
        beside = _wikitext_beside(Group("ladder 4e-3", at_4e3), baseline, ladder_8e3)
    header = ["seed", "ladder 8e-3", "ladder 4e-3", "standard 8e-3", "ladder 8e-3 − standard", "ladder 4e-3 − standard"]
    header.append("ladder 4e-3 − 8e-3")
    return (
        markdown_table(header, rows)
        + f"\n\nValidation loss (nats/byte) at step 2,200, one run per cell; the ladder at 4e-3 from `{horizon}` "
        f"(seed 0) and `{ladder_4e3}`, the 8e-3 runs from `{seeds}`; {pairs} pair(s) by seed"
        + (
            ": no interval before three.\n"
            if pairs < PAIRS_FOR_AN_INTERVAL
            else " (paired t, as the seeds table). Holm p: ladder 4e-3 − standard adjusted with the seeds table's "
            "validation-loss comparisons (step 2 of the protocol); the other two columns are descriptions outside "
            f"that family.{beside}\n"
        )
    )


def _wikitext_beside(ladder: Group, baseline: Group, ladder_8e3: Group) -> str:
    """The protocol's second metric for ladder 4e-3 − standard 8e-3, paired by seed as the validation loss, and (a
    description outside Holm's family) for ladder 4e-3 − 8e-3, the rate's own effect on that metric; each with its
    own count of pairs (a run without the metric drops out of its pairs)."""
    figures, unit = [], ""
    for versus, name in ((baseline, "standard 8e-3"), (ladder_8e3, "ladder 8e-3")):
        for row in compare_groups([ladder, versus], versus):
            if row.group is ladder and row.metric.name.startswith("wikitext") and row.difference is not None:
                gap, unit = row.difference, row.metric.name.split(" ", 1)[1].replace("_", " ")
                figures.append(
                    f"ladder 4e-3 − {name} {gap.mean:+.4f} {interval(gap)}, p = {gap.p_value:.3f} ({gap.n} pairs)"
                )
    return f" WikiText-2 ({unit}), paired by seed: " + "; ".join(figures) + "." if figures else ""
