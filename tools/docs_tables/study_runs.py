"""The layout study's runs as its tables read them: each run folder read once per contents of its files, the runs of a
study folder, the seeds folder's runs by layout, seed and depth, and the validation-loss comparisons with the
baseline that several tables quote."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from ladder_train.report.runs import read_run
from ladder_train.study import compare_groups

# read runs by the contents of their files: the tables read the same folders several times in one remake and each
# read resolves a config through omegaconf (~0.1 s); a copy of the docs (the tests') reads its runs from this cache,
# and a changed file reads afresh
_READ: dict[tuple, object] = {}  # ((file, sha1 of its bytes), ...) -> Run


def _read_run_once(path: Path):
    files = sorted(f for f in path.rglob("*") if f.is_file())
    key = tuple((f.relative_to(path).as_posix(), hashlib.sha1(f.read_bytes()).hexdigest()) for f in files)
    if key not in _READ:
        _READ[key] = read_run(path)
    run = _READ[key]
    return run if run.path == path else dataclasses.replace(run, path=path)


def study_runs(root: Path, folder: str, required: bool = True) -> list:
    """The finished runs collected under a study folder, in name order (none: an error when ``required``)."""
    runs = [_read_run_once(p.parent) for p in sorted((root / folder).glob("*/metrics.jsonl"))]
    if required and not runs:
        raise FileNotFoundError(2, "no finished run", str(root / folder))
    return runs


def seed_runs(root: Path, seeds: str) -> dict[tuple, object]:
    """The seeds folder's runs (each layout at its chosen rate) by residual, seed and depth (the controls')."""
    return {(r.residual, r.seed, r.config.model.n_layers): r for r in study_runs(root, seeds)}


def loss_differences(groups, baseline) -> list:
    """The seeds table's validation-loss comparisons with the baseline."""
    return [row for row in compare_groups(groups, baseline) if row.metric.name.startswith("validation loss")]


def ladder_difference(loss: list):
    """The ladder − standard validation-loss pairs (the study's one comparison with a signal)."""
    return next(row.difference for row in loss if row.group.label.startswith("ladder"))


def interval(difference) -> str:
    return f"[{difference.low:+.4f}, {difference.high:+.4f}]"
