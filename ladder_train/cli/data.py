"""``ladder-data``: token folders for long runs.

``ladder-data prepare SOURCE OUT_DIR --tokenizer T [--workers N]`` tokenizes a source once (a hub dataset, local
parquet/jsonl files or python-stdlib: anything data.source reads) into flat token arrays with their metadata
(``data/tokenize_files.py``); ``ladder-train ... data.source=OUT_DIR`` then reads them in place in a global
order that does not depend on the world size. ``ladder-data info DIR`` checks a folder against its metadata, reads
every token for the largest id, and prints it.

Ctrl-C on prepare removes its partial files and exits 130 (128 + SIGINT, the shell's own) with one line: there is
nothing to save, unlike the trainer's 75.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import EXIT_INTERRUPTED
from .args import Parser, positive_int

PREPARE = """Tokenize SOURCE into the token folder OUT_DIR: tokens.bin (every document's ids and the document
separator, uint16 when the vocabulary fits, else uint32), offsets.bin (where each document starts) and
ladder_tokens.json (tokenizer name and sha256, separator, dtype, counts), written last. The work is split over the
source's files, one task each, over --workers processes; the output is the same for any --workers. OUT_DIR must be
new or empty; --overwrite replaces a token folder there (prepare's own files only; other files stay). Train on it
with data.source=OUT_DIR and the same data.tokenizer."""


def parser() -> Parser:
    p = Parser(
        prog="ladder-data",
        description="Token folders for long runs: prepare tokenizes a source once into "
        "flat token files (train with data.source=OUT_DIR); info checks a folder.",
    )
    commands = p.add_subparsers(dest="command", required=True, metavar="{prepare,info}")
    prepare = commands.add_parser("prepare", prog="ladder-data prepare", description=PREPARE, help="tokenize a source")
    prepare.add_argument("source", help="a hub dataset name, a local parquet/jsonl file or folder, or python-stdlib")
    prepare.add_argument("out_dir", type=Path, help="the token folder to write (new or empty, else see --overwrite)")
    prepare.add_argument("--tokenizer", required=True, help="a hub name, a tokenizer.json, or byte (as data.tokenizer)")
    prepare.add_argument("--split", default="train", help="the split to read (default train)")
    prepare.add_argument("--hub-config", default=None, help="the hub dataset's config, e.g. sample-100BT")
    prepare.add_argument("--text-column", default="text", help="the documents' column (default text)")
    prepare.add_argument("--workers", type=positive_int, default=1, help="tokenizing processes (default 1)")
    prepare.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the token folder (or unfinished prepare) in OUT_DIR: its tokens.bin, offsets.bin, "
        "ladder_tokens.json and .parts/ parts; nothing else there is touched",
    )
    info = commands.add_parser("info", prog="ladder-data info", help="check a token folder and print its metadata")
    info.add_argument("folder", type=Path)
    return p


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.command == "info":
        from ..data.token_files import check_token_ids, describe, open_token_folder

        folder = open_token_folder(args.folder, where="FOLDER", every_offset=True)
        print(describe(folder, check_token_ids(folder)))
        print(json.dumps(folder.meta.get("source", {}), sort_keys=True))
        return 0
    from ..data.tokenize_files import prepare

    try:
        meta = prepare(
            args.source,
            args.out_dir,
            args.tokenizer,
            args.split,
            args.hub_config,
            args.text_column,
            args.workers,
            args.overwrite,
        )
    except KeyboardInterrupt:
        print(
            f"ladder-data: interrupted; no token folder written to {args.out_dir} (partial files removed)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    print(
        f"wrote {args.out_dir}: {meta['tokens']:,} tokens in {meta['documents']:,} documents ({meta['dtype']}) from "
        f"{meta['source']['shards']} shards of {args.source}; train with data.source={args.out_dir} "
        f"data.tokenizer={args.tokenizer}"
    )
    return 0
