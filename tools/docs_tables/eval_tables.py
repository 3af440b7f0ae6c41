"""Docs tables made from committed run results (each table's files: ``manifest.toml``): ladder-eval's results JSON
(``ladder-eval --out``; each cell with lm-eval's standard error where the task gives one), training runs'
``metrics.jsonl`` (medians and ranges over repeated runs) and benchmarks/token_files.py's rows."""

from __future__ import annotations

import statistics
from pathlib import Path

from ladder_train.report.runs import read_metrics
from ladder_train.report.tables import markdown_table

from .manifest import read_json


def _percent(metrics: dict, name: str) -> str:
    stderr = metrics.get(f"{name}_stderr")
    return f"{100 * metrics[name]:.1f}" + ("" if stderr is None else f" ± {100 * stderr:.1f}")


def _perplexity(value: float) -> str:
    return f"{value:,.2f}" if value < 1e4 else f"{value:.3g}"


def smollm2(root: Path, folder: str, models: dict[str, str]) -> str:
    """SmolLM2-135M-Instruct and its conversions to a (hybrid) ladder, as stored in ``folder``: held-out perplexity
    on FineWeb-Edu and WikiText-2, and four tasks on their first rows (``NAME_tasks.json``, ``NAME_wikitext.json``
    written by ladder-eval --out for each NAME of ``models``, shown under its label)."""
    return _smollm2_rows(root / folder, folder, models)


def _smollm2_rows(path: Path, folder: str, models: dict[str, str]) -> str:
    rows, notes = [], set()
    for name, label in models.items():
        tasks = read_json(path / f"{name}_tasks.json")
        wikitext = read_json(path / f"{name}_wikitext.json")["held_out"]
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
        raise ValueError(f"{folder}: the models were evaluated on different data sizes: {sorted(notes)}")
    header = [
        "model",
        "FineWeb-Edu ppl",
        "WikiText-2 ppl",
        "ARC-Easy acc",
        "PIQA acc",
        "OpenBookQA acc_norm",
        "LAMBADA acc (ppl)",
    ]
    return (
        markdown_table(header, rows)
        + f"\n\nPerplexity over {fineweb_tokens:,} FineWeb-Edu and {wikitext_tokens:,} WikiText-2 tokens; tasks on "
        f"their first {limit} rows, accuracy in % ± lm-eval's standard error; one evaluation per model "
        f"(`{folder}/*.json`).\n"
    )


def _last_record(run: Path) -> dict:
    return [r for r in read_metrics(run / "metrics.jsonl") if "tokens_per_s" in r][-1]


def _median_range(values: list[float], spec: str) -> str:
    return f"{statistics.median(values):{spec}} ({min(values):{spec}}–{max(values):{spec}})"


def bf16_cpu(root: Path, runs: str) -> str:
    """bf16 against fp32 training, runs ``{dtype}_{i}`` alternating under ``runs``: each run's last logged step
    (tokens/s over its log interval, step time, peak memory); the speed ratio within each pair i."""
    found = sorted((root / runs).glob("*_*/metrics.jsonl"))
    last = {p.parent.name: _last_record(p.parent) for p in found}
    pairs = sorted({name.split("_")[1] for name in last})
    rows = []
    for dtype in ("fp32", "bf16"):
        records = [last[f"{dtype}_{i}"] for i in pairs]
        rows.append(
            [
                dtype,
                _median_range([r["tokens_per_s"] for r in records], ",.0f"),
                _median_range([r["step_time_s"] for r in records], ".1f"),
                _median_range([r["peak_mem_gib"] for r in records], ".2f"),
            ]
        )
    ratios = [last[f"bf16_{i}"]["tokens_per_s"] / last[f"fp32_{i}"]["tokens_per_s"] for i in pairs]
    step = last[f"fp32_{pairs[0]}"]["step"]
    return (
        markdown_table(["dtype", "tokens/s", "step time s", "peak memory GiB"], rows)
        + f"\n\nbf16 / fp32 tokens/s within each pair: {_median_range(ratios, '.2f')}; {len(pairs)} alternating pairs, "
        f"each run's figures at its step {step} (the last log interval); medians (lowest–highest). Runs' "
        f"`metrics.jsonl` in `{runs}/`.\n"
    )


def token_files(rows: list[dict], path: str) -> str:
    """The token-file loader's tokens/s on rank 0 per folder, page cache and world size, against the estimated
    consumption of one GPU (``gpu_estimate``: computed, not measured), in the file's order."""
    body = []
    for r in rows:
        folder = (
            f"synthetic, {r['folder_tokens'] / 1e6:,.0f}M tokens"
            if r["folder"] == "synthetic"
            else "FineWeb sample, StarCoder"
        )
        need = r["gpu_estimate"]["tokens_per_s_gpu"]
        body.append(
            [
                folder,
                "cold" if r["cold"] else "warm",
                str(r["world_size"]),
                f"{r['sequences']:,}",
                f"{r['tokens_per_s_rank']:,.0f}",
                f"{r['tokens_per_s_rank'] / need:,.0f}x",
            ]
        )
    header = ["folder", "page cache", "world size", "sequences read by rank 0", "tokens/s per rank", "/ H100 estimate"]
    return markdown_table(header, body) + f"\n\nOne run per row; rows in `{path}`.\n"
