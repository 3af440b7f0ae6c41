"""Every console script starts here, and here its errors become one line and an exit status.

``ladder-train --config R [key=value ...]`` trains (also ``python -m ladder_train.train``, what torchrun
launches); its subcommands are ``show`` (resolved config and model size), ``study`` (a grid of runs) and ``demo`` (the
quick start's job).
``ladder-bench``, ``ladder-eval``, ``ladder-export``, ``ladder-report``, ``ladder-predict`` and ``ladder-generate`` parse and run in
their own modules (``run(argv)``), called through ``run_command``.

Exit status, the same for every command: 0 done; 1 the work failed (a damaged checkpoint, a non-finite loss,
run.dir in use by another trainer: ``errors.RunFailed``); 2 bad input, nothing done (a flag, config key,
recipe, data source, tokenizer or model folder: ``errors.InputError``; argparse's own usage errors are 2 too);
75 preempted with a checkpoint saved (the Slurm script requeues on it). Errors print as ``PROG: error: ...``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from .config import load_config, model_args, to_yaml
from .errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_REQUEUE, InputError, Preempted, RunFailed


def run_command(prog: str, command: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    """Run ``command(argv)`` under the error policy above; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return command(argv) or EXIT_OK
    except Preempted as note:
        print(f"{prog}: preempted: {note}", file=sys.stderr)
        return EXIT_REQUEUE
    except (InputError, RunFailed) as err:
        if not getattr(err, "quiet", False):  # e.g. a lock refusal is printed by rank 0 only
            print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT if isinstance(err, InputError) else EXIT_FAILED


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
    if cfg.checkpoint.init_from:  # a model that does not fit the recipe is refused before any process group exists
        from .loading import check_init_source

        check_init_source(cfg.checkpoint.init_from, model_args(cfg.model))
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


def cmd_study(argv: list[str]) -> int:
    """A grid of runs over config keys (``key=a,b`` sweeps), run here one after another or as a Slurm array."""
    from .study.runner import Study

    parser = _config_parser("ladder-train study")
    parser.description = (
        "Run a grid of trainings: key=a,b,c sweeps a key, key=[a,b] is one list value, run.dir names the study's "
        "folder. Finished points are skipped, cut-off ones resume."
    )
    parser.add_argument("--dry-run", action="store_true", help="list the points and their state, run nothing")
    parser.add_argument(
        "--point", type=int, default=None, metavar="I", help="print point I's trainer overrides (slurm/study.sh)"
    )
    args = parser.parse_args(argv)
    if args.config is None:
        parser.error("--config is required")
    study = Study(args.config, args.overrides)
    if args.point is not None:
        print("\n".join(study.point(args.point).run_overrides(study.dir)))
    elif args.dry_run:
        print(study.describe(args.overrides))
    else:
        study.run_all()
    return 0


SUBCOMMANDS = {"show": cmd_show, "demo": cmd_demo, "study": cmd_study}


def _train_command(argv: list[str]) -> int:
    command = SUBCOMMANDS[argv.pop(0)] if argv and argv[0] in SUBCOMMANDS else cmd_train
    return command(argv)


def main(argv: list[str] | None = None) -> int:
    """``ladder-train``."""
    return run_command("ladder-train", _train_command, argv)


def _module_command(prog: str, module: str) -> Callable[[list[str] | None], int]:
    def entry(argv: list[str] | None = None) -> int:
        return run_command(prog, importlib.import_module(module).run, argv)

    entry.__doc__ = f"``{prog}``: ``{module}.run`` under the error policy."
    return entry


bench = _module_command("ladder-bench", "ladder_train.inference.bench")
evaluate = _module_command("ladder-eval", "ladder_train.evaluation.cli")
export = _module_command("ladder-export", "ladder_train.export")
report = _module_command("ladder-report", "ladder_train.report")
predict = _module_command("ladder-predict", "ladder_train.inference.predict")
generate = _module_command("ladder-generate", "ladder_train.inference.generate")


if __name__ == "__main__":
    sys.exit(main())
