"""``ladder-bench``: tokens/s of the standard, parallel and ladder layouts under tensor parallelism; the
measurement itself is ``bench/runner.py``."""

from __future__ import annotations

import argparse

from ..bench import runner
from .args import Parser, int_list, model_overrides, names, non_negative_int, positive_int


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(prog="ladder-bench", description=runner.__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        required=True,
        help="preset name, export folder or training checkpoint (RUN_DIR/checkpoints/step-N); several, comma-separated",
    )
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="ModelArgs overrides of a preset")
    p.add_argument("--layouts", default="standard,parallel,ladder", help="for presets; a saved model has its own")
    p.add_argument("--batch-sizes", default="1,4,16,64")
    p.add_argument("--prompt-len", type=positive_int, default=1024)
    p.add_argument("--gen-len", type=int, default=512)
    p.add_argument("--tp", type=positive_int, default=None, help="TP degree; under torchrun the world size")
    p.add_argument(
        "--link-latency-ms",
        type=float,
        default=0.0,
        help="emulated link: each all-reduce occupies one serialised link for X ms (+ bytes / bandwidth), "
        "starting when issued and the previous one has finished",
    )
    p.add_argument(
        "--link-bandwidth-gbs", type=float, default=None, help="emulated link bandwidth in GB/s (default: infinite)"
    )
    p.add_argument("--warmup", type=non_negative_int, default=1)
    p.add_argument(
        "--runs", type=positive_int, default=None, help="timed runs per case (default: 10 on a GPU, 3 on the CPU)"
    )
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto", help="auto: on with CUDA")
    p.add_argument(
        "--compile-backend", default="inductor", help="torch.compile backend (inductor; aot_eager compiles faster)"
    )
    p.add_argument("--no-ceiling", action="store_true", help="skip the comm: none measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON lines results file (appended)")
    p.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="after the timed runs, trace one more generation of each case into DIR (a chrome trace per rank)",
    )
    opts = p.parse_args(argv)
    opts.models, opts.layouts = names(opts.model), names(opts.layouts)
    opts.batch_sizes = int_list("--batch-sizes", opts.batch_sizes)
    opts.overrides = model_overrides(opts.set)
    return opts


def run(argv: list[str]) -> int:
    return runner.run_benchmark(parse_args(argv))
