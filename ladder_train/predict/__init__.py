"""The analytic predictor behind ``ladder-predict``: it never runs the model. ``shapes`` (model sizes),
``hardware`` (profiles, ``hardware.yaml``), ``perfmodel`` (roofline costs and the simulated timeline), ``grid``
(predictions over models, profiles, links and TP degrees), ``rows`` (the measured rows it reads: ladder-bench's and
gpu_check's), ``compare`` (against them), ``fit`` (the hand-set constants fitted on one card's rows, checked on
another's), ``calibrate`` (measure this machine's ``cpu`` profile), ``validation`` (calibrate, bench and compare in
one run) and ``paper_check`` (the paper's 70B table, in and out of sample).
``python -m ladder_train.predict`` is ``ladder-predict``."""

from .compare import bench_rows, compare_with_bench
from .fit import card_check
from .fit import markdown as card_check_markdown
from .hardware import load_profiles
from .perfmodel import simulate, step_ops
from .shapes import shape_from_fields

__all__ = [
    "bench_rows",
    "card_check",
    "card_check_markdown",
    "compare_with_bench",
    "load_profiles",
    "shape_from_fields",
    "simulate",
    "step_ops",
]
