"""What one ladder-bench invocation measures (``BenchOptions``; ``cli/bench.py`` builds it from the flags), and
the check of all of it before any process starts (``measurements``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import InputError
from ..loading import resolve_source
from ..model import PAPER_LAYOUTS
from ..model.shape_checks import check_model_fields
from ..model.tp_sharding import check_tp_degree
from ..option_errors import OptionError, check_desync_tp, check_layouts, layout_fields, layout_name

COMPILED_WARMUP = 2  # cudagraph trees: a warm-up call, then the recording; the timed runs replay only


@dataclass(frozen=True)
class BenchOptions:
    """``models``: preset names, export folders or training checkpoints; ``layouts``: for presets (a saved model
    has its own): standard, parallel, ladder, or ``desync-K`` (every K-th module all-reduces, built for ``tp``);
    ``overrides``: ModelArgs fields of a preset (``desync_layers``: desync layouts only); ``tp``: the TP degree
    (None: 1, or torchrun's world size); ``link_latency_ms`` / ``link_bandwidth_gbs``: an emulated serialised link
    (0 / None: the real one); ``runs``: timed runs per case (None: 10 on a GPU, 3 on the CPU); ``compile``: auto (on
    with CUDA), on or off; ``gemv_tuning``: the compiled decode step's matrix-vector products as tuned Triton
    reductions on a GPU (``generate.inductor_options``); ``ceiling``: also measure without communication; ``out``: JSON lines file appended to;
    ``profile``: a folder to trace one more generation of each case into."""

    models: tuple[str, ...]
    layouts: tuple[str, ...] = PAPER_LAYOUTS
    batch_sizes: tuple[int, ...] = (1, 4, 16, 64)
    overrides: dict = field(default_factory=dict)
    prompt_len: int = 1024
    gen_len: int = 512
    tp: int | None = None
    link_latency_ms: float = 0.0
    link_bandwidth_gbs: float | None = None
    warmup: int = 1
    runs: int | None = None
    compile: str = "auto"
    compile_backend: str = "inductor"
    gemv_tuning: bool = True
    ceiling: bool = True
    seed: int = 0
    out: str | None = None
    profile: str | None = None

    @property
    def emulated_link(self) -> bool:
        return bool(self.link_latency_ms or self.link_bandwidth_gbs)


def is_saved_model(source: str) -> bool:
    return os.path.isdir(source)


# the desync fields a desync-K layout's name sets; --set gives only desync_layers (a hybrid)
NAMED_DESYNC_FIELDS = ("desync_tp", "desync_reduce_every", "desync_pattern")


def layout_overrides(overrides: dict, layout: str, tp: int) -> dict:
    """The ModelArgs fields of a preset measured as ``layout`` at TP ``tp``: ``overrides`` (``--set``), the desync
    fields only for a desync layout, then the layout's own (``option_errors.layout_fields``)."""
    fields = layout_fields(layout, tp)
    kept = {k: v for k, v in overrides.items() if fields["residual"] == "desync" or not k.startswith("desync_")}
    return {**kept, **fields}


def measurements(options: BenchOptions, tp: int) -> list[tuple[str, str]]:
    """The (model source, layout) pairs to measure; validates everything before any process starts."""
    _check_settings(options, tp)
    pairs = []
    for source in options.models:
        saved = is_saved_model(source)
        for layout in options.layouts[:1] if saved else options.layouts:  # a saved model has its own layout
            args = _checked_args(source, {} if saved else layout_overrides(options.overrides, layout, tp), tp)
            pairs.append((source, layout_name(args) if saved else layout))
        if options.prompt_len + options.gen_len > args.max_seq_len:
            raise OptionError(
                "{source}: {prompt_len} + {gen_len} exceed max_seq_len={max_seq_len}",
                source=source,
                max_seq_len=args.max_seq_len,
            )
    return pairs


def _checked_args(source: str, overrides: dict, tp: int):
    """The ModelArgs of ``source`` (a preset with ``overrides``), checked for TP ``tp``: a damaged checkpoint (checked
    against its manifest by ``resolve_source`` before anything else is read) or a degree it cannot run fails here in
    one line, before any rank starts."""
    try:
        found = resolve_source(source, **overrides)
        args, kind = found.args, found.kind
        if kind == "preset":  # --set's values (desync fields too), checked as a folder's are (model/shape_checks.py)
            args = check_model_fields(dataclasses.asdict(args), source)
        check_tp_degree(args, tp, source)
    except ValueError as err:  # e.g. an unreadable config.json; a damaged checkpoint stays a RunFailed
        raise InputError(str(err)) from None
    return args


def _check_settings(options: BenchOptions, tp: int) -> None:
    """Every option but the models, each refused in one line naming it."""
    layouts = options.layouts
    check_layouts(layouts)
    check_desync_tp(layouts, tp)
    named = [k for k in NAMED_DESYNC_FIELDS if k in options.overrides]
    if named:
        raise OptionError(
            "{overrides} {key}: a desync layout's name sets it ({layouts} desync-K: every K-th module all-reduces, "
            "built for {tp})",
            key=named[0],
        )
    runs_ok = options.runs is None or options.runs >= 1
    if options.gen_len < 2 or options.prompt_len < 1 or not runs_ok or options.warmup < 0:
        raise OptionError("need {gen_len} >= 2, {prompt_len} >= 1, {runs} >= 1, {warmup} >= 0")
    if options.link_latency_ms < 0 or (options.link_bandwidth_gbs is not None and options.link_bandwidth_gbs <= 0):
        raise OptionError("{link_latency_ms} must be >= 0 and {link_bandwidth_gbs} > 0")
    if options.compile == "on" and options.emulated_link:
        raise OptionError("the emulated link sleeps on the host and needs {compile} off")
    if options.emulated_link and torch.cuda.is_available():  # a host sleep does not delay the GPU's stream
        raise OptionError(
            "{link_latency_ms} / {link_bandwidth_gbs} emulate a link on the CPU only (host sleeps do not delay a "
            "GPU's stream): on a GPU the benchmark measures the real interconnect"
        )
    out = Path(options.out) if options.out else None
    if out and (out.is_dir() or any(p.exists() and not p.is_dir() for p in out.parents)):
        raise OptionError("{out} {path}: not a file path whose folders can be made", path=options.out)
    if options.profile and Path(options.profile).exists() and not Path(options.profile).is_dir():
        raise OptionError("{profile} {path}: not a folder", path=options.profile)
    if options.compile == "on" and options.warmup < COMPILED_WARMUP:
        raise OptionError(
            "{compile} on needs {warmup} >= {needed} (the first run compiles, the second records the CUDA graphs)",
            needed=COMPILED_WARMUP,
        )
