"""The two ceilings of the card a GPU check ran on (docs/benchmarks.md reads decode's bandwidth and MFU against them):
a device-to-device copy (bytes read plus written per second) and a square bf16 matrix product (FLOP/s), each timed
with device events around every call after warm-ups, median and range over the repeats, on random inputs.

    python -m benchmarks.gpu_ceilings [--out ROWS.jsonl] [--copy-mib 1024] [--matmul 8192]

On the CPU (no CUDA) it times the same with the host clock at the sizes given (a check of this tool, not a
ceiling). Prints one JSON row; ``--out`` appends it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from ladder_train.files import open_to_write


def timed(fn, repeats: int, warmup: int, device: torch.device) -> list[float]:
    """Milliseconds of each of ``repeats`` calls of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    torch.cuda.synchronize(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for begin, end in events:
        begin.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return [begin.elapsed_time(end) for begin, end in events]


def summary(times: list[float]) -> dict:
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "repeats": len(times)}


def measure(copy_mib: int, matmul: int, device: torch.device, repeats: tuple[int, int] = (50, 30)) -> dict:
    generator = torch.Generator(device=device).manual_seed(0)
    source = torch.randn(copy_mib * 2**20 // 2, device=device, dtype=torch.bfloat16, generator=generator)
    target = torch.empty_like(source)
    copy = summary(timed(lambda: target.copy_(source), repeats[0], 5, device))
    if not torch.equal(source, target):  # the timed work was done
        raise RuntimeError("gpu_ceilings: the copy's target differs from its source")
    moved = 2 * source.numel() * source.element_size()  # read + written
    a, b = (torch.randn(matmul, matmul, device=device, dtype=torch.bfloat16, generator=generator) for _ in range(2))
    product = summary(timed(lambda: a @ b, repeats[1], 5, device))
    return {
        "kind": "ceilings",
        "device": device.type,
        "card": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "copy": {**copy, "bytes_read_plus_written": moved},
        "copy_tb_s_median": moved / copy["median_ms"] / 1e9,
        "matmul": {**product, "n": matmul, "dtype": "bfloat16", "flops": 2 * matmul**3},
        "matmul_tflops_median": 2 * matmul**3 / product["median_ms"] / 1e9,
        "inputs": "torch.randn, seed 0",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_ceilings", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="JSON lines file the row is appended to")
    p.add_argument("--copy-mib", type=int, default=1024, help="size of the copied tensor (default 1024 MiB)")
    p.add_argument("--matmul", type=int, default=8192, help="side of the square bf16 matrices (default 8192)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    row = measure(args.copy_mib, args.matmul, device)
    print(json.dumps(row), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open_to_write(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
