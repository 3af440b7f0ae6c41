"""How much each hand-set constant of the shipped h100 profile moves ladder-predict's error against the paper's 70B
table, one constant at a time (docs/benchmarks.md, "What drives the error"). Every figure is PREDICTED; no GPU.

    python -m benchmarks.predictor_sensitivity --out docs/results/predict/sensitivity.jsonl

For each changed assumption (``CHANGES``): a copy of the shipped h100 profile (ladder_train/predict/hardware.yaml)
with that one value changed (``interference`` on both the NVLink and the P2P-disabled link, as ``ladder-predict
paper`` fits it), written to a YAML file and read as ``ladder-predict --profile FILE`` reads it (it replaces the
shipped h100); then the 16 cells of the paper's table predicted by that profile as it is, as ``ladder-predict paper``
predicts them (``paper_check.predict_cells``), each cell's error (predicted / paper - 1) and the mean absolute error
over the 12 cells other than standard's P2P-disabled tokens/s (``TWELVE``). The first row is the shipped profile
unchanged. ``--out`` is overwritten with one JSON line per profile; ``python -m tools.docs_tables --write`` then
remakes the doc's table from it (``tools/docs_tables/predict_tables.py``). Takes ~10 s.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
import tempfile
from importlib import resources
from pathlib import Path

import yaml

from ladder_train.files import write_text
from ladder_train.predict import paper_check
from ladder_train.predict.hardware import SHIPPED, load_profiles

OUT = Path("docs/results/predict/sensitivity.jsonl")
PROFILE = "h100"
# (what the table calls it, the profile's keys it sets, the values tried); the shipped value is read from the file
CHANGES = (
    ("`mem_eff`", ("mem_eff",), (0.7, 0.9)),
    ("`compute_eff`", ("compute_eff",), (0.6, 0.8)),
    ("`kernel_us`", ("kernel_us",), (1.0, 3.0)),
    ("`interference`", ("links.nvlink.interference", "links.pcie.interference"), (0.0, 0.25)),
    ("NVLink `alpha_us`", ("links.nvlink.alpha_us",), (10.0, 30.0)),
    ("P2P-off `alpha_us`", ("links.pcie.alpha_us",), (25.0,)),
    ("P2P-off `busbw_gbs`", ("links.pcie.busbw_gbs",), (35.0,)),
)
# the cells the mean is over: all but standard's tokens/s with P2P disabled, which no constant on the fit's grids
# repairs (docs/benchmarks.md)
EXCLUDED = ("standard tokens/s", "P2P disabled")


def cell_name(cell: paper_check.Cell) -> str:
    """How a row names a cell: ``QUANTITY, SETTING, batch N`` (as ``paper_check.summary`` names the worst)."""
    return f"{cell.quantity}, {cell.setting}, batch {cell.batch}"


def twelve(cells: list[paper_check.Cell]) -> list[int]:
    """The indices of the cells the mean is over."""
    return [i for i, c in enumerate(cells) if (c.quantity, c.setting) != EXCLUDED]


def shipped_entry() -> dict:
    """The shipped h100 profile as hardware.yaml writes it."""
    data = yaml.safe_load(resources.files("ladder_train.predict").joinpath(SHIPPED).read_text())
    return data[PROFILE]


def _slot(entry: dict, key: str) -> tuple[dict, str]:
    *path, last = key.split(".")
    for part in path:
        entry = entry[part]
    return entry, last


def changed(entry: dict, keys: tuple[str, ...], value: float) -> dict:
    """A copy of ``entry`` with every key of ``keys`` (dotted: ``links.pcie.alpha_us``) set to ``value``."""
    entry = copy.deepcopy(entry)
    for key in keys:
        parent, last = _slot(entry, key)
        parent[last] = value
    return entry


def shipped_value(entry: dict, keys: tuple[str, ...]) -> float:
    values = set()
    for key in keys:
        parent, last = _slot(entry, key)
        values.add(parent[last])
    if len(values) != 1:
        raise ValueError(f"the shipped {PROFILE} profile gives {keys} different values: {sorted(values)}")
    return values.pop()


def errors_of(entry: dict, folder: Path, name: str) -> dict[str, float]:
    """Each cell's error with ``entry`` as the h100 profile, loaded from a file as ``--profile`` loads it."""
    path = folder / f"{name}.yaml"
    write_text(path, yaml.safe_dump({PROFILE: entry}, sort_keys=False))
    device = load_profiles(path)[PROFILE]
    cells = paper_check.paper_cells()
    errs = paper_check.errors(cells, paper_check.predict_cells(device, cells))
    return {cell_name(c): e for c, e in zip(cells, errs, strict=True)}


def row(assumption: str, keys: tuple[str, ...], shipped: float | None, value: float | None, errs: dict) -> dict:
    cells = paper_check.paper_cells()
    mean = paper_check.mean_abs([errs[cell_name(cells[i])] for i in twelve(cells)])
    return {
        "assumption": assumption,
        "keys": list(keys),
        "shipped": shipped,
        "value": value,
        "mean_abs_error_12": mean,
        "errors": errs,
        "profile": PROFILE,
        "prediction": True,
    }


def sensitivity_rows() -> list[dict]:
    """The shipped profile's row, then one row per changed value, in ``CHANGES``' order."""
    entry = shipped_entry()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = [row("none", (), None, None, errors_of(entry, folder, "shipped"))]
        for assumption, keys, values in CHANGES:
            shipped = shipped_value(entry, keys)
            for i, value in enumerate(values):
                errs = errors_of(changed(entry, keys, value), folder, f"{keys[0]}-{i}")
                rows.append(row(assumption, keys, shipped, value, errs))
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.predictor_sensitivity", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help=f"JSON lines to write (overwritten; default {OUT})")
    opts = p.parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.predictor_sensitivity", *argv])
    rows = [{**r, "command": command} for r in sensitivity_rows()]
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(opts.out, "".join(json.dumps(r) + "\n" for r in rows))
    for r in rows:
        value = "" if r["value"] is None else f" {r['value']:g} (shipped {r['shipped']:g})"
        print(f"{r['assumption']}{value}: PREDICTED mean abs error {100 * r['mean_abs_error_12']:.1f} % (12 cells)")
    print(f"written to {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
