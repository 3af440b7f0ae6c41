"""Every console script starts here, and here its errors become one line and an exit status.

``ladder-train --config R [key=value ...]`` trains (also ``python -m ladder_train.train``, what torchrun
launches); its subcommands are ``show`` (resolved config and model size), ``study`` (a grid of runs) and ``demo`` (the
quick start's job).
``ladder-bench``, ``ladder-eval``, ``ladder-export``, ``ladder-report``, ``ladder-predict``, ``ladder-generate`` and
``ladder-data`` parse their flags in this package's modules (``cli/bench.py``, ... each with ``run(argv)``) and call
the library; no library module imports this package. ``cli/args.py`` holds the flag parsing they share.

Exit status, the same for every command: 0 done; 1 the work failed (a damaged checkpoint, a non-finite loss,
run.dir in use by another trainer: ``errors.RunFailed``); 2 bad input, nothing done (a flag, config key,
recipe, data source, tokenizer or model folder: ``errors.InputError``; argparse's own usage errors are 2 too);
75 preempted with a checkpoint saved (the Slurm script requeues on it). Errors print as ``PROG: error: ...``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_REQUEUE, InputError, Preempted, RunFailed


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


def _train_command(argv: list[str]) -> int:
    from .train import SUBCOMMANDS, cmd_train

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


ladder_bench = _module_command("ladder-bench", "ladder_train.cli.bench")
ladder_eval = _module_command("ladder-eval", "ladder_train.cli.eval")
ladder_export = _module_command("ladder-export", "ladder_train.cli.export")
ladder_report = _module_command("ladder-report", "ladder_train.cli.report")
ladder_predict = _module_command("ladder-predict", "ladder_train.cli.predict")
ladder_generate = _module_command("ladder-generate", "ladder_train.cli.generate")
ladder_data = _module_command("ladder-data", "ladder_train.cli.data")
