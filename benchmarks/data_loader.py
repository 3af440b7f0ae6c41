"""Throughput of the whole data pipeline against the raw tokenizer, on the same documents.

    python -m benchmarks.data_loader --source ../shared/data/fineweb \
        --tokenizer ../shared/tokenizers/starcoder/tokenizer.json --workers 0 1 2

Raw: ``Tokenizer.encode_batch`` and ``encode_batch_fast`` (the call the pipeline uses) over the source's texts,
already in memory, one thread, in the pipeline's groups of documents. Pipeline: one pass of
``build_dataloader`` (reading, tokenizing, packing, collating, the per-batch state snapshot, worker start-up
included) with N workers; per worker = total / max(N, 1). Tokenization is single-threaded everywhere
(TOKENIZERS_PARALLELISM=false), so "per worker" compares one core with one core.
"""

from __future__ import annotations

import argparse
import os
import time

from ladder_train.config import DataConfig
from ladder_train.data.loader import build_dataloader
from ladder_train.data.packing import document_groups
from ladder_train.data.sources import open_source
from ladder_train.data.tokenizer import eos_id, load_tokenizer


def raw_rates(tokenizer, texts: list[str]) -> dict[str, float]:
    """Tokens/s (ids + one <|endoftext|> per document) of the two batch-encode calls on one thread."""
    rates = {}
    for name in ("encode_batch", "encode_batch_fast"):
        encode = getattr(tokenizer, name)
        start, tokens = time.perf_counter(), 0
        for group in document_groups(({"text": t} for t in texts), "text"):
            tokens += sum(len(e.ids) + 1 for e in encode(group))
        rates[name] = tokens / (time.perf_counter() - start)
    return rates


def pipeline_rate(cfg: DataConfig, tokenizer, workers: int, batch_size: int, split: str) -> tuple[float, int]:
    """Tokens/s of one full pass of the loader (windows x (seq_len + 1)), and the tokens delivered."""
    loader = build_dataloader(cfg, tokenizer, batch_size=batch_size, split=split, num_workers=workers, cycle=False)
    start, tokens = time.perf_counter(), 0
    for inputs, _ in loader:
        tokens += inputs.shape[0] * (inputs.shape[1] + 1)
    return tokens / (time.perf_counter() - start), tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_loader", description=__doc__.split("\n")[0])
    parser.add_argument("--source", default="../shared/data/fineweb", help="data.source (local folder/file or hub)")
    parser.add_argument("--tokenizer", default="../shared/tokenizers/starcoder/tokenizer.json", help="data.tokenizer")
    parser.add_argument("--split", default="train")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per tokenizing process, raw and pipeline alike

    cfg = DataConfig(source=args.source, tokenizer=args.tokenizer, seq_len=args.seq_len)
    tokenizer = load_tokenizer(cfg.tokenizer)
    eos_id(tokenizer)
    texts = [doc[cfg.text_column] for doc in open_source(cfg.source, args.split, cfg.text_column, cfg.hub_config)]
    print(f"source {args.source} ({args.split}): {len(texts)} documents, {sum(map(len, texts)) / 1e6:.1f}M characters")
    raw = raw_rates(tokenizer, texts)
    for name, rate in raw.items():
        print(f"raw {name:<18} 1 thread   {rate:>12,.0f} tokens/s")
    for workers in args.workers:
        total, tokens = pipeline_rate(cfg, tokenizer, workers, args.batch_size, args.split)
        per_worker = total / max(workers, 1)
        print(
            f"pipeline {workers} worker(s)   total {total:>12,.0f} tokens/s | per worker {per_worker:>10,.0f} tokens/s "
            f"= {per_worker / raw['encode_batch']:.2f} x encode_batch, {per_worker / raw['encode_batch_fast']:.2f} x "
            f"encode_batch_fast | {tokens:,} tokens in windows of {args.seq_len + 1}"
        )


if __name__ == "__main__":
    main()
