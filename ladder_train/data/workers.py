"""The stream loader's worker processes (loader.py): where they come from, and how they end with their trainer.

They are not forked from the trainer. A fork copies a multi-threaded process (the trainer runs pin-memory,
checkpoint and compile threads; torch and datasets start their own) with every lock another thread held at that
moment, and the child can wait for ever on one in CPython's after-fork re-initialisation (gdb on a hung CI worker:
``_PyThreadState_DeleteExcept`` in ``PyOS_AfterFork_Child``). They are forked instead by multiprocessing's fork
server (not spawned: a spawned worker would import torch and datasets itself, seconds of CPU, at every loader
start). The server is one process per trainer, started by fork + exec (safe from any thread) when the first loader
is built, so that it imports the worker's modules (``PRELOAD``) once while the trainer builds its model; it forks
each worker from its only Python thread (numpy's OpenBLAS and pyarrow's jemalloc keep native threads, which prepare
for a fork themselves). A worker then starts in a fraction of a second, and gets the loader's dataset and
``worker_init_fn`` by pickle (tests/test_data_workers.py pickles each kind of source).

The server lives as long as the trainer: multiprocessing ends it when the trainer's end of its pipe closes, also on
kill -9. It ignores the preemption signals, which reach it with the trainer's (a terminal's hang-up, Slurm
signalling every process of a job step): the trainer finishes its step with its workers after one, and a worker
stops when its parent does (torch's watchdog follows the parent, and so does the worker's parent-death signal).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from multiprocessing import forkserver, resource_tracker

from ..lifetime import PREEMPTION_SIGNALS, end_with_parent

# what a worker runs: the loader's dataset, its reading and tokenizing, torchdata's worker loop, init_worker
PRELOAD = ("ladder_train.data.workers", "ladder_train.data.loader", "torchdata.stateful_dataloader.worker")
WORKER_GRACE_S = 30


def worker_context() -> multiprocessing.context.BaseContext:
    """The loader's ``multiprocessing_context``: the fork server, started now with the worker's modules so that it
    imports them while the trainer builds its model (a later loader reuses it). It and multiprocessing's resource
    tracker start with the preemption signals blocked, and keep them so: the tracker unblocks only the two it
    ignores (SIGINT, SIGTERM), the server none (a worker gets them back, ``_worker_signals``)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # read only when the server starts
    with _preemption_blocked():
        resource_tracker.ensure_running()
    with _preemption_blocked():  # again: the tracker's start unblocks SIGINT and SIGTERM on its way out
        forkserver.ensure_running()
    return context


@contextlib.contextmanager
def _preemption_blocked():
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def init_worker(worker_id: int, trainer_pid: int) -> None:
    """A worker's ``worker_init_fn``."""
    die_with_trainer(trainer_pid)
    # each worker is one tokenizing process; the Rust thread pool would oversubscribe the cores
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # preemption signals (Slurm, torchrun) reach the whole process group: the trainer handles them and
    # still needs its workers for the step it finishes before saving, so a worker outlives them by a grace
    # period (ignoring them outright would also ignore the parent's terminate() at exit, and hang it)
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, _exit_after_grace)


def die_with_trainer(trainer_pid: int) -> None:
    """End this worker when the trainer dies, even by SIGKILL: torch's own check (every 5 s, between batches)
    never runs in a worker stuck writing a batch into a full pipe nobody reads, which kept such workers alive
    (and their memory) forever. The kernel's parent-death signal follows the fork server, which ends with the
    trainer; a thread watches the trainer itself too (another child of the trainer holding the server's pipe
    would keep the server alive)."""
    parent = os.getppid()
    if parent != trainer_pid:
        end_with_parent(parent, signal.SIGKILL)
    end_with_parent(trainer_pid, signal.SIGKILL)


def _exit_after_grace(signum, frame) -> None:
    if signal.getitimer(signal.ITIMER_REAL)[0] == 0.0:
        signal.alarm(WORKER_GRACE_S)  # SIGALRM's default action ends the worker


def _worker_signals() -> None:
    """A worker just forked by the server: the preemption signals delivered, with their default actions, until
    ``init_worker`` sets its own (a worker stuck before that still ends at the trainer's ``terminate()``)."""
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PREEMPTION_SIGNALS)


def _ignore_preemption_in_the_fork_server() -> None:
    """In the fork server (this module is imported there by ``forkserver.main``'s preload, nowhere else): ignore
    the preemption signals (also where the server did not start with them blocked), and give each worker it forks
    the default ones back."""
    frame = sys._getframe()
    while frame is not None and frame.f_code is not forkserver.main.__code__:
        frame = frame.f_back
    if frame is None:
        return
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    os.register_at_fork(after_in_child=_worker_signals)


_ignore_preemption_in_the_fork_server()
