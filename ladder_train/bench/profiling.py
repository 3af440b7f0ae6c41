"""``ladder-bench --profile DIR``: after the timed runs of a batch size, one more generation of every layout and
communicator under torch.profiler, written per rank as a chrome trace ``DIR/rank{r}_batch{b}.pt.trace.json``
(open in https://ui.perfetto.dev or chrome://tracing). Each generation is a region named ``LAYOUT comm=real|none
batch=B``; inside a TP decode step every all-reduce (``_c10d_functional::all_reduce`` and its ``wait_tensor``;
gloo's own ``gloo:all_reduce`` on its thread, NCCL kernels on their stream on a GPU) lies beside the module that
computes while it is in flight. The traced run is not timed, so the profiler's overhead stays out of the results.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from ..files import refuse_link


def trace_generations(folder: str, entries: list, batch: int, device, generate: Callable) -> Path:
    """Runs ``generate(gen)`` once for every (model, communicator) of ``entries`` (runner.load_entries) under
    the profiler; returns the trace file of this rank."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _source, layout, model, gen, comms in entries:
            for comm_name, comm in comms.items():
                if comm is not None:
                    model.set_communicator(comm)
                with record_function(f"{layout} comm={comm_name} batch={batch}"):
                    generate(gen)
    path = Path(folder) / f"rank{rank}_batch{batch}.pt.trace.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(refuse_link(path)))
    return path
