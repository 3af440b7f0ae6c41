"""``python -m ladder_train.serve``: decode TPOT of exports served by vLLM (the work: ladder_train/serve/tpot.py), its
flags and their checks, each refused in one line before vLLM is imported."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import InputError
from ..model import preset_args
from ..model.shape_checks import check_model_fields
from .args import Parser, model_overrides, names, non_negative_int, positive_int


def parser() -> Parser:
    p = Parser(prog="python -m ladder_train.serve", description="Decode TPOT of exports served by vLLM, as JSON lines")
    p.add_argument("exports", nargs="*", help="export folders (or --preset: random weights)")
    p.add_argument("--preset", help="a model preset, exported with random weights per --layouts into --work")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="ModelArgs overrides of --preset")
    p.add_argument("--layouts", default="standard,ladder", help="--preset's layouts, comma-separated")
    p.add_argument("--work", type=Path, help="where --preset's exports are written")
    p.add_argument("--tp", type=positive_int, default=2)
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--prompt-len", type=positive_int, default=8)
    p.add_argument("--gen-len", type=positive_int, default=16, help="at least 2 (TPOT is the time past the first)")
    p.add_argument("--warmup", type=non_negative_int, default=1)
    p.add_argument("--runs", type=positive_int, default=3)
    p.add_argument("--eager", action="store_true", help="enforce_eager (default: vLLM's compiled forward)")
    p.add_argument("--kv-cache-mib", type=positive_int, default=64)
    p.add_argument("--out", type=Path, required=True, help="JSON lines file the rows are appended to")
    return p


def parse_args(argv: list[str]):
    from ..serve.tpot import TpotOptions

    flags = parser().parse_args(argv)
    if flags.gen_len < 2:
        raise InputError(f"--gen-len must be at least 2 (TPOT is the time past the first token), got {flags.gen_len}")
    if flags.out.is_dir():
        raise InputError(f"--out {flags.out} is a folder; name the JSON lines file the rows go to")
    overrides = model_overrides(flags.set)
    layouts = names(flags.layouts)
    if flags.preset is None:
        if not flags.exports:
            raise InputError("name export folders, or --preset NAME --work DIR for random weights")
        if flags.set:
            raise InputError("--set changes a --preset's shape; an export's shape is its config.json")
    else:
        if flags.work is None:
            raise InputError(f"--preset {flags.preset} needs --work DIR, where its exports are written")
        for layout in layouts:
            try:
                args = preset_args(flags.preset, **{**overrides, "residual": layout})
            except (ValueError, TypeError) as err:
                raise InputError(f"--preset {flags.preset}: {err}") from None
            check_model_fields(dataclasses.asdict(args), f"--preset {flags.preset}")
    fields = {f.name for f in dataclasses.fields(TpotOptions)} - {"overrides", "layouts"}
    return TpotOptions(overrides=overrides, layouts=tuple(layouts), **{k: getattr(flags, k) for k in fields})


def run(argv: list[str]) -> int:
    from ..serve.tpot import run_rows

    run_rows(parse_args(argv))
    return 0
