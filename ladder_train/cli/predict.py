"""``ladder-predict``: PREDICTED prefill time, decode time per token and tokens/s of the standard, parallel,
ladder and desync-K layouts and of the no-communication ceiling under tensor parallelism, from a performance model
(``predict/perfmodel.py``) and a hardware profile (``predict/hardware.yaml``). Nothing here is measured.

    ladder-predict --model llama-70b --gpu h100 --link nvlink --tp 8 --batch-sizes 1,4,16,64 \\
        --prompt-len 1024 --gen-len 512 [--out FILE.jsonl] [--plot FILE.png]
    ladder-predict --gpu cpu --link emulated --link-latency-ms 20 --model small --tp 2 ...
    ladder-predict --compare bench.jsonl [--profile cpu.yaml]      # against ladder-bench's or gpu_check's rows
    ladder-predict calibrate --out cpu.yaml                         # measure this machine's `cpu` profile
    ladder-predict validate --out-dir DIR                           # calibrate + ladder-bench runs + --compare
    ladder-predict paper [--out FILE.json]                          # against all 16 cells of the paper's 70B table
    ladder-predict fit CARD_A.jsonl ... --check CARD_B.jsonl        # fitted on one card's rows, checked on another's
"""

from __future__ import annotations

import argparse

from ..errors import InputError
from ..files import open_to_write
from ..option_errors import OptionError
from ..predict.predictions import PredictOptions
from .args import Parser, int_list, model_overrides, names, non_negative_float, non_negative_int, positive_int

PROG = "ladder-predict"
DEFAULTS = PredictOptions()
# the options the library's messages name (OptionError): the grid's, and calibrate's and validate's
NAMED = ("model", "gpu", "link", "tp", "layouts", "prompt_len", "gen_len", "link_latency_ms", "link_bandwidth_gbs")
NAMED += ("profile", "reps", "cases", "runs")
FLAGS = {name: "--" + name.replace("_", "-") for name in NAMED} | {"overrides": "--set"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags; ``options`` builds the grid's options from them (``--compare`` reads a few of them instead)."""
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default=",".join(DEFAULTS.models),
        help="preset, llama-1b..llama-405b, or a config.json (file or folder); comma-separated",
    )
    p.add_argument(
        "--gpu",
        default=None,
        help="profile name(s): h100 (default), h200, a100, cpu or one of --profile; with --compare the row's card's",
    )
    p.add_argument(
        "--link",
        default=None,
        help="link(s) of the profile (nvlink, pcie = P2P disabled, gloo, emulated); default: its first",
    )
    p.add_argument(
        "--tp",
        default=",".join(map(str, DEFAULTS.tps)),
        help="TP degree(s), comma-separated; above the GPUs of a node the inter-node link joins",
    )
    p.add_argument("--batch-sizes", default=",".join(map(str, DEFAULTS.batch_sizes)))
    p.add_argument("--prompt-len", type=positive_int, default=DEFAULTS.prompt_len)
    p.add_argument("--gen-len", type=positive_int, default=DEFAULTS.gen_len)
    p.add_argument(
        "--layouts",
        default=",".join(DEFAULTS.layouts),
        help="standard, parallel, ladder, desync-K (every K-th module all-reduces, built for each --tp)",
    )
    p.add_argument(
        "--ladder-layers", type=non_negative_int, default=None, help="hybrid: only the last N layers are ladder"
    )
    p.add_argument(
        "--set", nargs="*", default=[], metavar="FIELD=VALUE", help="shape overrides, as ladder-bench's --set"
    )
    p.add_argument("--profile", default=None, help="a YAML file of profiles, added to (or replacing) the shipped ones")
    p.add_argument(
        "--link-latency-ms", type=non_negative_float, default=None, help="with --link emulated: ladder-bench's X"
    )
    p.add_argument(
        "--link-bandwidth-gbs", type=float, default=None, help="with --link emulated: its B (default infinite)"
    )
    p.add_argument("--out", default=None, help="JSON lines file (appended)")
    p.add_argument("--plot", default=None, help="PNG of the speedups over standard by batch size")
    p.add_argument(
        "--compare",
        default=None,
        metavar="ROWS.jsonl",
        help="predict ladder-bench rows or gpu_check decode rows and report the errors",
    )
    return p.parse_args(argv)


def options(flags: argparse.Namespace) -> PredictOptions:
    """The grid's options from the flags."""
    return PredictOptions(
        models=tuple(names(flags.model)),
        gpus=tuple(names(flags.gpu)) if flags.gpu else DEFAULTS.gpus,
        links=tuple(names(flags.link)) if flags.link else None,
        batch_sizes=tuple(int_list("--batch-sizes", flags.batch_sizes)),
        tps=tuple(int_list("--tp", flags.tp)),
        prompt_len=flags.prompt_len,
        gen_len=flags.gen_len,
        layouts=tuple(names(flags.layouts)),
        ladder_layers=flags.ladder_layers,
        overrides=model_overrides(flags.set),
        profile=flags.profile,
        link_latency_ms=flags.link_latency_ms,
        link_bandwidth_gbs=flags.link_bandwidth_gbs,
    )


def calibrate(argv: list[str]) -> int:
    """``ladder-predict calibrate``."""
    from ..predict import calibrate as calibration

    p = Parser(prog=calibration.PROG, description=calibration.__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="YAML file to write (use it with ladder-predict --profile FILE)")
    p.add_argument("--reps", type=positive_int, default=5, help="repetitions per measurement (medians)")
    opts = p.parse_args(argv)
    calibration.calibrate(opts.out, opts.reps)
    return 0


def validate(argv: list[str]) -> int:
    """``ladder-predict validate``."""
    from ..predict import validation

    p = Parser(prog=validation.PROG, description=validation.__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", required=True, help="writes cpu.yaml, bench.jsonl and compare.txt here")
    p.add_argument("--runs", type=positive_int, default=3, help="ladder-bench measured runs per case (medians)")
    p.add_argument("--cases", default=",".join(validation.CASES), help=f"a subset of {', '.join(validation.CASES)}")
    p.add_argument("--skip-calibrate", action="store_true", help="reuse OUT_DIR/cpu.yaml")
    p.add_argument("--skip-bench", action="store_true", help="reuse OUT_DIR/bench.jsonl (compare only)")
    p.add_argument("--layouts", default=",".join(DEFAULTS.layouts), help="ladder-bench's --layouts (desync-K too)")
    opts = p.parse_args(argv)
    validation.validate(
        opts.out_dir,
        opts.runs,
        names(opts.cases),
        calibrate_now=not opts.skip_calibrate,
        bench_now=not opts.skip_bench,
        layouts=tuple(names(opts.layouts)),
    )
    return 0


def paper(argv: list[str]) -> int:
    """``ladder-predict paper``."""

    from ..predict import paper_check
    from ..predict.hardware import load_profiles

    p = Parser(prog=paper_check.PROG, description=paper_check.__doc__.split("\n\n")[0])
    p.add_argument("--gpu", default="h100", help="the profile (it needs the links nvlink and pcie)")
    p.add_argument("--profile", default=None, help="a YAML file of profiles, added to (or replacing) the shipped ones")
    p.add_argument("--out", default=None, help="JSON file to write (the cells, the fits and the table)")
    opts = p.parse_args(argv)
    devices = load_profiles(opts.profile)
    if opts.gpu not in devices:
        raise InputError(f"--gpu {opts.gpu!r}: no such profile (have {', '.join(devices)})")
    missing = [link for link in paper_check.LINKS.values() if link not in devices[opts.gpu].links]
    if missing:
        raise InputError(f"--gpu {opts.gpu}: the profile has no link {', '.join(missing)} (the paper's two settings)")
    result = paper_check.check(devices[opts.gpu])
    result["command"] = " ".join([paper_check.PROG, *argv])
    print(f"{paper_check.PROG}: PREDICTED ({opts.gpu} profile) against the paper's cells\n")
    print(paper_check.markdown(result))
    return _write_json(result, opts.out)


def _write_json(result: dict, out: str | None) -> int:
    """``--out``: the result as JSON, said on the console."""
    import json

    if out:
        with open_to_write(out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"\nwritten to {out}")
    return 0


def fit(argv: list[str]) -> int:
    """``ladder-predict fit``."""

    from ..predict import fit as card_fit
    from ..predict.hardware import load_profiles

    p = Parser(prog=card_fit.PROG, description=card_fit.__doc__.split("\n\n")[0])
    p.add_argument("rows", nargs="+", help="one card's row files (gpu_check or ladder-bench --out)")
    p.add_argument("--check", required=True, help="the other card's row files, comma-separated")
    free = ",".join(card_fit.FREE)
    p.add_argument("--free", default=None, help=f"the constants to fit (default: {free}, then all three)")
    p.add_argument("--profile", default=None, help="a YAML file of profiles, added to (or replacing) the shipped ones")
    p.add_argument("--out", default=None, help="JSON file to write (the fits and every prediction)")
    opts = p.parse_args(argv)
    sets = (tuple(names(opts.free)),) if opts.free else (card_fit.FREE, card_fit.CONSTANTS)
    result = card_fit.card_check(opts.rows, names(opts.check), load_profiles(opts.profile), sets)
    print(f"{card_fit.PROG}: PREDICTED against the rows' measurements\n")
    print(card_fit.markdown(result))
    return _write_json(result, opts.out)


def compare(flags: argparse.Namespace) -> int:
    """``ladder-predict --compare FILE.jsonl``: each row on its card's profile, or all on ``--gpu``'s."""
    from ..predict.compare import bench_rows, compare_with_bench, print_compare, rows_by_profile
    from ..predict.hardware import load_profiles
    from ..predict.predictions import real_link

    devices = load_profiles(flags.profile)
    if flags.gpu and flags.gpu not in devices:
        raise InputError(f"--gpu {flags.gpu!r}: no such profile (have {', '.join(devices)})")
    for gpu, rows in rows_by_profile(bench_rows(flags.compare), devices, flags.gpu).items():
        link = real_link(devices[gpu], flags.link) if flags.link else None
        results, summary = compare_with_bench(rows, devices[gpu], link)
        print_compare(results, summary, flags.compare, gpu)
    return 0


def predict(flags: argparse.Namespace, grid: PredictOptions) -> int:
    """``ladder-predict``: the grid's predictions, printed and, asked for, appended to a file and plotted."""
    from ..bench_schema import write_rows
    from ..predict.predictions import plot, prediction_rows, print_table

    rows = prediction_rows(grid)
    print_table(rows)
    if flags.out:
        write_rows(rows, flags.out)
        print(f"predictions appended to {flags.out}")
    if flags.plot:
        plot(rows, flags.plot)
        print(f"plot written to {flags.plot}")
    return 0


SUBCOMMANDS = {"calibrate": calibrate, "validate": validate, "paper": paper, "fit": fit}


def run(argv: list[str]) -> int:
    try:
        if argv[:1] and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        flags = parse_args(argv)
        grid = options(flags)  # every flag is checked, with --compare too
        return compare(flags) if flags.compare else predict(flags, grid)
    except OptionError as err:
        raise InputError(err.naming(FLAGS)) from None
