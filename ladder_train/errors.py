"""The two kinds of error every console script reports in one line (``cli.run_command`` prints them and
chooses the exit status), plus the preemption signal. No heavy imports: every CLI imports this first."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input (a flag, config key, file or value); nothing was done. Exit status 2, as argparse's."""


class ConfigError(InputError):
    """A recipe or override that cannot run. The message is one line naming the file, key or value."""


class DataError(InputError):
    """A data source or tokenizer that cannot be used; the message is one line naming the file or key."""


class RunFailed(RuntimeError):
    """The work could not go on (a damaged checkpoint, a non-finite loss, a run.dir in use). Exit status 1."""


class Preempted(Exception):
    """SIGTERM or SIGUSR1 arrived: a checkpoint of the current step was saved; requeue to resume. Exit 75."""


# exit status of every console script (cli.run_command); 75 is sysexits' EX_TEMPFAIL: the Slurm script requeues on it;
# 130 is 128 + SIGINT, as a shell reports a Ctrl-C
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_REQUEUE, EXIT_INTERRUPTED = 0, 1, 2, 75, 130
