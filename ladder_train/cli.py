"""The ``ladder-train`` command (also ``python -m ladder_train.train``, what torchrun launches).
``ladder-train --config R [key=value ...]`` trains; subcommands: ``show`` (resolved config and model size),
``demo`` (the quick start's job).

Exit status: 0 done, 1 a failure while training (non-finite loss, a bad checkpoint, run.dir locked), 2 bad input
(config, recipe, data source), 75 preempted with a checkpoint saved (the Slurm script requeues on it)."""

from __future__ import annotations

import argparse
import sys

from .config import ConfigError, load_config, model_args, to_yaml


def _config_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", help="a recipe YAML (recipes/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. model.n_layers=4")
    return parser


def _layout_summary(layouts: list[str]) -> str:
    """['standard', 'standard', 'ladder'] -> '2 standard + 1 ladder'."""
    runs: list[list] = []
    for layout in layouts:
        if runs and runs[-1][1] == layout:
            runs[-1][0] += 1
        else:
            runs.append([1, layout])
    return " + ".join(f"{n} {layout}" for n, layout in runs)


def cmd_train(argv: list[str]) -> int:
    """Train (the default command); ``--dry-run`` plans the mesh and memory without training."""
    import torch.distributed as dist

    from .parallel import init_distributed
    from .train.plan import dry_run
    from .train.trainer import Trainer

    parser = _config_parser("ladder-train")
    parser.description = "Pretrain a standard, parallel or ladder transformer."
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build the mesh and sharded model on the meta device, print the plan, exit",
    )
    parser.add_argument(
        "--simulate", default=None, metavar="NODESxGPUS", help="with --dry-run: the world to plan for, e.g. 16x8"
    )
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    if args.dry_run:
        print(dry_run(cfg, args.simulate))
        return 0
    env = init_distributed(cfg.parallel.timeout_s)
    try:
        Trainer(cfg, env).train()
    finally:
        dist.destroy_process_group()
    return 0


def cmd_show(argv: list[str]) -> int:
    """Print the resolved config and the model's size."""
    from .model.presets import count_params, flops_per_token

    args = _config_parser("ladder-train show").parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    print(to_yaml(cfg), end="")
    margs = model_args(cfg.model)
    counts = count_params(margs)
    print(
        f"# parameters: {counts['total'] / 1e6:,.1f}M total, {counts['non_embedding'] / 1e6:,.1f}M non-embedding; "
        f"{flops_per_token(margs, cfg.data.seq_len) / 1e9:,.2f} GFLOPs/token (train); layers: {_layout_summary(margs.layer_layouts())}"
    )
    return 0


def cmd_demo(argv: list[str]) -> int:
    """Train the three layouts briefly, evaluate them, benchmark TP = 2, write the report."""
    from .demo import main as demo_main

    return demo_main(argv)


SUBCOMMANDS = {"show": cmd_show, "demo": cmd_demo}


def main(argv: list[str] | None = None) -> int:
    from .checkpoint import CheckpointError
    from .train.trainer import EXIT_REQUEUE, NonFiniteLossError, Preempted

    argv = list(sys.argv[1:] if argv is None else argv)
    command = SUBCOMMANDS[argv.pop(0)] if argv and argv[0] in SUBCOMMANDS else cmd_train
    try:
        return command(argv)
    except Preempted as note:
        print(f"preempted: {note}", file=sys.stderr)
        return EXIT_REQUEUE
    except (ConfigError, NonFiniteLossError, CheckpointError) as err:
        if not getattr(err, "quiet", False):  # a lock refusal is printed by rank 0 only
            print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
