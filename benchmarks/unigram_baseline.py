"""The layout study's floor: a unigram model of the training bytes, scored on the validation windows every study run
scores. Byte counts over one pass of the training split (the windows the trainer packs, their labels), add-one
smoothed over the tokenizer's vocabulary; then the mean negative log-likelihood of the labels of the first
``eval.val_batches`` validation batches, built as the trainer's validation builds them.

    python -m benchmarks.unigram_baseline --out docs/results/study_small/unigram.json

Run from the repository root with ../shared beside it; a few minutes on one core.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

import torch

from ladder_train.config import load_config
from ladder_train.data import build_dataloader, load_tokenizer
from ladder_train.files import write_text

RECIPE = "recipes/study_small.yaml"


def byte_counts(cfg, tokenizer) -> tuple[torch.Tensor, int]:
    """Label counts over one pass of the training split: the tokens a full run trains on (the run reads 18.0M of the
    split's 18.07M)."""
    loader = build_dataloader(
        cfg.data, tokenizer, batch_size=cfg.train.micro_batch_size, seed=cfg.run.seed, num_workers=0, cycle=False
    )
    counts = torch.zeros(tokenizer.get_vocab_size(), dtype=torch.float64)
    for _inputs, labels in loader:
        counts += torch.bincount(labels.flatten(), minlength=counts.numel()).double()
    return counts, int(counts.sum().item())


def validation_nll(cfg, tokenizer, log_probs: torch.Tensor) -> tuple[float, int]:
    """Mean negative log-likelihood (nats per token) of the validation labels the runs score, and their count."""
    loader = build_dataloader(
        cfg.data,
        tokenizer,
        batch_size=cfg.train.micro_batch_size,
        seed=cfg.run.seed,
        source=cfg.data.validation_source or cfg.data.source,
        split="validation",
        num_workers=0,
        cycle=True,
    )
    total, count = 0.0, 0
    for _, (_inputs, labels) in zip(range(cfg.eval.val_batches), loader, strict=False):
        total -= log_probs[labels.flatten()].sum().item()
        count += labels.numel()
    return total / count, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    cfg = load_config(RECIPE)
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    counts, train_tokens = byte_counts(cfg, tokenizer)
    log_probs = torch.log((counts + 1) / (counts.sum() + counts.numel()))
    nll, val_tokens = validation_nll(cfg, tokenizer, log_probs)
    if train_tokens < 10_000_000 or val_tokens != cfg.eval.val_batches * cfg.train.micro_batch_size * cfg.data.seq_len:
        raise RuntimeError(f"counted {train_tokens:,} training and {val_tokens:,} validation tokens: not the study's")
    result = {
        "recipe": RECIPE,
        "nats_per_byte": nll,
        "train_tokens": train_tokens,
        "val_tokens": val_tokens,
        "smoothing": "add-one over the vocabulary",
        "vocab_size": counts.numel(),
        "command": "python -m benchmarks.unigram_baseline " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        write_text(args.out, json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
