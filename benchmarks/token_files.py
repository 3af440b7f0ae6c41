"""Token-file loader throughput per rank, against what one GPU consumes in training (an estimate).

    python -m benchmarks.token_files --tokens 500000000 --world-sizes 1 8 64 --steps 3 --cold \
        --out docs/results/token_files/results.jsonl
    python -m benchmarks.token_files --folder DIR     # a folder of ladder-data prepare instead of a synthetic one

One rank's loader (rank 0 of each world size; ``data/token_loader.py``'s ``TokenFileLoader``) reads its
micro-batches of ``--steps`` global batches (more if needed for ``--min-sequences``; each world size from global
batch 1000 + 10,000 x its place in the list, so none re-reads another's windows) from a fresh memory map: its part
of the global order, the window copies and the (inputs, labels) tensors, in the trainer's process as in training.
tokens/s per rank = the rank's sequences x seq_len (the trainer's count) / the wall time. ``--cold`` evicts the
token file from the page cache (``posix_fadvise(DONTNEED)``) before each world size, so the windows come from the
disk; otherwise the file is read once first (warm). ``--tokens N`` writes a synthetic folder of N random ids (StarCoder's vocabulary,
documents of 1-4,000 tokens) in a temporary folder first.

The GPU side is computed, not measured: the training FLOPs per token of the 1.2B preset at seq_len
(``model.flops_per_token``: 6 x matmul parameters + attention) and the H100 SXM dense bf16 peak of
``predict/hardware.yaml`` at ``--mfu`` (an assumption) give the tokens/s one H100 consumes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.records import BenchmarkError, append_rows, invocation, positive_int
from ladder_train.data.token_files import (
    FORMAT,
    OFFSET_DTYPE,
    OFFSETS_NAME,
    TOKENS_NAME,
    VERSION,
    open_token_folder,
    write_meta,
)
from ladder_train.data.token_loader import TokenFileLoader
from ladder_train.files import open_to_write
from ladder_train.gpu_cards import CARDS
from ladder_train.model import PRESETS, flops_per_token
from ladder_train.model.transformer import ModelArgs

CHUNK = 1 << 26  # synthetic tokens written this many at a time


def synthetic_folder(folder: Path, tokens: int, seed: int = 0) -> Path:
    """A token folder of ``tokens`` random ids < 49,152, documents of 1-4,000 tokens each ending in 0."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    ends = []
    with open_to_write(folder / TOKENS_NAME, "wb") as out:
        for start in range(0, tokens, CHUNK):
            chunk = rng.integers(1, 49152, size=min(CHUNK, tokens - start), dtype=np.uint16)
            cuts = np.cumsum(rng.integers(1, 4001, size=len(chunk) // 500 + 2)) - 1  # each document's last token
            cuts = np.unique(np.append(cuts[cuts < len(chunk) - 1], len(chunk) - 1))
            chunk[cuts] = 0
            ends.append(start + cuts + 1)
            out.write(chunk.astype("<u2").tobytes())
    offsets = np.concatenate([[0], *ends]).astype(OFFSET_DTYPE)
    with open_to_write(folder / OFFSETS_NAME, "wb") as out:
        out.write(offsets.tobytes())
    tokenizer = {"name": "synthetic", "sha256": "0" * 64, "vocab_size": 49152}
    write_meta(
        folder,
        {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": tokenizer,
            "separator_id": 0,
            "dtype": "uint16",
            "tokens": tokens,
            "documents": len(offsets) - 1,
            "source": {"name": "synthetic", "seed": seed},
        },
    )
    return folder


def evict(path: Path) -> None:
    """Drop a file's pages from the page cache (clean pages; no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def rank_rate(path: Path, seq_len: int, global_batch: int, micro: int, world: int, steps: int, first: int) -> dict:
    """Rank 0 of ``world``: its micro-batches of ``steps`` global batches from global batch ``first`` on, timed;
    the folder is mapped afresh (pages still mapped by an earlier map would not leave the page cache)."""
    folder = open_token_folder(path)
    loader = TokenFileLoader([folder], [1.0], ["data.source"], seq_len, 0, global_batch, micro, 0, world)
    loader.global_batches = first
    batches = iter(loader)
    start = time.perf_counter()
    sequences = 0
    for _ in range(steps * loader.accumulation):
        inputs, labels = next(batches)
        sequences += inputs.shape[0]
    seconds = time.perf_counter() - start
    if loader.global_batches != first + steps or sequences != steps * global_batch // world:
        raise BenchmarkError(f"world {world}: read {sequences} sequences, {loader.global_batches - first} batches")
    tokens = sequences * seq_len
    return {
        "world_size": world,
        "rank": 0,
        "first_batch": first,
        "steps": steps,
        "sequences": sequences,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s_rank": tokens / seconds,
        "folder_tokens": folder.n_tokens,
    }


def gpu_estimate(seq_len: int, mfu: float) -> dict:
    """What one H100 SXM consumes training the 1.2B preset at ``mfu``: computed, labelled as an estimate."""
    args = ModelArgs(**PRESETS["1.2B"])
    flops = flops_per_token(args, seq_len)
    peak = CARDS["h100_sxm"].peak_flops
    return {
        "estimate": True,
        "model": "1.2B",
        "gpu": "H100 SXM",
        "peak_flops": peak,
        "mfu": mfu,
        "flops_per_token": flops,
        "tokens_per_s_gpu": mfu * peak / flops,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.token_files", description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, default=None, help="a token folder (default: a synthetic one)")
    parser.add_argument("--tokens", type=positive_int, default=500_000_000, help="synthetic folder size")
    parser.add_argument("--seq-len", type=positive_int, default=2048)
    parser.add_argument("--global-batch", type=positive_int, default=2048)
    parser.add_argument("--micro-batch", type=positive_int, default=8)
    parser.add_argument("--world-sizes", type=positive_int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--steps", type=positive_int, default=3, help="global batches per world size, at least")
    parser.add_argument("--min-sequences", type=positive_int, default=4096, help="sequences per measurement, at least")
    parser.add_argument("--cold", action="store_true", help="evict the token file from the page cache first")
    parser.add_argument("--mfu", type=float, default=0.5, help="the assumed MFU of the H100 estimate")
    parser.add_argument("--out", default=None, help="append JSON lines here")
    args = parser.parse_args(argv)
    common = invocation("benchmarks.token_files", argv)
    gpu = gpu_estimate(args.seq_len, args.mfu)
    print(
        f"ESTIMATE (computed, not measured): one H100 SXM training the 1.2B preset at {args.mfu:.0%} MFU consumes "
        f"{gpu['tokens_per_s_gpu']:,.0f} tokens/s ({gpu['flops_per_token'] / 1e9:.2f} GFLOP/token, "
        f"{gpu['peak_flops'] / 1e12:.1f} TFLOP/s peak)"
    )
    with tempfile.TemporaryDirectory() as scratch:
        path = args.folder or synthetic_folder(Path(scratch) / "tokens", args.tokens)
        rows = []
        for index, world in enumerate(args.world_sizes):
            if args.cold:
                evict(Path(path) / TOKENS_NAME)
            else:
                warm(Path(path) / TOKENS_NAME)
            # at least --min-sequences per measurement; each world size reads global batches no other one read
            steps = max(args.steps, -(-args.min_sequences * world // args.global_batch))
            first = 1000 + 10_000 * index
            row = rank_rate(path, args.seq_len, args.global_batch, args.micro_batch, world, steps, first)
            row.update(
                bench="token_files",
                folder=str(args.folder or "synthetic"),
                cold=args.cold,
                seq_len=args.seq_len,
                global_batch=args.global_batch,
                micro_batch=args.micro_batch,
                gpu_estimate=gpu,
                **common,
            )
            ratio = row["tokens_per_s_rank"] / gpu["tokens_per_s_gpu"]
            print(
                f"world {world:>4} rank 0: {row['sequences']:>6} sequences in {row['seconds']:.3f} s = "
                f"{row['tokens_per_s_rank']:>14,.0f} tokens/s per rank = {ratio:,.1f} x the H100 estimate "
                f"({'cold' if args.cold else 'warm'} page cache)"
            )
            rows.append(row)
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
