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


def check_layouts(layouts) -> None:
    """The ``layouts`` option of ladder-bench and ladder-predict: one or more residual layouts."""
    if not layouts or any(v not in PAPER_LAYOUTS for v in layouts):
        raise OptionError(
            "{layouts} {given!r}: each must be one of {known}",
            given=",".join(layouts),
            known=", ".join(PAPER_LAYOUTS),
        )
