"""Pre-tokenize a source into parquet shards of token ids, for clusters that prefer reading prepared data.

    python data/prepare.py --source HuggingFaceFW/fineweb-edu --hub-config sample-10BT \
        --tokenizer bigcode/starcoder --out /scratch/fineweb-edu-starcoder --docs-per-shard 200000

Writes OUT/{split}-00000.parquet, ... with one column ``input_ids`` (list<int32>: one document's ids, without
<|endoftext|>, which the loader appends). Train on them with the same tokenizer:

    ladder-train --config recipes/... data.source=OUT data.text_column=input_ids
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from ladder_train.cli import run_command
from ladder_train.config import DataConfig
from ladder_train.data import load_tokenizer, open_source
from ladder_train.data.packing import check_documents, document_groups, document_ids


def write_shard(out: Path, split: str, index: int, docs: list) -> None:
    table = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))})
    pq.write_table(table, out / f"{split}-{index:05d}.parquet")


def prepare(cfg: DataConfig, split: str, out: Path, docs_per_shard: int) -> int:
    tokenizer = load_tokenizer(cfg.tokenizer, where="--tokenizer")
    documents = open_source(cfg.source, split, cfg.text_column, cfg.hub_config)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    out.mkdir(parents=True, exist_ok=True)
    shard, pending, tokens = 0, [], 0
    with tqdm(desc=f"tokenizing {split}", unit=" docs") as progress:
        for texts in document_groups(iter(documents), cfg.text_column):
            check_documents(texts, cfg.text_column, cfg.source)
            ids = document_ids(texts, tokenizer, vocab_size, cfg.source)  # a long text in pieces: long_text.py
            pending += ids
            tokens += sum(map(len, ids))
            progress.update(len(texts))
            progress.set_postfix(tokens=f"{tokens / 1e6:.1f}M", shards=shard)
            while len(pending) >= docs_per_shard:
                write_shard(out, split, shard, pending[:docs_per_shard])
                shard, pending = shard + 1, pending[docs_per_shard:]
    if pending:
        write_shard(out, split, shard, pending)
        shard += 1
    print(f"{split}: {tokens:,} tokens in {shard} shards under {out}")
    return shard


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", default=DataConfig.source)
    parser.add_argument("--hub-config", default=DataConfig.hub_config)
    parser.add_argument("--tokenizer", default=DataConfig.tokenizer)
    parser.add_argument("--text-column", default=DataConfig.text_column)
    parser.add_argument("--split", nargs="+", default=["train"])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--docs-per-shard", type=int, default=100_000)
    args = parser.parse_args(argv)
    cfg = DataConfig(
        source=args.source, hub_config=args.hub_config, tokenizer=args.tokenizer, text_column=args.text_column
    )
    for split in args.split:
        prepare(cfg, split, args.out, args.docs_per_shard)
    return 0


if __name__ == "__main__":
    sys.exit(run_command("data/prepare.py", run))  # bad input: one line, exit 2
