"""Turning lm-eval's results into our summary: ``{task: {metric: value}}``, the paper's averages, a console
table beside the paper's numbers (``ladder_train.paper``, its Table 3) and flat wandb keys."""

from __future__ import annotations

import dataclasses
import math

from ..paper import AVERAGED_TASKS, pretraining_row


def summarize(lm_eval_results: dict) -> dict[str, dict[str, float]]:
    """``{task: {metric: value}}`` from lm-eval's ``results`` section. Metric keys lose the ``,none`` filter
    suffix (other filters stay as ``metric/filter``); non-numeric entries (aliases, "N/A" stderrs) are dropped."""
    summary: dict[str, dict[str, float]] = {}
    for task, metrics in lm_eval_results.items():
        values = {}
        for key, value in metrics.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or "," not in key:
                continue
            metric, filter_name = key.split(",", 1)
            values[metric if filter_name == "none" else f"{metric}/{filter_name}"] = float(value)
        summary[task] = values
    return summary


def averages(summary: dict[str, dict[str, float]]) -> dict[str, float]:
    """The six-task averages (percent) when all six were evaluated: of acc, and of acc_norm where a task has it."""
    if not all(task in summary and "acc" in summary[task] for task in AVERAGED_TASKS):
        return {}
    acc = [summary[t]["acc"] for t in AVERAGED_TASKS]
    acc_norm = [summary[t].get("acc_norm", summary[t]["acc"]) for t in AVERAGED_TASKS]
    return {"avg6_acc": 100 * sum(acc) / len(acc), "avg6_acc_norm": 100 * sum(acc_norm) / len(acc_norm)}


def paper_results(model_name: str | None, residual: str | None) -> dict | None:
    """The paper's Table 3 row for this preset and layout, as a dict (``avg6``, ``wikitext_ppl``, ``tasks``,
    ``note``), or None where the paper has no such model."""
    row = pretraining_row(model_name, residual)
    return None if row is None else dataclasses.asdict(row)


def format_table(summary: dict[str, dict[str, float]], model_name: str | None, residual: str | None) -> str:
    """A plain-text table of every task and metric, with the paper's number beside ours where it exists."""
    paper = paper_results(model_name, residual) or {}
    rows = []
    for task, metrics in summary.items():
        for metric, value in metrics.items():
            if metric.endswith("_stderr") or "_stderr/" in metric:
                continue
            stderr = metrics.get(f"{metric}_stderr")
            ours = f"{value:.4f}" + (f" ± {stderr:.4f}" if stderr is not None and math.isfinite(stderr) else "")
            reference = paper.get("wikitext_ppl") if (task, metric) == ("wikitext", "word_perplexity") else None
            rows.append((task, metric, ours, "" if reference is None else f"{reference:.2f}"))
    for name, value in averages(summary).items():
        reference = paper.get("avg6")
        rows.append(
            (
                "average of 6",
                name.removeprefix("avg6_") + " (%)",
                f"{value:.2f}",
                f"{reference:.2f}" if reference else "",
            )
        )
    label = f"{model_name or '?'} {residual or '?'}"
    header = ("task", "metric", "ours", f"paper ({label})" if paper else "paper (none for this size/layout)")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(4)]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    if paper.get("note"):
        lines.append(f"paper's {label}: {paper['note']}")
    return "\n".join(lines)


def wandb_summary(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """Flat wandb keys: ``eval/arc_easy/acc``, ..., plus ``eval/avg6_acc`` when the six tasks are present."""
    flat = {f"eval/{task}/{metric}": value for task, metrics in results.items() for metric, value in metrics.items()}
    flat.update({f"eval/{name}": value for name, value in averages(results).items()})
    return flat
