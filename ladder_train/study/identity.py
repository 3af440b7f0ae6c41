"""Whose run a study point's folder holds. A point's identity is what decides its result: the resolved config of the
recipe with the point's values, read and typed (``1e-3`` and ``0.001`` are one learning rate, ``00`` and ``0`` one
seed), less the keys that only name the run, say where it logs or how often it saves (``NOT_DECIDING``). The trainer
records the config a run was given as ``RUN_DIR/config.yaml``: a point folder whose recorded config has another
identity holds another study's run (another recipe run into the same folder, or the recipe edited since), which the
study must neither skip as finished, resume, nor collect as its own.

Two points of one grid with one identity (``lr=1e-3,0.001``) are refused, not merged: merging would drop a point
the command asked for and renumber the Slurm array's tasks; the line names both, so the value is given once. So is a
point about to start whose identity a run in another folder of the study holds already (a second command that spells
the value another way): it would train that run again under another name."""

from __future__ import annotations

from pathlib import Path

from ..config import Config, ConfigError, load_config
from ..errors import InputError
from ..files import is_plain_file
from .groups import flat_config

CONFIG_FILE = "config.yaml"  # the trainer writes it as a run starts, before any checkpoint or summary
# what a run leaves beside its config.yaml: a folder with any of them and no config.yaml cannot be told apart
RESULT_MARKS = ("summary.json", "metrics.jsonl", "checkpoints")
# keys that name the run, pace its logs and saves or limit its waits: the same experiment whatever they are
NOT_DECIDING = (
    "run.dir",
    "run.name",
    "train.log_every",
    "data.num_workers",
    "data.worker_timeout_s",
    "parallel.timeout_s",
    "checkpoint.every",
    "checkpoint.keep",
    "checkpoint.async_save",
)
NOT_DECIDING_SECTIONS = ("wandb.", "tensorboard.", "profile.")
_SHOWN = 3  # differing keys named in a refusal


def identity(cfg: Config) -> dict[str, object]:
    """``{"a.b": value}`` of everything in ``cfg`` that decides a run's result, the seed included."""
    flat = {**flat_config(cfg), "run.seed": cfg.run.seed}  # flat_config leaves out the run's own keys and wandb
    return {k: v for k, v in flat.items() if k not in NOT_DECIDING and not k.startswith(NOT_DECIDING_SECTIONS)}


def _key(flat: dict[str, object]) -> tuple:
    return tuple(sorted((key, repr(value)) for key, value in flat.items()))


def recorded_runs(study_dir: Path) -> dict[tuple, Path]:
    """The identity of each run recorded in the study's folders (their config.yaml) -> the first folder holding it;
    folders whose config cannot be read, and links, are left out."""
    found: dict[tuple, Path] = {}
    for folder in sorted(p for p in Path(study_dir).iterdir() if p.is_dir() and not p.is_symlink()):
        try:
            if is_plain_file(folder / CONFIG_FILE):
                found.setdefault(_key(identity(load_config(folder / CONFIG_FILE))), folder)
        except InputError:  # ConfigError too: not a run this study could be
            continue
    return found


def differences(there: dict[str, object], here: dict[str, object]) -> str:
    """The keys whose values differ, ``key: A there, B here``, the first few by name."""
    missing = object()
    keys = sorted(k for k in there.keys() | here.keys() if there.get(k, missing) != here.get(k, missing))
    shown = "; ".join(f"{k}: {there.get(k)!r} there, {here.get(k)!r} here" for k in keys[:_SHOWN])
    return shown + (f" and {len(keys) - _SHOWN} more keys" if len(keys) > _SHOWN else "")


def foreign_run(run_dir: Path, expected: dict[str, object]) -> str | None:
    """None when ``run_dir`` holds no run or a run of ``expected``'s identity; otherwise what it holds instead, as a
    phrase (``a run of another config (train.optimizer.lr: 0.003 there, 0.001 here)``)."""
    config = Path(run_dir) / CONFIG_FILE
    if not is_plain_file(config):  # a FIFO or a folder there: one line, nothing opened
        if any((Path(run_dir) / name).exists() for name in RESULT_MARKS):
            return f"a run without its {CONFIG_FILE}, so whose it is cannot be told"
        return None
    try:
        recorded = identity(load_config(config))
    except ConfigError as err:
        return f"a {CONFIG_FILE} that does not read as a config ({err})"
    changed = differences(recorded, expected)
    return f"a run of another config ({changed})" if changed else None


def refuse_foreign_runs(study_dir: Path, runs: list[tuple[int, Path, dict[str, object]]]) -> None:
    """InputError, one line, when any (index, run folder, identity) holds another config's run: it names the first
    and counts the others."""
    found = [(index, run_dir, why) for index, run_dir, expected in runs if (why := foreign_run(run_dir, expected))]
    if not found:
        _refuse_twins(study_dir, [run for run in runs if not (run[1] / CONFIG_FILE).exists()])
        return
    index, run_dir, why = found[0]
    others = f" ({len(found) - 1} more points alike)" if len(found) > 1 else ""
    raise InputError(
        f"study {study_dir}: {run_dir} holds {why}; this study would take it for its point {index}{others}: move it "
        "elsewhere, or give this study another run.dir"
    )


def _refuse_twins(study_dir: Path, new: list[tuple[int, Path, dict[str, object]]]) -> None:
    """A point about to start whose identity another folder of the study holds a run of."""
    recorded = recorded_runs(study_dir) if new and Path(study_dir).is_dir() else {}
    for index, run_dir, expected in new:
        twin = recorded.get(_key(expected))
        if twin is not None:
            raise InputError(
                f"study {study_dir}: point {index} ({run_dir.name}) is the config {twin} holds a run of, once the "
                "values are read (e.g. 1e-3 and 0.001 are one number): it would be trained again under another name; "
                f"write the value as {twin.name} does, or leave the point out"
            )


def refuse_duplicate_points(points: list, identities: list[dict[str, object]]) -> None:
    """Two points whose values read the same (``lr=1e-3,0.001``) would train one config twice under two names."""
    seen: dict[tuple, object] = {}
    for point, flat in zip(points, identities, strict=True):
        first = seen.setdefault(_key(flat), point)
        if first is not point:
            raise InputError(
                f"study: points {first.index} ({first.name}) and {point.index} ({point.name}) are one config once "
                "their values are read (e.g. 1e-3 and 0.001 are one number): give each value once"
            )
