"""``ladder-report [RUN_DIR ...] [--bench FILE.jsonl] --out DIR``: the runs side by side.

Reads each run's ``config.yaml``, ``metrics.jsonl`` and newest ``eval/step-N.json``, and the TP
benchmark's JSON lines, and writes ``DIR/report.md`` with a table in the manner of the paper's Table 3
and PNG plots (matplotlib): loss against tokens, learning rate, and TP decode tokens/s per batch size
with the no-communication ceiling. Runs that repeat one config under several seeds are also grouped
(the ``study`` package): mean ± sd per group and the difference to the first group with its uncertainty. A study
(``ladder-train study``; give its folder) adds each layout's learning-rate curve and best rate, and the paired
differences to the baseline with 95 % intervals, also over training as a plot.
"""

from __future__ import annotations

from pathlib import Path

from ..bench_schema import read_bench
from ..config import ConfigError
from ..files import write_text
from ..option_errors import OptionError
from ..study import Group, default_baseline, group_runs, seeded, sweeps
from .layout_chart import layout_section
from .runs import Run, read_run
from .study import comparison_section, plot_paired_validation, seeds_section, sweep_section
from .tables import markdown_table, plot_loss, plot_lr, results_table, runs_table
from .tp_bench import NEEDED as BENCH_NEEDED
from .tp_bench import bench_section

__all__ = ["Run", "find_runs", "read_run", "write_report"]

SIDE_BY_SIDE = 4  # up to this many runs named one by one are columns; more, or a study's, are rows


def find_runs(paths: list[Path]) -> list[Path]:
    """Run folders as given; a folder that is not a run but holds runs (a study's folder, one or two levels
    down) stands for them, in name order."""
    found = []
    for path in map(Path, paths):
        if _is_run(path):
            found.append(path)  # read_run names what is missing
            continue
        inside = sorted({p.parent for p in [*path.glob("*/metrics.jsonl"), *path.glob("*/*/metrics.jsonl")]})
        if not inside:
            raise ConfigError(f"{path}: not a run folder (missing metrics.jsonl), nor a study folder holding runs")
        found.extend(inside)
    return found


def _is_run(path: Path) -> bool:
    return (path / "metrics.jsonl").is_file() or not path.is_dir()


def write_report(
    run_dirs: list[Path],
    out: Path,
    bench_files: list[Path] = (),
    baseline: str | None = None,
    resolution: float | None = None,
    predictions: Path | None = None,
) -> Path:
    runs = [read_run(path) for path in find_runs(run_dirs)]  # every input is checked before anything is written
    groups = group_runs(runs)
    if baseline is not None:
        _baseline(_compared(groups), baseline)
    bench_rows = [row for path in bench_files for row in read_bench(path, need=BENCH_NEEDED)]
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# ladder-train report", ""]
    if runs:
        lines.append("Runs: " + ", ".join(f"`{r.path}`" for r in runs) + ".")
        lines += ["", "## Results", ""]
        side_by_side = len(runs) <= SIDE_BY_SIDE and all(map(_is_run, run_dirs))
        if side_by_side:
            # runs named one by one, in the order their reader chose: the last one relative to the first
            header = ["", *(r.label for r in runs), f"{runs[-1].name} vs {runs[0].name}" if len(runs) > 1 else "—"]
            lines.append(markdown_table(header, results_table(runs)))
        else:  # a study's runs are in name order, which makes no baseline: its comparisons are the sections below
            lines.append(markdown_table(*runs_table(runs)))
        lines.append("")
        lines += _study_sections(groups, out, baseline, resolution, predictions)
        # runs named one by one keep a line and a legend entry each, even two seeds of one configuration
        drawn = [Group(label=run.label, runs=[run]) for run in runs] if side_by_side else groups
        lines += ["## Loss", "", f"![loss against tokens]({plot_loss(drawn, out).name})", ""]
        lines += ["## Learning rate", "", f"![learning rate]({plot_lr(drawn, out).name})", ""]
    if bench_rows:
        lines += ["## Tensor-parallel generation", "", *bench_section(bench_rows, out), ""]
    report = out / "report.md"
    write_text(report, "\n".join(lines))
    return report


def _study_sections(
    groups: list[Group], out: Path, baseline: str | None, resolution: float | None, predictions: Path | None = None
) -> list[str]:
    lines = []
    lr_sweeps = sweeps(groups)
    if lr_sweeps:
        lines += ["## Learning-rate sweep", "", *sweep_section(lr_sweeps, out), ""]
    repeated = seeded(groups)
    if repeated:
        lines += ["## Seeds", "", *seeds_section(groups, out), ""]
        compared = _compared(groups)
        base = _baseline(compared, baseline)
        if len(compared) > 1:
            lines += ["## Paired comparison", "", *comparison_section(compared, base, resolution), ""]
            plot = plot_paired_validation(compared, base, out, resolution)
            lines += [f"![paired validation differences]({plot.name})", ""]
            if predictions is not None:
                lines += ["## Layouts: quality, communication, predicted speed", ""]
                lines += [*layout_section(compared, base, predictions, out), ""]
    return lines


def _compared(groups: list[Group]) -> list[Group]:
    """The groups of seeds, labelled among themselves: what tells them apart, not the sweep's runs."""
    return group_runs([run for group in seeded(groups) for run in group.runs])


def _baseline(groups: list[Group], label: str | None) -> Group:
    """The group labelled ``label``, or the default baseline (the deepest standard group) without one."""
    if label is None:
        return default_baseline(groups)
    matches = [group for group in groups if group.label == label]
    if not matches:
        labels = ", ".join(group.label for group in groups)
        raise OptionError(
            "{baseline} {label!r}: no group of seeds has that label; groups: {labels}", label=label, labels=labels
        )
    return matches[0]
