"""The speed benchmark of tensor-parallel generation (``ladder-bench``): ``options`` says what to measure,
``runner`` measures, ``results`` derives and prints; the rows it writes are ``bench_schema.py``'s.
``torchrun --nproc-per-node N -m ladder_train.bench ...`` runs it on N ranks."""

from .results import latency_note, module_time_rows

__all__ = ["latency_note", "module_time_rows"]
