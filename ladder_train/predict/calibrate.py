"""``ladder-predict calibrate --out FILE.yaml``: measure this machine's ``cpu`` profile, as ladder-bench
runs it: TP = 2 gloo ranks on the CPU, one thread each, fp32, eager.

Both ranks measure at the same time, so they share the cores and the memory bandwidth as in a benchmark:
- matmul rate: a 1024^3 fp32 matmul (the peak a batch-64 decode step's GEMMs can reach);
- memory bandwidth: a matrix-vector product over a 128 MB weight (what a batch-1 decode step does);
- the fixed cost of one eager op (dispatch), from a loop of tiny adds, and of the project's own attention
  block, MLP block and decode-step wrapper on a model too small for data movement to count;
- gloo all-reduce time by size, fitted to alpha + 2 (p - 1) / p x bytes / busbw;
- interference: gloo's threads run on the cores the ranks compute on, so an all-reduce in flight slows the
  compute beside it. Measured as the compute time lost while an all-reduce of 1 MB runs under a longer
  stretch of matrix-vector work, over that all-reduce's own time: the fraction of compute speed lost.
Takes ~1 minute. On a shared machine the figures are distorted: calibrate on a quiet one.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time

from ..files import write_text
from ..option_errors import OptionError

PROG = "ladder-predict calibrate"
SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22)  # all-reduce bytes for the alpha-beta fit


def fit_alpha_beta(sizes: list[float], seconds: list[float], tp: int = 2) -> tuple[float, float]:
    """t = alpha + slope x bytes, least squares on the relative error (weights 1/t^2, so the small sizes
    that set alpha count as much as the large ones); returns (alpha seconds, busbw bytes/s) with the ring
    convention busbw = 2 (p - 1) / p / slope. A non-positive slope (noise) gives a practically infinite busbw."""
    w = [1 / t**2 for t in seconds]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, sizes, strict=True)) / sw
    my = sum(wi * y for wi, y in zip(w, seconds, strict=True)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, sizes, strict=True))
    slope = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, sizes, seconds, strict=True)) / sxx
    alpha = my - slope * mx
    busbw = 2 * (tp - 1) / tp / slope if slope > 0 else 1e15
    return max(alpha, 0.0), busbw


def _median_time(fn, reps: int) -> float:
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _rank(rank: int, world: int, port: int, reps: int, queue):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ..parallel import init_distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # as ladder-bench's spawned ranks
    init_distributed(rank=rank, world_size=world, cpu=True)
    torch.manual_seed(rank)
    out = {}

    def both(fn, reps_):
        dist.barrier()
        return _median_time(fn, reps_)

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    torch.mm(a, b)
    out["matmul_flops"] = 2 * 1024**3 / both(lambda: torch.mm(a, b), reps)
    weight, x = torch.randn(8192, 4096), torch.randn(1, 4096)
    F.linear(x, weight)
    gemv_s = both(lambda: F.linear(x, weight), reps)
    out["gemv_bytes_s"] = weight.numel() * 4 / gemv_s
    tiny = torch.zeros(4)
    out["op_s"] = both(lambda: [tiny.add(1.0) for _ in range(2000)], reps) / 2000
    out.update(_block_overheads(both, reps))
    times = []
    for size in SIZES:
        buf = torch.ones(size // 4)
        dist.all_reduce(buf)
        times.append(both(lambda buf=buf: dist.all_reduce(buf), 4 * reps))
    out["allreduce_s"] = times
    # interference: an async all-reduce of 1 MB under ~4x its time of matrix-vector work
    buf = torch.ones((1 << 20) // 4)
    ar_s = times[SIZES.index(1 << 20)]
    n_gemv = max(1, round(4 * ar_s / gemv_s))

    def work():
        for _ in range(n_gemv):
            F.linear(x, weight)

    alone = both(work, reps)

    def overlapped():
        handle = dist.all_reduce(buf, async_op=True)
        work()
        handle.wait()

    together = both(overlapped, reps)
    out["interference"] = min(max((together - alone) / ar_s, 0.0), 1.0)
    out["overlap_raw"] = {"allreduce_1mb_s": ar_s, "work_alone_s": alone, "work_with_allreduce_s": together}
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        queue.put(out)


def _block_overheads(both, reps: int) -> dict:
    """Fixed eager costs of the project's own blocks, on a model so small (hidden 64) that data movement is
    negligible: one attention block (norm, attention over the cache, residual add), one MLP block, and
    what a decode step adds around its layers (embedding, final norm, head, sampling, the Python loop)."""
    import torch

    from ..inference import Generator, next_tokens
    from ..model import ModelArgs, Transformer

    args = ModelArgs(vocab_size=64, dim=64, n_layers=2, n_heads=4, ffn_dim=128, max_seq_len=64)
    model = Transformer(args).eval()
    gen = Generator(model)
    gen.setup(1, 64)
    layer, pos, loops = model.layers[0], 16, 50
    r, tokens = torch.randn(1, 1, 64), torch.zeros(1, dtype=torch.long)
    cos, sin = model.rope_cos[pos : pos + 1], model.rope_sin[pos : pos + 1]

    def repeat(fn):
        def run():
            for _ in range(loops):
                fn()

        return run

    with torch.no_grad():
        attn = both(repeat(lambda: r + layer.attention(layer.attention_norm(r), cos, sin, pos)), reps) / loops
        mlp = both(repeat(lambda: r + layer.mlp(layer.mlp_norm(r))), reps) / loops
        step = both(repeat(lambda: next_tokens(gen.decode_step(tokens, pos))), reps) / loops
    return {"attention_s": attn, "mlp_s": mlp, "step_s": max(step - args.n_layers * (attn + mlp), 0.0)}


def measure(reps: int = 5) -> dict:
    import torch.multiprocessing as mp

    from ..parallel import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, reps, queue)) for r in range(2)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join()
    return result


def profile_yaml(m: dict) -> str:
    """The ``cpu`` profile as YAML text, with the raw measurements in comments."""
    import torch

    alpha, busbw = fit_alpha_beta(list(SIZES), m["allreduce_s"])
    stamp = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} ({os.cpu_count()} cores), torch {torch.__version__}"
    times = ", ".join(f"{s} B: {1e6 * t:.0f} us" for s, t in zip(SIZES, m["allreduce_s"], strict=True))
    raw = m["overlap_raw"]
    return f"""# Written by `ladder-predict calibrate`, {stamp}.
# TP = 2 gloo ranks, one thread each, fp32, eager, both ranks measuring at once. Efficiencies are 1: the
# rates below are already what the kernels achieved. Measured, not assumed; a busy machine distorts them.
cpu:
  description: this machine, TP = 2 over gloo, 1 thread per rank, fp32, eager (as ladder-bench runs)
  calibrated: "{stamp}"
  peak_tflops: {m["matmul_flops"] / 1e12:.6f}   # 1024^3 fp32 matmul per rank: {m["matmul_flops"] / 1e9:.1f} GFLOP/s
  mem_bw_gbs: {m["gemv_bytes_s"] / 1e9:.3f}     # matrix-vector product over a 128 MB weight
  compute_eff: 1.0
  mem_eff: 1.0
  kernel_us: {1e6 * m["op_s"]:.2f}        # one eager op (a tiny add) dispatched and run
  # the project's blocks at hidden 64 (data movement negligible): their fixed eager cost, used instead of
  # kernel_us x a guessed op count
  attention_overhead_us: {1e6 * m["attention_s"]:.1f}
  mlp_overhead_us: {1e6 * m["mlp_s"]:.1f}
  step_overhead_us: {1e6 * m["step_s"]:.1f}
  dtype_bytes: 4
  compiled: false
  gpus_per_node: 2
  origin:
    peak_tflops: "measured: {PROG} ({stamp}): a 1024^3 fp32 matmul per rank, both ranks at once"
    mem_bw_gbs: "measured: {PROG} (the same run): a matrix-vector product over a 128 MB weight per rank"
    compute_eff: "measured: 1 by construction: peak_tflops is the rate the calibration's matmul reached"
    mem_eff: "measured: 1 by construction: mem_bw_gbs is the rate the calibration's matrix-vector product reached"
    kernel_us: "measured: {PROG} (the same run): one eager op (a tiny add) dispatched and run"
    attention_overhead_us: "measured: {PROG} (the same run): the project's attention block at hidden 64"
    mlp_overhead_us: "measured: {PROG} (the same run): the project's MLP block at hidden 64"
    step_overhead_us: "measured: {PROG} (the same run): a decode step at hidden 64 minus its blocks (clipped at 0)"
  links:
    gloo:
      # all-reduce times: {times}
      alpha_us: {1e6 * alpha:.1f}
      busbw_gbs: {busbw / 1e9:.4f}
      algorithm: ring
      # compute speed lost while an all-reduce runs (gloo's threads take the ranks' cores): 1 MB all-reduce
      # {1e3 * raw["allreduce_1mb_s"]:.2f} ms; work alone {1e3 * raw["work_alone_s"]:.2f} ms, with it {1e3 * raw["work_with_allreduce_s"]:.2f} ms
      interference: {m["interference"]:.3f}
      origin:
        alpha_us: "fitted: alpha + 2 (p - 1) / p x bytes / busbw, least squares on the relative error, to the same run's all-reduce times above"
        busbw_gbs: "fitted: the same fit, to the same all-reduce times"
        interference: "measured: {PROG} (the same run): compute time lost while a 1 MB all-reduce runs, over that all-reduce's time"
"""


def calibrate(out: str, reps: int = 5) -> None:
    """Measure this machine and write its ``cpu`` profile to ``out`` (also printed)."""
    if reps < 1:
        raise OptionError("{reps} must be >= 1, got {given}", given=reps)
    start = time.perf_counter()
    text = profile_yaml(measure(reps))
    write_text(out, text)
    print(text)
    print(f"{PROG}: wrote {out} in {time.perf_counter() - start:.0f} s; use it with --profile {out} --gpu cpu")
