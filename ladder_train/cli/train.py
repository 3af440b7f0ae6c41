"""``ladder-train``: train (the default command), ``show`` a resolved config, run a ``study``, or the ``demo``."""

from __future__ import annotations

import argparse
import json

from ..config import load_config, model_args, to_yaml
from .args import Parser, new_output_folder, non_negative_float, positive_float, positive_int


def _config_parser(prog: str) -> Parser:
    parser = Parser(prog=prog)
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

    from ..parallel import init_distributed
    from ..train.memory_plan import plan_summary, plan_text
    from ..train.trainer import Trainer

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
    parser.add_argument(
        "--gpu-memory",
        type=positive_float,
        default=None,
        metavar="GIB",
        help="with --dry-run: the GPU memory planned for: what parallel.accumulate=auto chooses on it and the "
        "largest micro-batch that fits it (default 80, an H100)",
    )
    parser.add_argument("--json", action="store_true", help="with --dry-run: the plan's figures as one JSON line")
    args = parser.parse_args(argv)
    if args.json and not args.dry_run:
        parser.error("--json only means something with --dry-run: add it, or leave --json out to train")
    for flag, value in (("--simulate", args.simulate), ("--gpu-memory", args.gpu_memory)):
        if value is not None and not args.dry_run:  # ignored, a full training would start instead of a plan
            parser.error(f"{flag} {value!r} only means something with --dry-run: add it, or leave {flag} out to train")
    cfg = load_config(args.config, args.overrides)
    if cfg.checkpoint.init_from:  # a model that does not fit the recipe is refused before any process group exists
        from ..loading import check_init_source

        check_init_source(cfg.checkpoint.init_from, model_args(cfg.model))
    if args.dry_run:
        summary = plan_summary(cfg, args.simulate, (args.gpu_memory or 80.0) * 2**30)
        print(json.dumps(summary) if args.json else plan_text(summary))
        return 0
    env = init_distributed(cfg.parallel.timeout_s)
    try:
        Trainer(cfg, env).train()
    finally:
        dist.destroy_process_group()
    return 0


def cmd_show(argv: list[str]) -> int:
    """Print the resolved config and the model's size."""
    from ..model import count_params, flops_per_token

    args = _config_parser("ladder-train show").parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    print(to_yaml(cfg), end="")
    margs = model_args(cfg.model)
    counts = count_params(margs)
    print(
        f"# parameters: {counts['total'] / 1e6:,.1f}M total, {counts['non_embedding'] / 1e6:,.1f}M non-embedding; "
        f"{flops_per_token(margs, cfg.data.seq_len, frozen_layers=cfg.train.freeze_layers) / 1e9:,.2f} GFLOPs/token (train); layers: {_layout_summary(margs.layer_layouts())}"
    )
    return 0


def cmd_demo(argv: list[str]) -> int:
    """Train the three layouts briefly, evaluate them, benchmark TP = 2, write the report."""
    import time
    from pathlib import Path

    from ..demo import __doc__ as demo_doc
    from ..demo import run_demo

    parser = Parser(
        prog="ladder-train demo", description=demo_doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/demo"))
    parser.add_argument("--steps", type=positive_int, default=300, help="training steps per layout")
    parser.add_argument(
        "--link-latency-ms",
        type=non_negative_float,
        default=1.0,
        help="the emulated all-reduce latency of the TP benchmark",
    )
    args = parser.parse_args(argv)
    started = time.time()
    report = run_demo(args.out, args.steps, args.link_latency_ms)
    print(f"\ndemo finished in {(time.time() - started) / 60:.1f} min: open {report}")
    return 0


def cmd_study(argv: list[str]) -> int:
    """A grid of runs over config keys (``key=a,b`` sweeps), run here one after another or as a Slurm array."""
    from ..study.runner import Study

    parser = _config_parser("ladder-train study")
    parser.description = (
        "Run a grid of trainings: key=a,b,c sweeps a key, key=[a,b] is one list value, run.dir names the study's "
        "folder. Finished points are skipped, cut-off ones resume."
    )
    parser.add_argument("--dry-run", action="store_true", help="list the points and their state, run nothing")
    parser.add_argument(
        "--point", type=int, default=None, metavar="I", help="print point I's trainer overrides (slurm/study.sh)"
    )
    parser.add_argument(
        "--collect",
        type=new_output_folder,
        default=None,
        metavar="DIR",
        help="copy each finished point's config, metrics and eval results to DIR/<point>/ (to commit), run nothing",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="with --collect: write into point folders that hold other files (those stay) or another run's results "
        "(replaced)",
    )
    args = parser.parse_args(argv)
    if args.config is None:
        parser.error("--config is required")
    if args.overwrite and args.collect is None:
        parser.error("--overwrite: only with --collect")
    study = Study(args.config, args.overrides)
    if args.collect is not None:
        written = study.collect(args.collect, overwrite=args.overwrite)
        print(f"study {study.dir}: {len(written)} of {len(study.points)} points finished, copied to {args.collect}")
        return 0
    if args.point is not None:
        print("\n".join(study.point(args.point).run_overrides(study.dir)))
    elif args.dry_run:
        print(study.describe(args.overrides))
    else:
        study.run_all()
    return 0


SUBCOMMANDS = {"show": cmd_show, "demo": cmd_demo, "study": cmd_study}
