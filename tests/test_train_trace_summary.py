"""train/trace_summary.py: the summary of a chrome trace, on a hand-made trace and on a 1.2B H100 trace."""

import json

import pytest

from ladder_train.train.trace_summary import GPU_EVENTS, busy_time, summarize_trace


def event(cat: str, name: str, ts: float, dur: float, ph: str = "X") -> dict:
    return {"ph": ph, "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 0}


def handmade_trace() -> dict:
    """Two optimizer steps; GPU work 10-25 (two overlapping kernels), 30-36 (a copy and a memset overlapping),
    40-46 (a kernel with a shorter one inside): busy 15 + 6 + 6 = 27 of the span 10-46 = 36 us."""
    return {
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "python"}},
            event("user_annotation", "ProfilerStep#7", 0, 30),
            event("user_annotation", "ProfilerStep#8", 30, 20),
            event("gpu_user_annotation", "ProfilerStep#7", 2, 30),  # the same steps on the GPU's timeline: not work
            event("gpu_user_annotation", "ProfilerStep#8", 32, 20),
            event("cpu_op", "aten::mm", 1, 5),
            *[event("cuda_runtime", "cudaLaunchKernel", t, 1) for t in (1, 3, 5)],
            event("cuda_driver", "cuLaunchKernel", 7, 1),
            event("kernel", "gemm", 10, 10),
            event("kernel", "elementwise", 15, 10),
            event("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 30, 4),
            event("gpu_memset", "Memset (Device)", 33, 3),
            event("kernel", "gemm", 40, 6),
            event("kernel", "tiny", 41, 2),
            event("kernel", "a flow arrow, not an interval", 0, 100, ph="f"),
        ]
    }


def test_trace_summary_of_a_handmade_trace():
    s = summarize_trace(handmade_trace(), top=2)
    assert s["steps_traced"] == 2
    assert (s["kernels"], s["copies"], s["memsets"], s["runtime_calls"]) == (4, 1, 1, 4)
    assert (s["kernels_per_step"], s["copies_per_step"], s["memsets_per_step"]) == (2.0, 0.5, 0.5)
    assert s["runtime_calls_per_step"] == 2.0
    assert s["span_ms"] == pytest.approx(0.036) and s["busy_ms"] == pytest.approx(0.027)
    assert s["busy_share"] == pytest.approx(0.75)
    assert s["host_step_ms"] == pytest.approx(0.025)  # the CPU's ProfilerStep events, 30 and 20 us
    assert s["gpu_ms"] == pytest.approx({"kernels": 0.028, "copies": 0.004, "memsets": 0.003})
    assert s["top_kernels"] == [
        {"name": "gemm", "ms": pytest.approx(0.016), "count": 2},
        {"name": "elementwise", "ms": pytest.approx(0.010), "count": 1},
    ]


def test_trace_summary_without_gpu_events_has_no_busy_share():
    cpu_only = [e for e in handmade_trace()["traceEvents"] if e.get("cat") not in GPU_EVENTS]
    s = summarize_trace(cpu_only)
    assert s["busy_share"] is None and "no GPU events" in s["note"]
    assert (s["steps_traced"], s["kernels"], s["kernels_per_step"], s["top_kernels"]) == (2, 0, 0.0, [])


def test_busy_time_is_the_union_of_intervals():
    assert busy_time([]) == 0.0
    assert busy_time([(0, 10), (10, 20)]) == 20  # touching
    assert busy_time([(7, 9), (0, 5), (1, 2)]) == 7  # unsorted, nested
    assert busy_time([(0, 10), (2, 4), (3, 12), (20, 21)]) == 13


@pytest.mark.slow  # not a process, but ~15 s: reads the whole 1.2B trace
def test_trace_summary_of_the_h100_trace_agrees_with_the_hand_measurement(shared_dir):
    import gzip

    path = shared_dir / "gpu" / "2026-11-26" / "trace_1.2B_standard_mb2_compiled_steps8-10.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    s = summarize_trace(json.load(gzip.open(path)))
    # ../shared/gpu/README.md: busy 38.4 % of the traced span; per optimizer step ~23,100 kernels, ~6,400 copies,
    # ~1,700 memsets; nvjet 192x128 NNT the kernel with the most time (252.89 ms, 5,784 calls)
    assert s["steps_traced"] == 3 and round(100 * s["busy_share"], 1) == 38.4
    assert round(s["kernels_per_step"], -2) == 23100 and round(s["copies_per_step"], -2) == 6400
    assert round(s["memsets_per_step"], -2) == 1700
    assert s["top_kernels"][0]["name"].startswith("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT")
    assert s["top_kernels"][0]["count"] == 5784 and s["top_kernels"][0]["ms"] == pytest.approx(252.89, abs=0.01)
