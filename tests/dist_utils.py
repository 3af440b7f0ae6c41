"""Run a function on N gloo processes (CPU, fp32, one thread each) and collect what each returns."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from multiprocessing import forkserver, resource_tracker
from pathlib import Path

import torch
import torch.multiprocessing as mp

from ladder_train.data.workers import PRELOAD
from ladder_train.lifetime import PREEMPTION_SIGNALS
from ladder_train.parallel import free_port

# what the ranks of the tests import (the loader workers' modules among them: the server also forks those)
RANK_PRELOAD = [*PRELOAD, "ladder_train.train", "ladder_train.inference", "dist_utils"]


def _entry(rank: int, world_size: int, local_world_size: int, port: int, out_dir: str, env: dict, fn, args):
    os.environ.clear()  # the test's environment, not the fork server's (started by an earlier test)
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank % local_world_size),
        LOCAL_WORLD_SIZE=str(local_world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    result = fn(*args)
    Path(out_dir, f"{rank}.pkl").write_bytes(pickle.dumps(result))


def _start_fork_server() -> None:
    """The pytest process's one fork server (loaders in this process fork their workers from it too), started as
    the loader starts it (ladder_train/data/workers.py: preemption signals blocked, which the server and the
    resource tracker keep, each started on its own) but preloading what the ranks import as well."""
    if forkserver._forkserver._forkserver_pid is not None:  # started: its preload is what it is
        return
    mp.set_forkserver_preload(RANK_PRELOAD)
    for start in (resource_tracker.ensure_running, forkserver.ensure_running):
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)
        try:
            start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def run_ranks(fn, world_size: int, *args, local_world_size: int | None = None) -> list:
    """Spawn ``world_size`` processes running ``fn(*args)`` (a module-level function) with torchrun's
    environment variables set; returns the results in rank order."""
    # forked by multiprocessing's fork server, which imported torch and the package once for the whole pytest
    # process: a spawned rank spent ~5 s of CPU importing them again
    _start_fork_server()
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _entry,
            args=(world_size, local_world_size or world_size, free_port(), out_dir, dict(os.environ), fn, args),
            nprocs=world_size,
            join=True,
            start_method="forkserver",
        )
        return [pickle.loads(Path(out_dir, f"{rank}.pkl").read_bytes()) for rank in range(world_size)]


def save_training_checkpoint(model, root, step: int = 3):
    """``model`` saved as a training checkpoint (RUN_DIR/checkpoints/step-N) by the trainer's own Checkpointer;
    returns its path."""
    import dataclasses

    from ladder_train.checkpoint import Checkpointer
    from ladder_train.config import load_config

    cfg = load_config(None, ["checkpoint.async_save=false"])
    checkpointer = Checkpointer(cfg.checkpoint, root, rank=0, world_size=1)
    optimizer = torch.optim.AdamW(model.parameters())
    return checkpointer.save(step, model, optimizer, {"model_args": dataclasses.asdict(model.args)}, {})


def torchrun(nproc: int, *command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node NPROC --master-port FREE COMMAND`` (e.g. ``-m ladder_train.inference ...``), one
    thread per rank, its output captured as text."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    launcher += ["--master-port", str(free_port())]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([*launcher, *command], capture_output=True, text=True, env=env, timeout=timeout)
