"""``ladder-bench``: tokens/s of the standard, parallel, ladder and desync layouts under tensor parallelism; the
measurement itself is ``bench/runner.py``, what it measures ``bench/options.py``."""

from __future__ import annotations

import dataclasses

from ..bench import runner
from ..bench.options import BenchOptions
from ..errors import InputError
from ..option_errors import OptionError
from .args import Parser, int_list, model_overrides, names, non_negative_int, positive_int

DEFAULTS = BenchOptions(models=())
# the flag of each option, as the library's messages name them (OptionError)
FLAGS = {field.name: "--" + field.name.replace("_", "-") for field in dataclasses.fields(BenchOptions)}
FLAGS |= {"models": "--model", "overrides": "--set", "ceiling": "--no-ceiling"}


def parser() -> Parser:
    p = Parser(prog="ladder-bench", description=runner.__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        required=True,
        help="preset name, export folder or training checkpoint (RUN_DIR/checkpoints/step-N); several, comma-separated",
    )
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="ModelArgs overrides of a preset")
    p.add_argument(
        "--layouts",
        default=",".join(DEFAULTS.layouts),
        help="for presets (a saved model has its own): standard, parallel, ladder, desync-K (every K-th module "
        "all-reduces, built for --tp; --set desync_layers=N: a hybrid)",
    )
    p.add_argument("--batch-sizes", default=",".join(map(str, DEFAULTS.batch_sizes)))
    p.add_argument("--prompt-len", type=positive_int, default=DEFAULTS.prompt_len)
    p.add_argument("--gen-len", type=int, default=DEFAULTS.gen_len)
    p.add_argument("--tp", type=positive_int, default=DEFAULTS.tp, help="TP degree; under torchrun the world size")
    p.add_argument(
        "--link-latency-ms",
        type=float,
        default=DEFAULTS.link_latency_ms,
        help="emulated link: each all-reduce occupies one serialised link for X ms (+ bytes / bandwidth), "
        "starting when issued and the previous one has finished",
    )
    p.add_argument(
        "--link-bandwidth-gbs",
        type=float,
        default=DEFAULTS.link_bandwidth_gbs,
        help="emulated link bandwidth in GB/s (default: infinite)",
    )
    p.add_argument("--warmup", type=non_negative_int, default=DEFAULTS.warmup)
    p.add_argument(
        "--runs",
        type=positive_int,
        default=DEFAULTS.runs,
        help="timed runs per case (default: 10 on a GPU, 3 on the CPU)",
    )
    p.add_argument("--compile", choices=("auto", "on", "off"), default=DEFAULTS.compile, help="auto: on with CUDA")
    p.add_argument(
        "--compile-backend",
        default=DEFAULTS.compile_backend,
        help="torch.compile backend (inductor; aot_eager compiles faster)",
    )
    p.add_argument(
        "--gemv-tuning",
        choices=("on", "off"),
        default="on" if DEFAULTS.gemv_tuning else "off",
        help="compiled decode on a GPU: matrix-vector products as coordinate-descent-tuned Triton reductions (on)",
    )
    p.add_argument("--no-ceiling", action="store_true", help="skip the comm: none measurement")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--out", default=None, help="JSON lines results file (appended)")
    p.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="after the timed runs, trace one more generation of each case into DIR (a chrome trace per rank)",
    )
    return p


def parse_args(argv: list[str]) -> BenchOptions:
    flags = parser().parse_args(argv)
    return BenchOptions(
        models=tuple(names(flags.model)),
        layouts=tuple(names(flags.layouts)),
        batch_sizes=tuple(int_list("--batch-sizes", flags.batch_sizes)),
        overrides=model_overrides(flags.set),
        prompt_len=flags.prompt_len,
        gen_len=flags.gen_len,
        tp=flags.tp,
        link_latency_ms=flags.link_latency_ms,
        link_bandwidth_gbs=flags.link_bandwidth_gbs,
        warmup=flags.warmup,
        runs=flags.runs,
        compile=flags.compile,
        compile_backend=flags.compile_backend,
        gemv_tuning=flags.gemv_tuning == "on",
        ceiling=not flags.no_ceiling,
        seed=flags.seed,
        out=flags.out,
        profile=flags.profile,
    )


def run(argv: list[str]) -> int:
    try:
        return runner.run_benchmark(parse_args(argv))
    except OptionError as err:
        raise InputError(err.naming(FLAGS)) from None
