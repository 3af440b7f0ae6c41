"""docs/benchmarks.md's tables of ladder-predict's predictions, made from the files committed under ``docs/results/``
(each table's files: ``manifest.toml``). Every figure in them is PREDICTED, none measured.

- ``predict-paper70``: the table ``ladder-predict paper --out`` stores (header, rows, note);
- ``predict-llama70b-tp8``: the rows ``ladder-predict --out`` writes for one model, profile and TP degree over its
  links and batch sizes (prefill, decode per token, comm share, the speedups over standard);
- ``predict-sensitivity``: the rows ``benchmarks/predictor_sensitivity.py`` writes, the error against the paper's 70B
  table of the h100 profile with one hand-set constant changed at a time;
- ``predict-card-fit``: the hand-set constants fitted on one card's committed GPU rows and checked on the other's
  (``ladder-predict fit``, made here from the rows under ``docs/results/gpu/``).
"""

from __future__ import annotations

from pathlib import Path

from ladder_train.predict import card_check, card_check_markdown, load_profiles
from ladder_train.report.tables import markdown_table

from .manifest import read_json

LINK_NAMES = {"nvlink": "NVLink", "pcie": "P2P disabled"}  # the profile's pcie link is NCCL_P2P_DISABLE=1
# the cells of the paper's table the sensitivity table shows: (column, the rows' name of the cell)
SHOWN_CELLS = (
    ("standard tok/s NVLink, batch 1", "standard tokens/s, P2P enabled, batch 1"),
    ("standard tok/s NVLink, batch 64", "standard tokens/s, P2P enabled, batch 64"),
    ("NVLink ladder, batch 1", "ladder speedup, P2P enabled, batch 1"),
    ("P2P-off ladder, batch 1", "ladder speedup, P2P disabled, batch 1"),
    ("P2P-off ladder, batch 64", "ladder speedup, P2P disabled, batch 64"),
)


def _one(rows: list[dict], key: str, path: str):
    values = {row[key] for row in rows}
    if len(values) != 1:
        raise ValueError(f"{path}: the rows give more than one {key} ({', '.join(map(str, sorted(values)))})")
    return values.pop()


def prediction_grid(rows: list[dict], path: str) -> str:
    """``ladder-predict``'s rows of one model, profile and TP degree: per link and batch standard's prefill and
    decode step, the ladder's and the no-communication decode step, the comm share of the decode step, the ladder's
    decode-step speedup and the parallel layout's and the ceiling's end-to-end tokens/s speedups."""
    by = {}
    for row in rows:
        key = (row["link"], row["batch"], row["layout"])
        if key in by:  # --out appends: a second run into the same file
            raise ValueError(f"{path}: two rows for link {key[0]}, batch {key[1]}, {key[2]} (remove the file first)")
        by[key] = row
    body = []
    for link, batch in dict.fromkeys((row["link"], row["batch"]) for row in rows):
        std, par, lad, none = (by[link, batch, layout] for layout in ("standard", "parallel", "ladder", "none"))
        body.append(
            [
                LINK_NAMES.get(link, link),
                str(batch),
                f"{std['prefill_ms']:.0f}",
                *(f"{r['decode_ms_per_token']:.2f}" for r in (std, lad, none)),
                f"{100 * std['comm_share']:.1f} %",
                f"{lad['decode_speedup_vs_standard']:.3f}x",
                f"{par['speedup_vs_standard']:.3f}x",
                f"{none['speedup_vs_standard']:.3f}x",
            ]
        )
    header = ["link", "batch", "standard prefill ms", "standard decode ms/tok", "ladder decode ms/tok"]
    header += ["no-comm decode ms/tok", "comm share", "ladder decode-step speedup", "parallel tokens/s speedup"]
    header += ["ceiling tokens/s speedup"]
    model, gpu, tp = (_one(rows, key, path) for key in ("model", "gpu", "tp"))
    prompt, gen = _one(rows, "prompt_len", path), _one(rows, "gen_len", path)
    return (
        markdown_table(header, body)
        + f"\n\nPredicted (every row has `prediction: true`) for {model} on the {gpu} profile, TP {tp}, prompt "
        f"{prompt}, {gen} new tokens; the {len(rows)} rows are in `{path}`.\n"
    )


def _percent(value: float, sign: bool) -> str:
    return f"{100 * value:+.1f}" if sign else f"{100 * value:.1f}"


def _joined(values: list[float], sign: bool, each: bool) -> str:
    """``8.9 % / 4.9 %`` (``each``) or ``-11.0 / +2.5 %``: the figures of one assumption's alternatives."""
    if each:
        return " / ".join(f"{_percent(v, sign)} %" for v in values)
    return " / ".join(_percent(v, sign) for v in values) + " %"


def sensitivity(rows: list[dict], path: str) -> str:
    """benchmarks/predictor_sensitivity.py's rows: per changed assumption (its alternatives side by side, the shipped
    value in brackets) the mean absolute error over the 12 cells and the errors of the cells ``SHOWN_CELLS`` names."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["assumption"], []).append(row)
    body = []
    for assumption, group in groups.items():
        if assumption == "none":
            label = "none (the shipped profile)"
        else:
            values = " / ".join(f"{row['value']:g}" for row in group)
            label = f"{assumption} {values} ({_one(group, 'shipped', path):g})"
        means = _joined([row["mean_abs_error_12"] for row in group], sign=False, each=True)
        cells = [_joined([row["errors"][cell] for row in group], sign=True, each=False) for _, cell in SHOWN_CELLS]
        body.append([label, means, *cells])
    header = ["changed assumption: alternatives (shipped)", "mean abs error, 12 cells"]
    header += [column for column, _ in SHOWN_CELLS]
    several = [
        f"{name} sets {' and '.join(f'`{key}`' for key in group[0]['keys'])}"
        for name, group in groups.items()
        if len(group[0]["keys"]) > 1
    ]
    commands = "; ".join(f"`{command}`" for command in dict.fromkeys(row["command"] for row in rows))
    return (
        markdown_table(header, body)
        + "\n\nPredicted. Error = predicted / paper - 1 in a cell of the paper's 70B table; the mean is over the 12 "
        "cells other than standard's P2P-disabled tokens/s. Each row but the first: a copy of the shipped "
        f"{_one(rows, 'profile', path)} profile with that one value changed"
        + (f" ({'; '.join(several)})" if several else "")
        + f", read as `--profile` reads it; not adopted. The rows are in `{path}`, written by {commands}.\n"
    )


def json_table(root: Path, table: str) -> str:
    """A table stored as ``{"header": [...], "rows": [[...]], "note": "..."}`` by the command that made it."""
    data = read_json(root / table)
    note = f"\n\n{data['note']}\n" if data.get("note") else "\n"
    return markdown_table(data["header"], data["rows"]) + note


def card_fit(root: Path, fit_on: list[str], check_on: list[str]) -> str:
    """``ladder-predict fit``'s table of two cards: their rows on the shipped profiles, then each fit in sample and
    out of sample on the other card."""
    files_a, files_b = ([root / name for name in files] for files in (fit_on, check_on))
    return card_check_markdown(card_check(files_a, files_b, load_profiles())) + "\n"
