"""What one TP rank's hardware does, measured beside ladder-bench's generations: one decode step's compute of
layer 0's attention and MLP (the module times ladder-predict calibrates on and the latency note compares with the
emulated link), and the peak memory of a batch size's runs."""

from __future__ import annotations

import resource
import statistics
import time

import torch


def peak_memory(device: torch.device) -> dict:
    """The peak memory of this batch size's runs on CUDA (allocated by tensors); on the CPU the process's peak
    resident set so far (it never goes down, so it covers every batch size measured before too)."""
    if device.type == "cuda":
        return {"peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30, "peak_memory_of": "cuda allocated"}
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_memory_gib": peak_kib / 2**20, "peak_memory_of": "process peak RSS (CPU)"}


def _kernel_ms(fn, device: torch.device, reps: int) -> float:
    """Median milliseconds of ``fn`` after 2 warm-up calls. On a GPU ``fn`` is captured once as a CUDA graph and
    its replays are timed with CUDA events: the kernels' own time, as the compiled decode step replays them,
    without the eager launch gaps that would otherwise fill the interval. On the CPU, host timers (the work is
    synchronous)."""
    if device.type == "cuda":
        fn = _as_cuda_graph(fn, device)
    samples = []
    for _ in range(reps + 2):
        if device.type == "cuda":
            begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            finish.record()
            finish.synchronize()
            samples.append(begin.elapsed_time(finish))
        else:
            start = time.perf_counter()
            fn()
            samples.append(1e3 * (time.perf_counter() - start))
    return statistics.median(samples[2:])


def _as_cuda_graph(fn, device: torch.device):
    """``fn`` recorded once into a CUDA graph (after a warm-up on a side stream, as capture requires); returns
    the replay."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


@torch.no_grad()
def module_times_ms(model, batch: int, pos: int, device, dtype, reps: int = 20) -> dict:
    """One decode step's compute for the attention and the MLP of layer 0 on this rank (no communication)."""
    layer = model.layers[0]
    model.setup_kv_cache(batch, pos + 1)  # attention reads a cache of ``pos`` keys, as in a decode step
    x = torch.randn(batch, 1, model.args.dim, device=device, dtype=dtype)
    cos, sin = model.rope_cos[pos : pos + 1], model.rope_sin[pos : pos + 1]
    out = {
        "attention": _kernel_ms(lambda: layer.attention(x, cos, sin, pos), device, reps),
        "mlp": _kernel_ms(lambda: layer.mlp(x), device, reps),
    }
    model.clear_kv_cache()
    return out
