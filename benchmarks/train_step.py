"""Trainer overhead benchmark: the trainer against a bare loop on the same model and batches.

    python -m benchmarks.train_step [--steps 20] [--rounds 2] [--repeats 1] [--out FILE.jsonl] [key=value ...]

The bare loop is plain forward / backward / clip / AdamW step on an unsharded model, with the batches
already in memory: no FSDP, no data loader, no logging. It runs on the trainer's device (``init_distributed``:
this process's GPU when CUDA is available, else the CPU), in the trainer's compute dtype (``train.dtype``;
``auto`` is bf16 on a GPU, under autocast here), with the same ``train.freeze_layers``; it does not compile.
The trainer runs the same steps with its full machinery (mesh, FSDP2 of one process, metrics). Rounds
alternate the two; the best of each is kept.
Every trainer round writes into a fresh temporary run folder (a reused folder would auto-resume at
max_steps and time nothing) and must have run exactly ``--steps`` steps, and every bare round's optimizer must
have stepped ``--steps`` times, else the benchmark stops (BenchmarkError, exit 1).
``--repeats N`` makes the whole measurement (``--rounds`` alternating rounds, the best of each, their ratio) N
times over, each with a fresh model, optimizer and run folder; ``--out`` appends one JSON line per round (tokens/s,
steps, repeat, round, settings, command, host: ``benchmarks/records.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import math
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from benchmarks.records import BenchmarkError, append_rows, invocation, positive_int
from ladder_train.config import load_config, model_args
from ladder_train.model import Transformer
from ladder_train.parallel import init_distributed, resolve_dtype
from ladder_train.train.optim import build_optimizer, freeze_lower_layers
from ladder_train.train.trainer import Trainer

DEFAULTS = [
    "model.vocab_size=8192",
    "model.dim=256",
    "model.n_layers=4",
    "model.n_heads=4",
    "model.ffn_dim=688",
    "model.max_seq_len=256",
    "model.residual=ladder",
    "data.seq_len=256",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "train.log_every=10",
    "train.schedule.warmup_steps=5",
    "train.schedule.total_steps=1000",
    "wandb.mode=disabled",
]


def make_batches(cfg, count: int) -> list:
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(
        0, cfg.model.vocab_size, (count, cfg.train.micro_batch_size, cfg.data.seq_len + 1), generator=gen
    )
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def bare_loop(cfg, batches: list, steps: int, device: torch.device) -> float:
    """Tokens/s of the bare loop on ``device`` (the trainer's: ``init_distributed().device``)."""
    torch.manual_seed(cfg.run.seed)
    model = Transformer(model_args(cfg.model)).to(device)
    freeze_lower_layers(model, cfg.train.freeze_layers)
    optimizer = build_optimizer(model, cfg.train.optimizer)
    dtype = resolve_dtype(cfg.train.dtype, device)
    cast = contextlib.nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)
    accumulation = cfg.train.global_batch_size // cfg.train.micro_batch_size
    tokens_per_step = cfg.train.global_batch_size * cfg.data.seq_len
    # held in device memory before timing
    source = itertools.cycle([(x.to(device), y.to(device)) for x, y in batches])
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        for _ in range(accumulation):
            inputs, labels = next(source)
            with cast:
                logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / tokens_per_step
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.optimizer.grad_clip or math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _synchronize(device)
    elapsed = time.perf_counter() - start
    check_optimizer_steps(optimizer, steps)
    return steps * tokens_per_step / elapsed


def check_optimizer_steps(optimizer, steps: int) -> None:
    """Every trained parameter's AdamW state counted ``steps`` updates: the loop timed did the steps."""
    counts = {int(state["step"]) for state in optimizer.state.values()}
    if counts != {steps}:
        raise BenchmarkError(f"bare loop: the optimizer stepped {sorted(counts)} times instead of {steps}")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def trainer_loop(cfg, batches: list, steps: int, env) -> float:
    cfg.train.max_steps = steps
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as run_dir:
        cfg.run.dir = run_dir  # fresh per round: nothing to resume from
        trainer = Trainer(cfg, env, batches=itertools.cycle(batches))
        first = trainer.step
        start = time.perf_counter()
        history = trainer.train()
        elapsed = time.perf_counter() - start
    done = trainer.step - first
    if first != 0 or done != steps or len(history) != steps:
        raise BenchmarkError(
            f"trainer round ran {done} steps (from step {first}, {len(history)} logged) instead of {steps}: "
            "its tokens/s would not measure training"
        )
    return steps * cfg.train.global_batch_size * cfg.data.seq_len / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive_int, default=20)
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument("--repeats", type=positive_int, default=1, help="independent measurements, each of --rounds")
    parser.add_argument("--out", default=None, help="JSON lines file the rows are appended to")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    context = invocation("benchmarks.train_step", argv)
    cfg = load_config(None, DEFAULTS + args.overrides)
    torch.set_num_threads(torch.get_num_threads())
    env = init_distributed()
    batches = make_batches(cfg, 16)
    context.update(settings(cfg, args, env.device))
    rows, ratios = [], []
    for repeat in range(args.repeats):
        if args.repeats > 1:
            print(f"-- repeat {repeat + 1} of {args.repeats}")
        bare, trained = [], []
        for _ in range(args.rounds):
            bare.append(bare_loop(cfg, batches, args.steps, env.device))
            trained.append(trainer_loop(cfg, batches, args.steps, env))
        for loop, rates in (("bare", bare), ("trainer", trained)):
            tokens = args.steps * context["tokens_per_step"]
            rows += [
                {
                    **context,
                    "repeat": repeat,
                    "round": i,
                    "loop": loop,
                    "steps": args.steps,
                    "tokens": tokens,
                    "seconds": tokens / rate,
                    "tokens_per_s": rate,
                }
                for i, rate in enumerate(rates)
            ]
        ratios.append(report(bare, trained, args.steps))
    dist.destroy_process_group()
    if args.repeats > 1:
        print(
            f"trainer / bare over {args.repeats} repeats: median {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f})"
        )
    append_rows(args.out, rows)


def report(bare: list[float], trained: list[float], steps: int) -> float:
    """Print one repeat's rounds and best-of ratio; return trainer / bare."""
    best_bare, best_trainer = max(bare), max(trained)
    print(f"bare loop : {best_bare:,.0f} tokens/s (rounds: {', '.join(f'{x:,.0f}' for x in bare)})")
    print(
        f"trainer   : {best_trainer:,.0f} tokens/s (rounds: {', '.join(f'{x:,.0f}' for x in trained)}; "
        f"each ran {steps} steps in a fresh run folder)"
    )
    print(f"trainer / bare = {best_trainer / best_bare:.3f} (overhead {100 * (1 - best_trainer / best_bare):.1f} %)")
    return best_trainer / best_bare


def settings(cfg, args: argparse.Namespace, device: torch.device) -> dict:
    """What a row needs beside its figure to say what was measured."""
    with torch.device("meta"):  # counted without allocating the weights
        params = sum(p.numel() for p in Transformer(model_args(cfg.model)).parameters())
    return {
        "bench": "train_step",
        "rounds": args.rounds,
        "repeats": args.repeats,
        "overrides": args.overrides,
        "model": dataclasses.asdict(model_args(cfg.model)),
        "parameters": params,
        "seq_len": cfg.data.seq_len,
        "global_batch_size": cfg.train.global_batch_size,
        "micro_batch_size": cfg.train.micro_batch_size,
        "tokens_per_step": cfg.train.global_batch_size * cfg.data.seq_len,
        "dtype": str(resolve_dtype(cfg.train.dtype, device)).removeprefix("torch."),
        "device": device.type,
    }


if __name__ == "__main__":
    main()
