"""Throughput of the whole data pipeline against the raw tokenizer, on the same documents.

    python -m benchmarks.data_loader --source ../shared/data/fineweb \
        --tokenizer ../shared/tokenizers/starcoder/tokenizer.json --workers 0 1 2 [--repeats 3] [--out FILE.jsonl]

Raw: ``Tokenizer.encode_batch`` and ``encode_batch_fast`` (the call the pipeline uses) over the source's texts,
already in memory, one thread, in the pipeline's groups of documents. Pipeline: one pass of
``build_dataloader`` (reading, tokenizing, packing, collating, the per-batch state snapshot, worker start-up
included) with N workers; per worker = total / max(N, 1). Tokenization is single-threaded everywhere
(TOKENIZERS_PARALLELISM=false), so "per worker" compares one core with one core.

``--repeats N`` measures everything N times, each a fresh measurement (raw calls again, a new loader per worker
count), in the order raw, then each worker count, repeat after repeat. Each measurement must have done its work: the
two raw calls count the same tokens, and a pass of the loader delivers at most the raw tokens and at least all but
one window and one batch per stream (else BenchmarkError, exit 1). ``--out`` appends one JSON line per measurement
(tokens, seconds, repeat, settings, command, host: ``benchmarks/records.py``).
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks.records import BenchmarkError, append_rows, invocation, positive_int
from ladder_train.config import DataConfig
from ladder_train.data.loader import build_dataloader
from ladder_train.data.packing import document_groups
from ladder_train.data.sources import open_source
from ladder_train.data.tokenizer import eos_id, load_tokenizer

CALLS = ("encode_batch", "encode_batch_fast")


def raw_counts(tokenizer, texts: list[str]) -> dict[str, tuple[int, float]]:
    """(tokens, seconds) of the two batch-encode calls on one thread: ids + one <|endoftext|> per document."""
    counts = {}
    for name in CALLS:
        encode = getattr(tokenizer, name)
        start, tokens = time.perf_counter(), 0
        for group in document_groups(({"text": t} for t in texts), "text"):
            tokens += sum(len(e.ids) + 1 for e in encode(group))
        counts[name] = (tokens, time.perf_counter() - start)
    if len({tokens for tokens, _ in counts.values()}) != 1 or not counts[CALLS[0]][0]:
        raise BenchmarkError(f"the raw calls counted {counts}: not the same, non-zero number of tokens")
    return counts


def pipeline_pass(cfg: DataConfig, tokenizer, workers: int, batch_size: int, split: str) -> tuple[int, int, float]:
    """(tokens delivered: windows x (seq_len + 1), batches, seconds) of one full pass of the loader."""
    loader = build_dataloader(cfg, tokenizer, batch_size=batch_size, split=split, num_workers=workers, cycle=False)
    start, tokens, batches = time.perf_counter(), 0, 0
    for inputs, _ in loader:
        tokens += inputs.shape[0] * (inputs.shape[1] + 1)
        batches += 1
    return tokens, batches, time.perf_counter() - start


def check_delivered(tokens: int, raw_tokens: int, workers: int, batch_size: int, seq_len: int) -> None:
    """A pass delivers the raw tokens in windows: each stream (a worker, or the main process) drops at most its
    last partial window, and its last partial batch."""
    slack = max(workers, 1) * (batch_size + 1) * (seq_len + 1)
    if not 0 < tokens <= raw_tokens or tokens < raw_tokens - slack:
        raise BenchmarkError(
            f"the loader with {workers} worker(s) delivered {tokens:,} tokens of {raw_tokens:,} "
            f"(at most {slack:,} may be dropped): its tokens/s would not measure the pipeline"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_loader", description=__doc__.split("\n")[0])
    parser.add_argument("--source", default="../shared/data/fineweb", help="data.source (local folder/file or hub)")
    parser.add_argument("--tokenizer", default="../shared/tokenizers/starcoder/tokenizer.json", help="data.tokenizer")
    parser.add_argument("--split", default="train")
    parser.add_argument("--seq-len", type=positive_int, default=2048)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=positive_int, default=1, help="independent measurements of everything")
    parser.add_argument("--out", default=None, help="JSON lines file the rows are appended to")
    return parser.parse_args(argv)


def one_repeat(args, cfg: DataConfig, tokenizer, texts: list[str], context: dict) -> list[dict]:
    """One repeat's rows: the raw tokenizer calls, then a pass of the loader per worker count, each checked against
    the tokens the raw call counted."""
    rows = []
    raw = raw_counts(tokenizer, texts)
    rates = {name: tokens / seconds for name, (tokens, seconds) in raw.items()}
    for name, (tokens, seconds) in raw.items():
        print(f"raw {name:<18} 1 thread   {rates[name]:>12,.0f} tokens/s")
        rows.append(
            {
                **context,
                "quantity": "raw",
                "call": name,
                "workers": None,
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_s": rates[name],
            }
        )
    for workers in args.workers:
        tokens, batches, seconds = pipeline_pass(cfg, tokenizer, workers, args.batch_size, args.split)
        check_delivered(tokens, raw[CALLS[0]][0], workers, args.batch_size, args.seq_len)
        total = tokens / seconds
        per_worker = total / max(workers, 1)
        rows.append(
            {
                **context,
                "quantity": "pipeline",
                "call": None,
                "workers": workers,
                "tokens": tokens,
                "batches": batches,
                "seconds": seconds,
                "tokens_per_s": total,
            }
        )
        print(
            f"pipeline {workers} worker(s)   total {total:>12,.0f} tokens/s | per worker {per_worker:>10,.0f} "
            f"tokens/s = {per_worker / rates['encode_batch']:.2f} x encode_batch, "
            f"{per_worker / rates['encode_batch_fast']:.2f} x encode_batch_fast | {tokens:,} tokens in windows "
            f"of {args.seq_len + 1}"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per tokenizing process, raw and pipeline alike
    context = invocation("benchmarks.data_loader", argv)
    cfg = DataConfig(source=args.source, tokenizer=args.tokenizer, seq_len=args.seq_len)
    tokenizer = load_tokenizer(cfg.tokenizer)
    eos_id(tokenizer)
    texts = [doc[cfg.text_column] for doc in open_source(cfg.source, args.split, cfg.text_column, cfg.hub_config)]
    characters = sum(map(len, texts))
    print(f"source {args.source} ({args.split}): {len(texts)} documents, {characters / 1e6:.1f}M characters")
    context.update(
        bench="data_loader",
        source=args.source,
        split=args.split,
        tokenizer=args.tokenizer,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        repeats=args.repeats,
        documents=len(texts),
        characters=characters,
        tokenizers_parallelism=os.environ["TOKENIZERS_PARALLELISM"],
    )
    rows = []
    for repeat in range(args.repeats):
        if args.repeats > 1:
            print(f"-- repeat {repeat + 1} of {args.repeats}")
        rows += one_repeat(args, cfg, tokenizer, texts, {**context, "repeat": repeat})
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
