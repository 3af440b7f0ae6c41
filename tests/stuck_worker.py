"""A loader worker stuck before it starts, as one deadlocked at its fork would be: no batch, no signal handler.
``init`` stands in for ``ladder_train.data.loader.init_worker`` in the worker-timeout tests; it lives in a module of
its own because the worker gets it by pickle (workers.py) and imports it from here."""

from __future__ import annotations

import time


def init(worker_id: int, trainer_pid: int) -> None:
    time.sleep(600)
