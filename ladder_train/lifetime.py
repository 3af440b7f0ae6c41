"""A process that must not outlive the one that started it: loader workers (their trainer), ranks (torchrun;
ladder-bench's spawned ones), a study's trainers (the study), the commands ladder-predict validate and the demo run.
The kernel signals the child when its parent dies, even by SIGKILL (Linux); where that cannot be armed, a thread
polls the parent's pid."""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import threading
import time

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)  # each saves and exits 75
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to this process when ``parent_pid`` (its parent) dies. The kernel's parent-death signal fires
    when the forking thread exits; if the parent is already gone by the time it is armed, ``sig`` comes now."""
    armed = False
    if os.getppid() == parent_pid and sys.platform.startswith("linux"):
        try:
            armed = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if armed:
        if os.getppid() != parent_pid:  # the parent died between the fork and the prctl
            os.kill(os.getpid(), sig)
        return

    def watch() -> None:
        while alive(parent_pid):
            time.sleep(1.0)
        os.kill(os.getpid(), sig)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


def ends_with_this_process(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` for ``subprocess``: the child gets ``sig`` when this process dies, even by SIGKILL."""
    return functools.partial(end_with_parent, os.getpid(), sig)
