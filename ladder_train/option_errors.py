"""A bad option value, named as its reader knows the option: the library by the option's field name (``gen_len``),
a console script by its flag (``--gen-len``), from the same error."""

from __future__ import annotations

from .errors import InputError
from .model import PAPER_LAYOUTS


class OptionError(InputError):
    """An InputError whose ``template`` names each option as ``{option}``; every other ``{name}`` is one of
    ``values``. ``str()`` names the options by field; ``naming(names)`` by the names given (a console script's
    flags), the field where ``names`` has none."""

    def __init__(self, template: str, **values):
        self.template, self.values = template, values
        super().__init__(self.naming({}))

    def naming(self, names: dict[str, str]) -> str:
        return self.template.format_map(_Names(self.values, names))


class _Names(dict):
    """The template's values, and for any other name the option's name in ``names`` (else itself)."""

    def __init__(self, values: dict, names: dict[str, str]):
        super().__init__(values)
        self.names = names

    def __missing__(self, option: str) -> str:
        return self.names.get(option, option)


# a desync layout by the name that says its pattern: desync-K, every K-th module all-reduces (2: each MLP, the
# authors' "2x"; 4: every other MLP, "4x"), built for the TP degree it is benchmarked or predicted at
DESYNC_PREFIX = "desync-"


def desync_every(layout: str) -> int | None:
    """K of a layout named ``desync-K`` (K >= 1), else None."""
    k = layout.removeprefix(DESYNC_PREFIX) if layout.startswith(DESYNC_PREFIX) else ""
    return int(k) if k.isdigit() and k == str(int(k)) and int(k) >= 1 else None


def layout_fields(layout: str, tp: int) -> dict:
    """The ModelArgs fields a layout name sets: ``residual``, and for ``desync-K`` the TP degree the model is built
    for (``tp``, the degree it runs at) and K (``desync_reduce_every``; no explicit pattern)."""
    every = desync_every(layout)
    if every is None:
        return {"residual": layout}
    return {"residual": "desync", "desync_tp": tp, "desync_reduce_every": every, "desync_pattern": None}


def layout_name(args) -> str:
    """The name of a model's layout in ladder-bench's rows: its residual, ``desync-K`` for a desync model that
    all-reduces every K-th module, ``desync`` for one with an explicit pattern (the row's model_args say which)."""
    if args.residual != "desync":
        return args.residual
    return "desync" if args.desync_pattern is not None else f"{DESYNC_PREFIX}{args.desync_reduce_every}"


def check_layouts(layouts) -> None:
    """The ``layouts`` option of ladder-bench and ladder-predict: one or more residual layouts, a desync layout
    named by its pattern (``desync-K``)."""
    if not layouts or any(v not in PAPER_LAYOUTS and desync_every(v) is None for v in layouts):
        raise OptionError(
            "{layouts} {given!r}: each must be one of {known} or desync-K (every K-th module all-reduces, K >= 1)",
            given=",".join(layouts),
            known=", ".join(PAPER_LAYOUTS),
        )


def check_desync_tp(layouts, tp: int) -> None:
    """A ``desync-K`` layout is built for the TP degree it runs at: at TP 1 it has no all-reduce to skip."""
    desync = [v for v in layouts if desync_every(v) is not None]
    if desync and tp < 2:
        raise OptionError(
            "{layouts} {name}: a desync layout is built for the tensor-parallel degree it runs at and needs "
            "{tp} >= 2 (at TP 1 there is no all-reduce to skip)",
            name=desync[0],
        )
