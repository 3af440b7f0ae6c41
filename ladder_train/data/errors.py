"""How the data package reports: DataError (one line naming the file or key, before any training) and notes
about the data setup printed once per job."""

from __future__ import annotations

import logging
import os

from ..errors import InputError


class DataError(InputError):
    """A data source or tokenizer that cannot be used; the message is one line naming the file or key."""


_noted: set[str] = set()


def note(logger: logging.Logger, message: str, *args) -> None:
    """A warning about the data setup (which corpus, which tokenizer) once per job, not once per rank (128
    lines at 16 x 8): global rank 0 only (RANK unset = one process), and each distinct line once per process
    (the validation loader opens its source again at every validation)."""
    if os.environ.get("RANK", "0") != "0":
        return
    text = message % args if args else message
    if text not in _noted:
        _noted.add(text)
        logger.warning(text)
