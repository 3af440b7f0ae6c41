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
75 preempted with a checkpoint saved (the Slurm script requeues on it); 130 interrupted by Ctrl-C at any moment, while
the imports load too (``ladder-data prepare`` removes its partial files first). Errors print as ``PROG: error: ...``,
an interruption as ``PROG: interrupted (Ctrl-C)``.
An ``OSError`` from the file system (no space, a name too long, a read-only folder, a symlink loop) is one line too,
naming the path: 1 when space or the device ran out while working, 2 otherwise (a path that cannot be used).
"""

from __future__ import annotations

import errno
import importlib
import sys
from collections.abc import Callable

from ..errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REQUEUE,
    InputError,
    Preempted,
    RunFailed,
)


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
    except OSError as err:
        if err.errno not in PATH_ERRORS:
            raise
        print(f"{prog}: error: {describe_os_error(err)}", file=sys.stderr)
        return EXIT_FAILED if err.errno in OUT_OF_SPACE else EXIT_BAD_INPUT
    except KeyboardInterrupt:  # the command's heavy imports load in here too: no traceback of them
        print(f"{prog}: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED


# the file-system errors a user fixes (the path, the space): one line; any other OSError keeps its traceback
OUT_OF_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
PATH_ERRORS = OUT_OF_SPACE | {
    errno.ENAMETOOLONG,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.ELOOP,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.ENOENT,
    errno.EEXIST,
}
_WHAT_TO_DO = {
    errno.ENOSPC: "free space there or choose another folder (a run resumes from its last complete checkpoint)",
    errno.EDQUOT: "the disk quota is used up: free space there or choose another folder",
    errno.EFBIG: "a file reached the size limit (the shell's ulimit -f or the file system's): raise it or choose another folder",
    errno.ENAMETOOLONG: "use shorter folder or file names (most file systems allow 255 bytes per name)",
    errno.EROFS: "the file system is read-only: choose a writable folder",
    errno.EACCES: "no permission: choose a folder you can write, or change its permissions",
    errno.EPERM: "not permitted: choose a folder you can write",
    errno.ELOOP: "a symbolic link points back into itself: fix or remove it",
}


def describe_os_error(err: OSError) -> str:
    """``PATH: reason (what to do)``, one line."""
    where = " -> ".join(str(name) for name in (err.filename, err.filename2) if name is not None)
    reason = err.strerror or str(err)
    advice = _WHAT_TO_DO.get(err.errno)
    text = f"{where}: {reason}" if where else reason
    return f"{text} ({advice})" if advice else text


def _train_command(argv: list[str]) -> int:
    from .train import SUBCOMMANDS, cmd_train

    command = SUBCOMMANDS[argv.pop(0)] if argv and argv[0] in SUBCOMMANDS else cmd_train
    return command(argv)


def main(argv: list[str] | None = None) -> int:
    """``ladder-train``."""
    return run_command("ladder-train", _train_command, argv)


def _module_command(prog: str, module: str) -> Callable[[list[str] | None], int]:
    def entry(argv: list[str] | None = None) -> int:
        return run_command(prog, lambda args: importlib.import_module(module).run(args), argv)  # imports in the policy

    entry.__doc__ = f"``{prog}``: ``{module}.run`` under the error policy."
    return entry


ladder_bench = _module_command("ladder-bench", "ladder_train.cli.bench")
ladder_eval = _module_command("ladder-eval", "ladder_train.cli.eval")
ladder_export = _module_command("ladder-export", "ladder_train.cli.export")
ladder_report = _module_command("ladder-report", "ladder_train.cli.report")
ladder_predict = _module_command("ladder-predict", "ladder_train.cli.predict")
ladder_generate = _module_command("ladder-generate", "ladder_train.cli.generate")
ladder_data = _module_command("ladder-data", "ladder_train.cli.data")
vllm_tpot = _module_command("python -m ladder_train.serve", "ladder_train.cli.serve_bench")
