"""``ladder-report [RUN_DIR ...] [--bench FILE.jsonl] --out DIR``: the runs side by side.

Reads each run's ``config.yaml``, ``metrics.jsonl`` and newest ``eval/step-N.json``, and the TP
benchmark's JSON lines, and writes ``DIR/report.md`` with a table in the manner of the paper's Table 3
and PNG plots (matplotlib): loss against tokens, learning rate, and TP decode tokens/s per batch size
with the no-communication ceiling. Runs that repeat one config under several seeds are also grouped
(``seed_groups``): mean ± sd per group and the difference to the first group with its uncertainty.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from . import seed_groups  # noqa: E402
from .config import ConfigError, load_config  # noqa: E402

# per task, the metric the paper's tables use (acc_norm where lm-eval has it) and whether lower is better
TASK_METRICS = {
    "wikitext": ("word_perplexity", True),
    "wikitext2_local": ("word_perplexity", True),
    "lambada_local": ("acc", False),
}


@dataclass
class Run:
    """One training run's numbers, as read from its folder."""

    path: Path
    name: str
    residual: str
    seed: int = 0
    config: object = None  # the run's resolved Config
    train: list[dict] = field(default_factory=list)  # {"step", "tokens", "loss", "lr", ...}
    val: list[dict] = field(default_factory=list)  # {"step", "tokens", "val_loss", "val_ppl"}
    eval_summary: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name if self.residual in self.name else f"{self.name} ({self.residual})"


def read_run(path: Path) -> Run:
    metrics = path / "metrics.jsonl"
    config = path / "config.yaml"
    for required in (metrics, config):
        if not required.is_file():
            raise ConfigError(f"{path}: not a run folder (missing {required.name})")
    cfg = load_config(config)
    run = Run(path=path, name=cfg.run.name, residual=cfg.model.residual, seed=cfg.run.seed, config=cfg)
    for number, line in enumerate(metrics.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"{metrics}:{number}: not a JSON line") from None
        if "val_loss" in record:
            run.val.append(record)
        elif "loss" in record:
            run.train.append(record)
    # a resumed run logs replayed steps again: keep the last record of each step
    run.train = list({r["step"]: r for r in run.train}.values())
    run.val = list({r["step"]: r for r in run.val}.values())
    evals = sorted((path / "eval").glob("step-*.json"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    if evals:
        run.eval_summary = json.loads(evals[-1].read_text()).get("summary", {})
    return run


def _tokens(record: dict, fallback_tokens_per_step: float | None) -> float | None:
    if "tokens" in record:
        return record["tokens"]
    return record["step"] * fallback_tokens_per_step if fallback_tokens_per_step else None


def final_train_loss(run: Run, last: int = 5) -> float | None:
    """Mean of the last ``last`` logged training losses (one step's loss is noisy)."""
    losses = [r["loss"] for r in run.train[-last:]]
    return statistics.fmean(losses) if losses else None


def train_tokens_per_s(run: Run) -> float | None:
    values = [r["tokens_per_s"] for r in run.train if r.get("tokens_per_s")]
    return statistics.median(values) if values else None


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


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# plots --------------------------------------------------------------------------------------------------


def plot_loss(runs: list[Run], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, run in enumerate(runs):
        color = f"C{i}"
        ax.plot(
            [r["tokens"] for r in run.train],
            [r["loss"] for r in run.train],
            color=color,
            alpha=0.8,
            label=f"{run.label} train",
        )
        if run.val:
            ax.plot(
                [r["tokens"] for r in run.val],
                [r["val_loss"] for r in run.val],
                color=color,
                linestyle="--",
                marker="o",
                markersize=3,
                label=f"{run.label} validation",
            )
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("Loss against tokens")
    ax.grid(alpha=0.3)
    ax.legend()
    path = out / "loss.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_lr(runs: list[Run], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for i, run in enumerate(runs):
        ax.plot([r["step"] for r in run.train], [r["lr"] for r in run.train], color=f"C{i}", label=run.label)
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title("Learning-rate schedule")
    ax.grid(alpha=0.3)
    ax.legend()
    path = out / "lr.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_bench(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"benchmark results {path} not found")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ConfigError(f"{path}:{number}: not a JSON line") from None
    return rows


def plot_bench(rows: list[dict], out: Path) -> Path:
    """Decode tokens/s per batch size: a bar per layout, and a marker for its no-communication ceiling."""
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    batches = sorted({r["batch"] for r in rows})
    width = 0.8 / len(layouts)
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, layout in enumerate(layouts):
        by_batch = {r["batch"]: r for r in rows if r["layout"] == layout}
        xs = [b + (i - (len(layouts) - 1) / 2) * width for b in range(len(batches))]
        ax.bar(xs, [by_batch.get(b, {}).get("tokens_per_s", 0) for b in batches], width, color=f"C{i}", label=layout)
        ceilings = [by_batch.get(b, {}).get("none", {}).get("tokens_per_s") for b in batches]
        points = [(x, c) for x, c in zip(xs, ceilings, strict=True) if c]
        if points:
            ax.scatter(
                *zip(*points, strict=True),
                marker="_",
                s=400,
                color="black",
                label="no-communication ceiling" if i == 0 else None,
            )
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s")
    first = rows[0]
    emulated = first.get("emulated_link_latency_ms")
    note = f", emulated link latency {emulated} ms" if emulated else ""
    ax.set_title(f"TP={first.get('tp', '?')} generation throughput ({first.get('device', '')}{note})")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    path = out / "tp_bench.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def bench_table(rows: list[dict]) -> str:
    header = [
        "layout",
        "batch",
        "tokens/s",
        "decode ms/token",
        "speedup vs standard (end-to-end)",
        "decode speedup vs standard",
        "ceiling tokens/s",
        "comm share",
        "overlap efficiency",
    ]
    table = []
    for r in rows:
        none = r.get("none", {})
        speedup = r.get("speedup_vs_standard")  # whole generation, prefill included
        decode_speedup = r.get("decode_speedup_vs_standard")  # decode step only, as ladder-bench prints it
        share = r.get("comm_share")
        efficiency = r.get("overlap_efficiency")
        table.append(
            [
                r["layout"],
                str(r["batch"]),
                f"{r['tokens_per_s']:,.1f}",
                f"{r['decode_ms_per_token']:.2f}",
                "—" if speedup is None else f"{speedup:.3f}×",
                "—" if decode_speedup is None else f"{decode_speedup:.3f}×",
                "—" if not none else f"{none['tokens_per_s']:,.1f}",
                "—" if share is None else f"{100 * share:.1f} %",
                "—" if efficiency is None else f"{100 * efficiency:.0f} %",
            ]
        )
    return markdown_table(header, table)


def bench_section(rows: list[dict], out: Path) -> list[str]:
    """The TP benchmark: one table and throughput plot, or, for rows of one model at several emulated
    latencies, the link sweep beside the serialised-link model's prediction."""
    from .inference import link_sweep
    from .inference.bench_results import latency_note

    lines = []
    emulated = rows[0].get("emulated_link_latency_ms")
    if link_sweep.is_sweep(rows):
        lines += [
            "The interconnect is **emulated**: one serialised link per TP group that holds every all-reduce X ms "
            "(an all-reduce starts when it is issued and the previous one has ended). Speedups are over standard "
            "at the same X; end-to-end = tokens/s with the prefill, the paper's definition. *Predicted*: the "
            "serialised-link timeline fed with this run's measured module times (no gloo cost).",
            "",
            markdown_table(*link_sweep.sweep_table(rows)),
            "",
            f"![link sweep]({link_sweep.plot_sweep(rows, out).name})",
        ]
        return lines
    if emulated:
        lines += [
            f"The interconnect is **emulated**: one serialised link that holds every all-reduce {emulated} ms "
            "(an all-reduce starts when it is issued and the previous one has ended).",
            "",
        ]
        module_ms = next((r["module_ms"] for r in rows if r.get("module_ms")), None)
        if module_ms:
            lines += [latency_note(emulated, module_ms) + ".", ""]
    lines += [
        "Speedup = end-to-end tokens/s over standard's (prefill included, the paper's definition); the decode-step "
        "speedup beside it.",
        "",
        bench_table(rows),
        "",
        f"![TP throughput]({plot_bench(rows, out).name})",
    ]
    return lines


def final_val_loss(run: Run) -> float:
    if not run.val:
        raise ConfigError(f"{run.path}: no validation loss in metrics.jsonl (set eval.val_every)")
    return run.val[-1]["val_loss"]


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


def write_report(run_dirs: list[Path], out: Path, bench_files: list[Path] = ()) -> Path:
    runs = [read_run(Path(d)) for d in run_dirs]  # every input is checked before anything is written
    bench_rows = read_bench(list(bench_files))
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# ladder-train report", ""]
    if runs:
        lines.append("Runs: " + ", ".join(f"`{r.path}`" for r in runs) + ".")
        lines += ["", "## Results", ""]
        header = ["", *(r.label for r in runs), f"{runs[-1].name} vs {runs[0].name}" if len(runs) > 1 else "—"]
        lines.append(markdown_table(header, results_table(runs)))
        lines.append("")
        groups = seed_groups.group_runs(runs)
        if any(len(group.runs) > 1 for group in groups):
            lines += ["## Seeds", "", *seeds_section(groups, out), ""]
        lines += ["## Loss", "", f"![loss against tokens]({plot_loss(runs, out).name})", ""]
        lines += ["## Learning rate", "", f"![learning rate]({plot_lr(runs, out).name})", ""]
    if bench_rows:
        lines += ["## Tensor-parallel generation", "", *bench_section(bench_rows, out), ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="ladder-report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs", nargs="*", type=Path, help="run folders (the first is the baseline of the relative column)"
    )
    parser.add_argument("--bench", action="append", type=Path, default=[], help="ladder-bench JSON lines (repeatable)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.runs and not args.bench:
        parser.error("give run folders, --bench files, or both")
    report = write_report(args.runs, args.out, args.bench)
    print(f"report written to {report}")
    return 0


if __name__ == "__main__":
    from .cli import report

    sys.exit(report())
