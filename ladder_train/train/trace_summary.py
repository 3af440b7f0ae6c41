"""What a torch.profiler chrome trace (``observability.py`` writes one per rank) says about a training step: the GPU's busy
share of the traced span, kernels, copies, memsets and CUDA runtime calls per optimizer step, the host's step time
and the kernels with the most GPU time.

    summarize_trace(json.load(open("RUN_DIR/profile/rank0_steps8-10.pt.trace.json")))

The busy share is the union of kernel, memcpy and memset intervals over the span from the first of them to the end of
the last, every traced step included: HolisticTraceAnalysis's temporal breakdown measures the same union but leaves
out the last profiled step, needs events with a stream, and has no runtime-call or per-step counts, so the summary is
counted here (benchmarks/gpu_check.py's ``profile`` rows are these figures).
"""

from __future__ import annotations

import statistics

GPU_EVENTS = {"kernel": "kernels", "gpu_memcpy": "copies", "gpu_memset": "memsets"}  # trace category: row label
RUNTIME_EVENTS = ("cuda_runtime", "cuda_driver")


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of the [start, end) intervals."""
    busy, current = 0.0, None
    for start, end in sorted(intervals):
        if current is None or start > current[1]:
            if current is not None:
                busy += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    return busy + (current[1] - current[0] if current else 0.0)


def summarize_trace(trace: dict | list, top: int = 10) -> dict:
    """A chrome trace (times in microseconds): the optimizer steps traced (distinct ``ProfilerStep#N``), the GPU's
    busy share of the span from its first event's start to its last event's end (the union of kernel, memcpy and
    memset intervals), kernels / copies / memsets / CUDA runtime and driver calls in all and per step, the host's
    mean step time, and the ``top`` kernels by GPU time. A trace without GPU events (a CPU run) has no busy share."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e]
    step_events = [e for e in complete if str(e.get("name", "")).startswith("ProfilerStep#")]
    steps = len({e["name"] for e in step_events})
    host_steps = [e["dur"] for e in step_events if e.get("cat") == "user_annotation"]
    gpu = [e for e in complete if e.get("cat") in GPU_EVENTS]
    counts = {label: sum(e["cat"] == cat for e in gpu) for cat, label in GPU_EVENTS.items()}
    counts["runtime_calls"] = sum(e.get("cat") in RUNTIME_EVENTS for e in complete)
    summary = {"steps_traced": steps, **counts}
    summary.update({f"{k}_per_step": (v / steps if steps else None) for k, v in counts.items()})
    summary["host_step_ms"] = statistics.mean(host_steps) / 1e3 if host_steps else None
    if not gpu:
        return summary | {"busy_share": None, "top_kernels": [], "note": "no GPU events in the trace (a CPU run)"}
    intervals = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu]
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    busy = busy_time(intervals)
    summary.update(
        span_ms=span / 1e3,
        busy_ms=busy / 1e3,
        busy_share=busy / span if span > 0 else None,
        gpu_ms={
            label: sum(float(e.get("dur", 0)) for e in gpu if e["cat"] == cat) / 1e3
            for cat, label in GPU_EVENTS.items()
        },
        top_kernels=top_kernels(gpu, top),
    )
    return summary


def top_kernels(gpu_events: list[dict], top: int) -> list[dict]:
    """The ``top`` kernels by GPU time: name (160 characters at most), milliseconds and calls."""
    by_name: dict[str, list] = {}
    for e in gpu_events:
        if e["cat"] == "kernel":
            entry = by_name.setdefault(e["name"], [0.0, 0])
            entry[0] += float(e.get("dur", 0))
            entry[1] += 1
    ranked = sorted(by_name.items(), key=lambda item: -item[1][0])[:top]
    return [{"name": name[:160], "ms": ms / 1e3, "count": n} for name, (ms, n) in ranked]
