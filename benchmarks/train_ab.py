"""Two trainer settings side by side: alternating rounds of the real trainer, each in a fresh run folder.

    python -m benchmarks.train_ab --a KEY=VALUE [--a ...] --b KEY=VALUE [--b ...] [--steps 20] [--rounds 5]
                                  [--threads 1] [--out FILE.jsonl] [key=value ...]

It measures variant a against variant b on a host-bound step by default: a model so
small (16 layers of dim 32, micro-batches of 2 x 16 tokens, fp32) that the host's work per block call, not the
arithmetic, sets the step time, as at micro-batch 2 of the 1.2B on an H100 (docs/benchmarks.md). On the CPU that
is an emulation: the interpreter's and dispatcher's share of a block call is timed, a GPU's launch costs are not,
and each generated CPU kernel stands in for a launch. One thread by default (``--threads``): on more, each tiny
kernel's OpenMP fork and join adds to what is timed.
Each variant first runs one untimed round (compilation); then ``--rounds`` pairs alternate a and b, so a slower
machine hurts both alike, and a pair's b / a ratio is taken within the pair. A round's figure is the trainer's own
tokens/s over its second half of ``--steps`` (the log interval that ends it), so neither a round's first step nor
its final checkpoint is timed. Every round must have run exactly ``--steps`` steps (BenchmarkError, exit 1,
otherwise). ``--out`` appends one JSON line per timed round.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile

import torch
import torch.distributed as dist

from benchmarks.records import BenchmarkError, append_rows, invocation, pair_ratios, positive_int, refuse
from benchmarks.train_step import make_batches, settings
from ladder_train.config import load_config
from ladder_train.errors import ConfigError
from ladder_train.parallel import init_distributed
from ladder_train.train.trainer import Trainer

# fp32: one process then trains without FSDP, whose hooks the host code of the blocks does not include; in bf16 this
# CPU's slow bf16 kernels would be most of what is timed
HOST_BOUND = [
    "model.vocab_size=64",
    "model.dim=32",
    "model.n_layers=16",
    "model.n_heads=2",
    "model.ffn_dim=64",
    "model.max_seq_len=16",
    "model.residual=standard",
    "data.seq_len=16",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",
    "train.dtype=fp32",
    "train.log_every=10",
    "train.schedule.warmup_steps=5",
    "train.schedule.total_steps=1000",
    "parallel.compile=true",
    "parallel.accumulate=unsharded",
    "wandb.mode=disabled",
]
WARMUP_STEPS = 4  # the untimed round that compiles each variant
MIN_STEPS = 4  # a round times its second half: at least two steps after its first


def timed_round(cfg, batches: list, steps: int, env) -> float:
    """Tokens/s of the trainer over the last ``steps - steps // 2`` of ``steps`` steps, in a fresh run folder."""
    cfg.train.max_steps, cfg.train.log_every = steps, steps // 2
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as run_dir:
        cfg.run.dir = run_dir  # nothing to resume from
        trainer = Trainer(cfg, env, batches=itertools.cycle(batches))
        history = trainer.train()
    if trainer.step != steps or len(history) != steps or "tokens_per_s" not in history[-1]:
        raise BenchmarkError(
            f"a round ran {trainer.step} steps ({len(history)} recorded) instead of {steps}: its tokens/s would "
            "not measure training"
        )
    return history[-1]["tokens_per_s"]


def block_calls_per_step(cfg) -> int:
    """Forward calls of the blocks in one optimizer step (each has its backward)."""
    return cfg.model.n_layers * (cfg.train.global_batch_size // cfg.train.micro_batch_size)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", action="append", required=True, metavar="KEY=VALUE", help="variant a's overrides")
    parser.add_argument("--b", action="append", required=True, metavar="KEY=VALUE", help="variant b's overrides")
    parser.add_argument("--steps", type=positive_int, default=20, help="steps per round (its second half is timed)")
    parser.add_argument("--rounds", type=positive_int, default=5, help="alternating pairs of timed rounds")
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch's CPU threads (default 1: no OpenMP fork and join)"
    )
    parser.add_argument("--out", default=None, help="JSON lines file the rows are appended to")
    parser.add_argument("overrides", nargs="*", help="overrides of both variants, after the host-bound defaults")
    args = parser.parse_args(argv)
    if args.steps < MIN_STEPS:
        parser.error(f"--steps {args.steps}: a round times its second half, so it needs at least {MIN_STEPS} steps")
    variants = {"a": args.a, "b": args.b}
    # each variant's config is checked before anything runs: a bad key fails in one line, not after round one
    try:
        configs = {name: load_config(None, HOST_BOUND + args.overrides + extra) for name, extra in variants.items()}
    except ConfigError as err:
        refuse("benchmarks.train_ab", str(err))
    torch.set_num_threads(args.threads)  # before the rows' host record, which reports it
    context = invocation("benchmarks.train_ab", argv)
    env = init_distributed()
    first = configs["a"]
    batches = make_batches(first, 16)
    context.update(
        settings(first, argparse.Namespace(rounds=args.rounds, repeats=1, overrides=args.overrides), env.device)
    )
    context.update(
        bench="train_ab",
        variants=variants,
        block_calls_per_step=block_calls_per_step(first),
        compiled={name: cfg.parallel.compile for name, cfg in configs.items()},
    )
    for cfg in configs.values():
        timed_round(cfg, batches, WARMUP_STEPS, env)
    timed = args.steps - args.steps // 2
    rows = []
    for pair in range(args.rounds):
        for name, cfg in configs.items():
            rate = timed_round(cfg, batches, args.steps, env)
            seconds = timed * context["tokens_per_step"] / rate
            rows.append(
                {
                    **context,
                    "round": pair,
                    "variant": name,
                    "steps": args.steps,
                    "timed_steps": timed,
                    "seconds": seconds,
                    "tokens_per_s": rate,
                    "step_ms_per_block_call": 1e3 * seconds / timed / context["block_calls_per_step"],
                }
            )
    dist.destroy_process_group()
    print(report(rows))
    append_rows(args.out, rows)


def report(rows: list[dict]) -> str:
    lines = []
    for name in ("a", "b"):
        mine = [r for r in rows if r["variant"] == name]
        ms = [r["step_ms_per_block_call"] for r in mine]
        lines.append(
            f"{name} {' '.join(mine[0]['variants'][name])}: {statistics.median(ms):.3f} ms of step per block call "
            f"(rounds: {', '.join(f'{x:.3f}' for x in ms)})"
        )
    ratios = pair_ratios(rows)
    lines.append(
        f"b / a tokens/s within each pair: median {statistics.median(ratios):.3f} "
        f"(range {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} pairs)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
