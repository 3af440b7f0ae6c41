"""The emulated-link sweep: ladder-bench rows of one model at several link latencies X, beside what the
serialised-link model predicts from the measured module times (ladder-report's section and docs/benchmarks.md's
table).

The prediction is ``ladder-predict``'s timeline (``predict/perfmodel.py``: ``step_ops`` / ``simulate``) fed with the
rows' own measurements: the per-module decode compute on one rank (``module_ms``), the rest of the
step (embedding, final norm, head: the no-communication decode time minus L x (attention + MLP)), and a
link that holds every all-reduce X ms on one serialised channel. It leaves out what gloo itself costs on
top of X, so it is the curve an ideal emulated link would give; the distance of the measured points from
it is what gloo and the shared cores add.
"""

from __future__ import annotations

from pathlib import Path

from ..plots import new_figure, save_figure
from ..predict import shape_from_fields, simulate, step_ops


def is_sweep(rows: list[dict]) -> bool:
    """Rows of one model shape and batch measured at more than one emulated latency."""
    keys = {(r.get("shape"), r["batch"]) for r in rows}
    return len(keys) == 1 and len({r.get("emulated_link_latency_ms", 0) for r in rows}) > 1


def predicted_decode_ms(row: dict, latency_ms: float) -> float:
    """The serialised-link model's decode step (ms) for this row's model, layout and measured compute."""
    shape = shape_from_fields(row["shape"], row["model_args"], tied=True, origin=row["shape"])
    attention, mlp = row["module_ms"]["attention"], row["module_ms"]["mlp"]
    rest = max(row["none"]["decode_ms_per_token"] - shape.n_layers * (attention + mlp), 0.0)
    times = {"embed": 0.0, "attention": attention, "mlp": mlp, "parallel": attention + mlp, "head": rest}
    args = shape.layout_args(row["layout"], row["tp"])  # a desync row all-reduces only where its pattern says
    ops = step_ops(args.layer_layouts(), times, comm=True, reduces=args.layer_reduces())
    return simulate(ops, lambda _module: [("link", latency_ms, 0.0)])


def sweep_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Per latency and layout: measured decode ms, decode and end-to-end speedup over standard, the
    predicted decode speedup, and the overlap efficiency."""
    header = [
        "X (ms)",
        "X / module",
        "layout",
        "decode ms/token",
        "end-to-end speedup",
        "decode speedup",
        "predicted decode speedup",
        "overlap efficiency",
    ]
    table = []
    for row in sorted(rows, key=lambda r: (r["emulated_link_latency_ms"], r["layout"] != "standard")):
        x = row["emulated_link_latency_ms"]
        standard = next(r for r in rows if r["layout"] == "standard" and r["emulated_link_latency_ms"] == x)
        predicted = predicted_decode_ms(standard, x) / predicted_decode_ms(row, x)
        efficiency = row.get("overlap_efficiency")
        table.append(
            [
                f"{x:g}",
                f"{x / module_ms(standard):.2f}",
                row["layout"],
                f"{row['decode_ms_per_token']:.1f}",
                f"{row['speedup_vs_standard']:.2f}×",
                f"{row['decode_speedup_vs_standard']:.2f}×",
                f"{predicted:.2f}×",
                "—" if efficiency is None else f"{100 * efficiency:.0f} %",
            ]
        )
    return header, table


def module_ms(row: dict) -> float:
    """One module's decode compute: the mean of attention and MLP, the unit of the sweep's X."""
    return (row["module_ms"]["attention"] + row["module_ms"]["mlp"]) / 2


def plot_sweep(rows: list[dict], out: Path) -> Path:
    """Decode speedup over standard against X / module: measured points, predicted curve per layout."""
    fig, ax = new_figure(8, 5)
    unit = module_ms(next(r for r in rows if r["layout"] == "standard"))
    latencies = sorted({r["emulated_link_latency_ms"] for r in rows})
    grid = [latencies[0] + (latencies[-1] - latencies[0]) * i / 60 for i in range(61)]
    for i, layout in enumerate(("parallel", "ladder")):
        measured = sorted(
            (r["emulated_link_latency_ms"], r["decode_speedup_vs_standard"]) for r in rows if r["layout"] == layout
        )
        if not measured:
            continue
        ax.plot([x / unit for x, _ in measured], [s for _, s in measured], "o", color=f"C{i + 1}", label=f"{layout}")
        reference = {r["layout"]: r for r in rows if r["emulated_link_latency_ms"] == latencies[-1]}
        curve = [
            predicted_decode_ms(reference["standard"], x) / predicted_decode_ms(reference[layout], x) for x in grid
        ]
        ax.plot([x / unit for x in grid], curve, "-", color=f"C{i + 1}", alpha=0.6, label=f"{layout}, predicted")
    ax.axhline(1.0, color="C0", lw=1, label="standard")
    first = rows[0]
    return save_figure(
        fig,
        ax,
        out / "link_sweep.png",
        title=f"TP={first.get('tp')} {first['shape']}, batch {first['batch']} (emulated serialised link)",
        xlabel="emulated all-reduce latency X / one module's decode compute",
        ylabel="decode speedup over standard",
    )
