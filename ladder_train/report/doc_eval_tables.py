"""Docs tables made from committed ladder-eval results (``ladder-eval --out``; registered in
``docs_tables.TABLES``): each cell with lm-eval's standard error where the task gives one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from .tables import markdown_table

SMOLLM2 = Path("docs/results/smollm2_conversion")
SMOLLM2_MODELS = {
    "original": "original (30 standard layers)",
    "ladder15": "upper 15 layers ladder",
    "ladder30": "all 30 layers ladder",
}


def _percent(metrics: dict, name: str) -> str:
    stderr = metrics.get(f"{name}_stderr")
    return f"{100 * metrics[name]:.1f}" + ("" if stderr is None else f" ± {100 * stderr:.1f}")


def _perplexity(value: float) -> str:
    return f"{value:,.2f}" if value < 1e4 else f"{value:.3g}"


def smollm2_conversion(root: Path) -> str:
    """SmolLM2-135M-Instruct and its conversions to a (hybrid) ladder without retraining: held-out perplexity on
    FineWeb-Edu and WikiText-2, and four tasks on their first 200 rows."""
    rows, notes = [], set()
    for name, label in SMOLLM2_MODELS.items():
        tasks = json.loads((root / SMOLLM2 / f"{name}_tasks.json").read_text())
        wikitext = json.loads((root / SMOLLM2 / f"{name}_wikitext.json").read_text())["held_out"]
        summary, fineweb = tasks["summary"], tasks["held_out"]
        lambada = summary["lambada_local"]
        rows.append(
            [
                label,
                _perplexity(fineweb["perplexity"]),
                _perplexity(wikitext["perplexity"]),
                _percent(summary["arc_easy_local"], "acc"),
                _percent(summary["piqa_local"], "acc"),
                _percent(summary["openbookqa_local"], "acc_norm"),
                f"{_percent(lambada, 'acc')} ({_perplexity(lambada['perplexity'])})",
            ]
        )
        notes.add((fineweb["tokens"], wikitext["tokens"], tasks["limit"]))
    (fineweb_tokens, wikitext_tokens, limit), *rest = sorted(notes)
    if rest:
        raise ValueError(f"{SMOLLM2}: the models were evaluated on different data sizes: {sorted(notes)}")
    header = ["model", "FineWeb-Edu ppl", "WikiText-2 ppl", "ARC-Easy acc", "PIQA acc", "OpenBookQA acc_norm",
              "LAMBADA acc (ppl)"]  # fmt: skip
    return (
        markdown_table(header, rows)
        + f"\n\nPerplexity over {fineweb_tokens:,} FineWeb-Edu and {wikitext_tokens:,} WikiText-2 tokens; tasks on "
        f"their first {limit} rows, accuracy in % ± lm-eval's standard error; one evaluation per model "
        f"(`{SMOLLM2}/*.json`).\n"
    )


TABLES: dict[str, Callable[[Path], str]] = {"smollm2-conversion": smollm2_conversion}
