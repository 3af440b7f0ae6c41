"""What the served model reads from the export's config (each layer's layout and reduces, the overlap switch), and
the check of an export against the engine's settings that runs before vLLM allocates anything."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..inference import check_tp_degree
from ..loading import resolve_source

# config.json / --hf-overrides key: true serves the ladder with each module's all-reduce held across the next module
# (TPCommunicator's functional collectives); false or absent, with vLLM's own all-reduce, waited at once (the same
# function). Off unless asked: the one measurement (docs/benchmarks.md, vLLM on the CPU at TP 2) has the held form
# at 2.1x standard's TPOT where vLLM's all-reduce gives 0.91x, and no card has measured it yet
OVERLAP_KEY = "ladder_overlap"


def layer_plan(config) -> list[tuple[str, tuple[bool, bool]]]:
    """(layout, (attention reduces, MLP reduces)) per layer, first to last: ``LadderLlamaConfig``'s own answer, or
    every layer standard for a plain ``LlamaConfig``."""
    if not hasattr(config, "layer_layouts"):
        return [("standard", (True, True))] * config.num_hidden_layers
    return list(zip(config.layer_layouts(), config.layer_reduces(), strict=True))


def overlap_enabled(config) -> bool:
    value = getattr(config, OVERLAP_KEY, False)
    if not isinstance(value, bool):
        raise InputError(f"{OVERLAP_KEY}={value!r}: must be true or false")
    return value


def check_served_export(path: str, tp: int, pp: int, config) -> None:
    """One line (InputError) naming what cannot be served: a config.json field ladder-train does not know, weights
    that disagree with it (names, shapes, dtypes: read from the headers only), a TP degree that does not split the
    model, a desync model at another TP degree than its own, pipeline parallelism. A folder that is not a local
    export (a Hub name vLLM downloads) is checked through its config alone."""
    overlap_enabled(config)
    if pp != 1:
        raise InputError(f"{path}: pipeline parallelism is not supported for ladder-train models (got {pp} stages)")
    residual = getattr(config, "residual", "standard")
    desync_tp = getattr(config, "desync_tp", None)
    if residual == "desync" and tp != desync_tp:
        raise InputError(
            f"{path}: a desync model is built for tensor-parallel degree {desync_tp} (its residual streams) and is "
            f"served at --tensor-parallel-size {desync_tp}, not {tp}"
        )
    if Path(path, "config.json").is_file():
        check_tp_degree(resolve_source(path).args, tp, source=str(path))
