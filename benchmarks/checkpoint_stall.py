"""Checkpoint benchmark: how long training stalls per save (sync and async), and save / load time by size.

    python -m benchmarks.checkpoint_stall [--steps 30] [--every 10] [--dims 256,512,1024] [--repeats 1]
        [--out FILE.jsonl] [key=value ...]

Part 1 trains the same model on the same in-memory batches three times: checkpoints only at the end,
every ``--every`` steps written synchronously, and every ``--every`` steps with ``checkpoint.async_save``.
The stall per save is the wall time of the step interval that contains a save minus the median of the
others (the trainer logs every step, so each interval is one step plus whatever followed it).
Part 2 saves and loads a model + AdamW state of each width with the trainer's ``Checkpointer`` (DCP).

Each measurement must have done its work: a training ran ``--steps`` steps and wrote its checkpoints (the count
``every`` gives, the last one complete), and a load restored the saved weights (zeroed before it); else
BenchmarkError, exit 1. ``--repeats N`` makes both parts N times over, each in fresh folders; ``--out`` appends one
JSON line per training (its per-step walls) and per size (``benchmarks/records.py``).
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.records import BenchmarkError, append_rows, invocation, positive_int
from benchmarks.train_step import DEFAULTS, make_batches
from ladder_train.checkpoint import Checkpointer
from ladder_train.config import load_config, model_args
from ladder_train.model import Transformer
from ladder_train.parallel import init_distributed
from ladder_train.train.optim import build_optimizer
from ladder_train.train.trainer import Trainer

TRAINING = ["wandb.mode=disabled", "eval.at_end=false"]


def expected_saves(steps: int, every: int) -> int:
    """Saves of a run of ``steps`` steps: every ``every`` steps before the last, and the last."""
    return len(range(every, steps, every)) + 1 if every else 1


def step_walls(cfg, batches: list, env, steps: int, every: int, async_save: bool, run_dir: Path) -> tuple[float, list]:
    """(total seconds of ``train()``, wall seconds of every step interval) for one checkpoint setting."""
    cfg.run.dir = str(run_dir)
    cfg.train.max_steps, cfg.train.log_every = steps, 1
    cfg.checkpoint.every, cfg.checkpoint.async_save, cfg.checkpoint.keep = every, async_save, 1
    trainer = Trainer(cfg, env, batches=itertools.cycle(batches))
    saves = []
    real_save = trainer.checkpointer.save

    def counted_save(step, *args, **kwargs):
        saves.append(step)
        return real_save(step, *args, **kwargs)

    trainer.checkpointer.save = counted_save
    start = time.perf_counter()
    history = trainer.train()
    total = time.perf_counter() - start
    last = run_dir / "checkpoints" / f"step-{steps}" / "COMPLETE"
    if (
        trainer.step != steps
        or len(history) != steps
        or len(saves) != expected_saves(steps, every)
        or not last.is_file()
    ):
        raise BenchmarkError(
            f"training in {run_dir.name} ran {trainer.step} steps ({len(history)} logged) and saved at steps {saves} "
            f"(final complete: {last.is_file()}) instead of {steps} steps and {expected_saves(steps, every)} saves"
        )
    tokens_per_step = cfg.train.global_batch_size * cfg.data.seq_len
    return total, [tokens_per_step / r["tokens_per_s"] for r in history]


def stall_per_save(walls: list[float], every: int) -> float:
    """Median extra seconds of the intervals that hold a save (the step after each save, 0-based index k*every)."""
    after_save = [walls[i] for i in range(every, len(walls), every)]
    others = [w for i, w in enumerate(walls) if i % every and i > 0]
    return statistics.median(after_save) - statistics.median(others)


def save_load_times(dim: int, env, folder: Path) -> dict:
    """Seconds to save and to load (model + AdamW state, DCP, one process) a model of width ``dim``."""
    cfg = load_config(None, [*DEFAULTS, f"model.dim={dim}", f"model.ffn_dim={dim * 8 // 3 // 64 * 64 or 64}"])
    model = Transformer(model_args(cfg.model))
    optimizer = build_optimizer(model, cfg.train.optimizer)
    model(torch.zeros(1, 8, dtype=torch.long)).float().sum().backward()
    optimizer.step()  # the AdamW moments exist, as in a real checkpoint
    checkpointer = Checkpointer(cfg.checkpoint, folder, env.rank, env.world_size)
    start = time.perf_counter()
    path = checkpointer.save(1, model, optimizer, {"step": 1}, {"rng_cpu": torch.get_rng_state()})
    saved = time.perf_counter() - start
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    weights = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # so that the load has something to restore
    start = time.perf_counter()
    checkpointer.load(path, model, optimizer, {}, model_only=False)
    loaded = time.perf_counter() - start
    if not all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True)):
        raise BenchmarkError(f"dim {dim}: the load did not restore the saved weights")
    params = sum(p.numel() for p in model.parameters())
    return {"dim": dim, "params": params, "bytes": size, "mib": size / 2**20, "save_s": saved, "load_s": loaded}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--dims", default="256,512,1024", help="model widths for the save / load timings")
    parser.add_argument("--repeats", type=positive_int, default=1, help="independent measurements of both parts")
    parser.add_argument("--out", default=None, help="JSON lines file the rows are appended to")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.every < 2 or args.steps < 2 * args.every:
        parser.error(f"--every={args.every} must be >= 2 and --steps={args.steps} at least twice --every")
    return args


def measure_stalls(args, batches: list, env, scratch: Path) -> list[dict]:
    """Part 1: one training per checkpoint setting, round robin."""
    rows = []
    for label, every, async_save in (
        ("end only", 0, False),
        (f"every {args.every}, sync", args.every, False),
        (f"every {args.every}, async", args.every, True),
    ):
        cfg = load_config(None, DEFAULTS + TRAINING + args.overrides)
        total, walls = step_walls(cfg, batches, env, args.steps, every, async_save, scratch / label)
        stall = stall_per_save(walls, args.every) if every else None
        rows.append(
            {
                "part": "stall",
                "setting": label,
                "every": every,
                "async_save": async_save,
                "saves": expected_saves(args.steps, every),
                "total_s": total,
                "step_s": walls,
                "median_step_s": statistics.median(walls[1:]),
                "stall_per_save_s": stall,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    context = invocation("benchmarks.checkpoint_stall", argv)
    context.update(
        bench="checkpoint_stall",
        steps=args.steps,
        every_setting=args.every,
        repeats=args.repeats,
        overrides=args.overrides,
        dtype="float32",
    )
    env = init_distributed()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ladder-ckpt-bench-") as scratch:
        scratch = Path(scratch)
        batches = make_batches(load_config(None, DEFAULTS + args.overrides), 16)
        warm_cfg = load_config(None, DEFAULTS + TRAINING + args.overrides)
        step_walls(warm_cfg, batches, env, 2, 0, False, scratch / "warm-up")  # first-call costs out of the rows
        for repeat in range(args.repeats):
            folder = scratch / f"repeat-{repeat}"
            stalls = measure_stalls(args, batches, env, folder)
            sizes = [
                {"part": "size", **save_load_times(int(d), env, folder / f"size-{d}")} for d in args.dims.split(",")
            ]
            shutil.rmtree(folder)  # the disk holds one repeat's checkpoints at a time
            rows += [{**context, "repeat": repeat, **row} for row in stalls + sizes]
            print_repeat(args, repeat, stalls, sizes)
    dist.destroy_process_group()
    append_rows(args.out, rows)


def print_repeat(args, repeat: int, stalls: list[dict], sizes: list[dict]) -> None:
    title = f" (repeat {repeat + 1} of {args.repeats})" if args.repeats > 1 else ""
    print(f"\n{args.steps} steps, log every step; stall = interval holding a save - median interval{title}")
    print(f"{'checkpoints':<22} {'total s':>8} {'median step s':>14} {'stall per save s':>17}")
    for r in stalls:
        stall = "-" if r["stall_per_save_s"] is None else f"{r['stall_per_save_s']:.3f}"
        print(f"{r['setting']:<22} {r['total_s']:>8.2f} {r['median_step_s']:>14.3f} {stall:>17}")
    print(f"\n{'dim':>6} {'params':>12} {'size MiB':>9} {'save s':>7} {'load s':>7} {'save MiB/s':>11}")
    for r in sizes:
        print(
            f"{r['dim']:>6} {r['params']:>12,} {r['mib']:>9.1f} {r['save_s']:>7.3f} {r['load_s']:>7.3f} "
            f"{r['mib'] / r['save_s']:>11.0f}"
        )


if __name__ == "__main__":
    main()
