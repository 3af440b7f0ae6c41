"""ladder-bench's results: the medians and distributions of the timed runs, the derived figures (speedups over
standard: end-to-end, the paper's, and of the decode step; the no-communication ceiling, the communication share and
the overlap efficiency) and the console table. The rows' fields and their file: ``bench_schema.py``."""

from __future__ import annotations

import statistics


def percentile(ordered: list[float], q: float) -> float:
    """The q-th percentile of sorted values, linear between the two nearest ranks (numpy's default)."""
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: list[float]) -> dict:
    """p50 / p90 / p99, mean and sd (None for one value) of per-run measurements, with the samples in run order."""
    ordered = sorted(values)
    return {
        "p50": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else None,
        "samples": list(values),
    }


def summarize(samples: list[tuple[float, float, float]], batch: int, gen_len: int) -> dict:
    """Medians (the headline figures), and the distributions serving benchmarks report: time to first token
    (TTFT: the prefill, which produces token 1) and time per output token after it (TPOT: one decode step), each
    with p50 / p90 / p99, mean, sd and the raw per-run samples; end-to-end tokens/s per run likewise."""
    prefill, decode, total = zip(*samples, strict=True)
    return {
        "prefill_ms": 1e3 * statistics.median(prefill),
        "decode_ms_per_token": 1e3 * statistics.median(decode),
        "tokens_per_s": batch * gen_len / statistics.median(total),
        "ttft_ms": distribution([1e3 * t for t in prefill]),
        "tpot_ms": distribution([1e3 * t for t in decode]),
        "tokens_per_s_runs": distribution([batch * gen_len / t for t in total]),
    }


def derive(rows: list[dict]) -> None:
    """Speedups against the standard row of the same model shape and batch size, the ceiling, the
    communication share and, for the ladder, the overlap efficiency (decode step), added to each row in place."""
    standard = {(r["shape"], r["batch"]): r for r in rows if r["layout"] == "standard"}
    for row in rows:
        ref = standard.get((row["shape"], row["batch"]))
        if ref is None:
            continue
        t_std, t = ref["decode_ms_per_token"], row["decode_ms_per_token"]
        row["speedup_vs_standard"] = row["tokens_per_s"] / ref["tokens_per_s"]
        row["decode_speedup_vs_standard"] = t_std / t
        if "none" in row and "none" in ref:
            t_none_std, t_none = ref["none"]["decode_ms_per_token"], row["none"]["decode_ms_per_token"]
            row["ceiling_decode_speedup_vs_standard"] = t_std / t_none
            row["comm_share"] = 1 - t_none_std / t_std
            saveable = min(t_std - t_none_std, t_none_std)
            # overlap is what the ladder does; parallel saves by halving its all-reduces, which this would misname
            if row["layout"] == "ladder" and saveable > 0:
                row["overlap_efficiency"] = (t_std - t) / saveable


def module_time_rows(rows: list[dict]) -> dict[str, dict]:
    """Each model's row whose module times the closing lines and the report quote: its smallest batch's (module
    times are measured on every layout's row; standard's where it has them)."""
    chosen: dict[str, dict] = {}
    for r in sorted((r for r in rows if r.get("module_ms")), key=lambda r: (r["layout"] != "standard", r["batch"])):
        chosen.setdefault(r.get("model", ""), r)
    return chosen


def latency_note(link_latency_ms: float, module_ms: dict) -> str:
    """How the emulated latency X compares with one module's decode compute c, which decides what overlap
    can hide: below it, each all-reduce can vanish behind the next module; above it, the serialised link
    is the bottleneck (busy X per all-reduce, back to back), so the ladder's decode speedup is bounded
    near (c + X) / X = 1 + c / X, with c the mean of the modules' compute (each all-reduce hides behind one module)."""
    shortest = min(module_ms.values())
    ratio = link_latency_ms / shortest
    times = ", ".join(f"{k} {v:.2f} ms" for k, v in module_ms.items())
    if ratio <= 1:
        return f"Emulated X = {link_latency_ms:g} ms is {ratio:.2f}x the shorter module's decode compute ({times}): overlap can hide it all"
    bound = 1 + statistics.mean(module_ms.values()) / link_latency_ms
    return (
        f"Emulated X = {link_latency_ms:g} ms is {ratio:.1f}x the shorter module's decode compute ({times}): "
        f"the serialised link is the bottleneck, so the ladder's decode speedup is bounded near 1 + c/X = {bound:.2f}x, "
        "c the mean of the two modules' compute"
    )


def print_table(rows: list[dict], env: dict):
    emulated = env["emulated_link_latency_ms"]
    bandwidth = env.get("link_bandwidth_gbs")
    print(
        f"\nladder-bench: {env['device']}, TP={env['tp']}, {env['backend']}, {env['dtype']}, "
        f"torch {env['torch']}, compiled={env['compiled']}"
        + (f" ({env['compile_backend']}, {env['compilations']} compilations)" if env["compiled"] else "")
        + (
            f", EMULATED serialised link: {emulated} ms per all-reduce"
            + (f" + bytes / {bandwidth} GB/s" if bandwidth else "")
            + " (an emulation, not real hardware)"
            if env["link"].startswith("emulated")
            else ""
        )
    )
    # the model and layout columns as wide as their longest entry, two spaces apart: a checkpoint path is not cut
    model_w = max([12, *(len(str(r["model"])) for r in rows)]) + 2
    layout_w = max([8, *(len(str(r["layout"])) for r in rows)]) + 2
    head = (
        f"{'model':<{model_w}}{'layout':<{layout_w}}{'batch':>6}{'prefill ms':>12}{'decode ms/tok':>15}{'ARs/step':>9}{'tok/s':>10}"
        f"{'speedup':>9}{'decode':>8}{'no-comm ms/tok':>16}{'ceiling':>9}{'comm share':>12}{'overlap eff':>13}"
    )
    print(head + "\n" + "-" * len(head))

    def fmt(value, spec, width):
        return format(value, f">{width}{spec}") if value is not None else "-".rjust(width)

    for r in rows:
        none = r.get("none", {})
        print(
            f"{r['model']:<{model_w}}{r['layout']:<{layout_w}}{r['batch']:>6}{r['prefill_ms']:>12.2f}{r['decode_ms_per_token']:>15.3f}"
            f"{fmt(r.get('all_reduces_per_decode_step'), 'd', 9)}{r['tokens_per_s']:>10.1f}"
            f"{fmt(r.get('speedup_vs_standard'), '.2f', 8)}x"
            f"{fmt(r.get('decode_speedup_vs_standard'), '.2f', 7)}x"
            f"{fmt(none.get('decode_ms_per_token'), '.3f', 16)}{fmt(r.get('ceiling_decode_speedup_vs_standard'), '.2f', 8)}x"
            f"{fmt(r.get('comm_share'), '.1%', 12)}{fmt(r.get('overlap_efficiency'), '.1%', 13)}"
        )
    for model, r in module_time_rows(rows).items():
        print(
            f"{model}: measured decode compute per module on one rank (layer 0, batch {r['batch']}): "
            + ", ".join(f"{k} {v:.3f} ms" for k, v in r["module_ms"].items())
        )
        if emulated:
            print(f"{model}: {latency_note(emulated, r['module_ms'])}")
    print(
        "ARs/step: all-reduces per decode step, counted; "
        "speedup: end-to-end tokens/s (prefill included, the paper's definition) over standard's; decode, ceiling: "
        "decode ms/tok of standard / of this row; overlap eff (decode) = (t_std - t) / min(t_std - t_none, t_none)"
    )
