"""``ladder-export SOURCE OUT_DIR [--dtype bf16] [--license apache-2.0] [--overwrite]``: a Hub-ready model folder
from a training checkpoint (RUN_DIR/checkpoints/step-N) or a Hugging Face format folder: ``model.safetensors`` +
``config.json`` (Hugging Face Llama names), tokenizer, ``generation_config.json``, a model card (``README.md``)
and, for a parallel or ladder model, the transformers classes it loads with (see ladder_train/export/).

OUT_DIR must be new or empty: an existing folder with anything in it is refused before any work, unless
``--overwrite``, which replaces the export's own files there (an earlier export) and leaves every other file."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from ..errors import InputError
from ..export import export_checkpoint, export_folder
from ..export.writer import overwrite_obstacle, source_kind
from ..parallel import DTYPES
from .args import Parser, new_output_folder


def hub_license(text: str) -> str:
    """A licence identifier as the Hub's metadata writes it (apache-2.0, mit, llama3.1, other, ...)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", text):
        raise argparse.ArgumentTypeError("is not a Hub licence identifier (lowercase letters, digits, . + -)")
    return text


def run(argv: list[str]) -> int:
    parser = Parser(prog="ladder-export", description=__doc__)
    parser.add_argument("source", type=Path, help="RUN_DIR/checkpoints/step-N, or a Hugging Face format folder")
    parser.add_argument("out_dir", type=new_output_folder)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument(
        "--license", type=hub_license, default=None, help="the card's licence (default: the source's, else other)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="write into a non-empty OUT_DIR, replacing an earlier export's files"
    )
    args = parser.parse_args(argv)
    if not args.source.is_dir():  # a path the user typed: bad input, not a damaged checkpoint
        raise InputError(f"{args.source}: no such folder")
    source, target = args.source.resolve(), args.out_dir.resolve()
    if target == source or source in target.parents:
        parser.error(f"out_dir {args.out_dir} is inside the source {args.source}: write the export elsewhere")
    export = export_folder if source_kind(args.source) == "export" else export_checkpoint
    _check_out_dir(args.out_dir, args.overwrite)
    out = export(args.source, args.out_dir, DTYPES[args.dtype], args.license)
    print(f"exported {args.source} to {out} ({args.dtype})")
    return 0


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Nothing a user wrote is replaced unasked: a non-empty OUT_DIR needs --overwrite, and even then only files
    an export writes are replaced (a folder or link in their place, or a shard index, is refused)."""
    if not out_dir.is_dir():
        return
    entries = sorted(path.name for path in out_dir.iterdir())
    if entries and not overwrite:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise InputError(
            f"{out_dir}: exists and is not empty ({shown}); export into a new or empty folder, or pass --overwrite "
            "to replace an earlier export's files there"
        )
    problem = overwrite_obstacle(out_dir)
    if problem:
        raise InputError(problem)
