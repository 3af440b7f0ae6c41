"""``ladder-report``: the comparison of run folders (and ladder-bench results) as report.md with plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError
from ..option_errors import OptionError
from ..report import __doc__ as REPORT_DOC
from ..report import write_report
from .args import Parser, new_output_folder

FLAGS = {"baseline": "--baseline"}  # the option the library's messages name (OptionError)


def run(argv: list[str]) -> int:
    parser = Parser(prog="ladder-report", description=REPORT_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "runs",
        nargs="*",
        type=Path,
        help="run folders or study folders (up to 4 runs named one by one are columns, the last relative to the first; more, or a study's, are rows)",
    )
    parser.add_argument(
        "--baseline", default=None, help="the group of seeds the paired differences are taken to (default: standard)"
    )
    parser.add_argument(
        "--resolution",
        type=float,
        default=None,
        help="flag paired intervals whose half-width is at least this (e.g. 0.01 nats): too wide to resolve it",
    )
    parser.add_argument(
        "--predictions",
        type=Path,
        default=None,
        help="ladder-predict --out rows (one model, profile, TP degree): a study's layouts charted against "
        "communication, labelled with their predicted speedups",
    )
    parser.add_argument("--bench", action="append", type=Path, default=[], help="ladder-bench JSON lines (repeatable)")
    parser.add_argument("--out", type=new_output_folder, required=True)
    args = parser.parse_args(argv)
    if not args.runs and not args.bench:
        parser.error("give run folders, --bench files, or both")
    try:
        report = write_report(args.runs, args.out, args.bench, args.baseline, args.resolution, args.predictions)
    except OptionError as err:
        raise InputError(err.naming(FLAGS)) from None
    print(f"report written to {report}")
    return 0
