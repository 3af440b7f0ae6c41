"""The tensor-parallel benchmark's rows as a table, a plot and the words around them."""

from __future__ import annotations

from pathlib import Path

from ..bench import latency_note, module_time_rows
from ..plots import new_figure, save_figure
from . import link_sweep
from .tables import markdown_table

# what every row of the section is read for (its table and plot): without one, a row is refused as it is read
NEEDED = ("layout", "batch", "tokens_per_s", "decode_ms_per_token")


def plot_bench(rows: list[dict], out: Path) -> Path:
    """Decode tokens/s per batch size: a bar per layout, and a marker for its no-communication ceiling."""
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    batches = sorted({r["batch"] for r in rows})
    width = 0.8 / len(layouts)
    fig, ax = new_figure(8, 5)
    for i, layout in enumerate(layouts):
        by_batch = {r["batch"]: r for r in rows if r["layout"] == layout}
        xs = [b + (i - (len(layouts) - 1) / 2) * width for b in range(len(batches))]
        heights = [by_batch.get(b, {}).get("tokens_per_s", 0) for b in batches]
        ax.bar(xs, heights, width, color=f"C{i}", label=layout, yerr=_run_range(by_batch, batches, heights), capsize=3)
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
    return save_figure(
        fig,
        ax,
        out / "tp_bench.png",
        title=f"TP={first.get('tp', '?')} generation throughput ({first.get('device', '')}{note})",
        grid_axis="y",
    )


def _run_range(by_batch: dict, batches: list[int], heights: list[float]):
    """Error bars from the lowest to the highest tokens/s of the timed runs (None for rows without samples)."""
    runs = [by_batch.get(b, {}).get("tokens_per_s_runs", {}).get("samples") for b in batches]
    if not all(runs):
        return None
    return [
        [h - min(r) for h, r in zip(heights, runs, strict=True)],
        [max(r) - h for h, r in zip(heights, runs, strict=True)],
    ]


def _p50_p90(row: dict, key: str) -> str:
    values = row.get(key)
    return "—" if not values else f"{values['p50']:.2f} ({values['p90']:.2f})"


def bench_table(rows: list[dict]) -> str:
    header = [
        "layout",
        "batch",
        "tokens/s",
        "decode ms/token",
        "TTFT ms p50 (p90)",
        "TPOT ms p50 (p90)",
        "speedup vs standard (end-to-end)",
        "decode speedup vs standard",
        "ceiling tokens/s",
        "comm share",
        "overlap efficiency",
        "all-reduces / decode step",
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
                _p50_p90(r, "ttft_ms"),
                _p50_p90(r, "tpot_ms"),
                "—" if speedup is None else f"{speedup:.3f}×",
                "—" if decode_speedup is None else f"{decode_speedup:.3f}×",
                "—" if not none else f"{none['tokens_per_s']:,.1f}",
                "—" if share is None else f"{100 * share:.1f} %",
                "—" if efficiency is None else f"{100 * efficiency:.0f} %",
                str(r.get("all_reduces_per_decode_step", "—")),  # counted by ladder-bench (older rows: none)
            ]
        )
    return markdown_table(header, table)


def bench_section(rows: list[dict], out: Path) -> list[str]:
    """The TP benchmark: one table and throughput plot, or, for rows of one model at several emulated
    latencies, the link sweep beside the serialised-link model's prediction."""
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
        timed = next(iter(module_time_rows(rows).values()), None)  # the smallest batch's, as ladder-bench prints
        if timed:
            lines += [latency_note(emulated, timed["module_ms"]) + f" (batch {timed['batch']}).", ""]
    lines += [
        "Speedup = end-to-end tokens/s over standard's (prefill included, the paper's definition); the decode-step "
        "speedup beside it.",
        "",
        bench_table(rows),
        "",
        *spread_notes(rows),
        f"![TP throughput]({plot_bench(rows, out).name})",
    ]
    return lines


def spread_notes(rows: list[dict]) -> list[str]:
    """Where a layout's tokens/s over the timed runs overlaps standard's (lowest to highest run), the difference
    the table shows is within the run-to-run spread: say so, rather than let a ratio of medians stand alone."""
    runs = {(r["layout"], r["batch"]): r.get("tokens_per_s_runs", {}).get("samples") for r in rows}
    within = []
    for (layout, batch), samples in runs.items():
        reference = runs.get(("standard", batch))
        if layout == "standard" or not samples or not reference or len(samples) < 2:
            continue
        if min(samples) <= max(reference) and min(reference) <= max(samples):
            within.append(f"{layout} at batch {batch}")
    if not within:
        return []
    return [
        f"Within the spread: the tokens/s of {', '.join(within)} overlap standard's over the timed runs (lowest to "
        "highest run, the error bars); those speedups are not told apart from 1 by these runs.",
        "",
    ]
