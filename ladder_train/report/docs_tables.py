"""The tables of the docs that are made from data committed under ``docs/results/``.

In a doc, such a table sits between ``<!-- table NAME: COMMAND -->`` and ``<!-- end table -->``;
``python -m ladder_train.report.docs_tables --write`` remakes every one from its data, ``--check`` (what
tests/test_docs.py runs) fails where a doc's table differs from what its data give. NAME picks the function in
``TABLES`` below; the benchmarks' tables are in ``doc_bench_tables.py`` (benchmarks/*.py ``--out``) and
``doc_tp_tables.py`` (ladder-bench ``--out``, several invocations per file: medians and ranges).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import EXIT_BAD_INPUT, InputError
from ..option_errors import desync_every, layout_name
from ..paper import PRETRAINING
from ..study import (
    compare_groups,
    default_baseline,
    final_val_loss,
    group_runs,
    paired_difference,
    pairs_for_power,
    power,
    sweeps,
)
from . import doc_bench_tables, doc_eval_tables, doc_gpu_tables, doc_predict_tables, doc_tp_tables
from .runs import read_run, train_tokens_per_s
from .study import comparison_section
from .tables import markdown_table

DOCS = ("README.md", "docs/results.md", "docs/benchmarks.md", "docs/guide.md", "docs/design.md")
COMMAND = "python -m ladder_train.report.docs_tables --write"
_BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+): [^\n]*-->\n)(?P<body>.*?)(<!-- end table -->)", re.S)
STUDY_LR = Path("docs/results/study_small/lr")
STUDY_LR_DESYNC = Path("docs/results/study_small/lr_desync")  # desync-2 (t = 2), issue 43's arm
STUDY_SEEDS = Path("docs/results/study_small/seeds")
STUDY_HORIZON = Path("docs/results/study_small/horizon")
STUDY_LADDER_4E3 = Path("docs/results/study_small/ladder_4e-3")  # the ladder's seeds >= 1 at 4e-3 (seed 0: horizon)
STUDY_UNIGRAM = Path("docs/results/study_small/unigram.json")
# 3 seeds x (standard, parallel, ladder, the 6- and 4-layer standard controls), as docs/results.md plans
STUDY_SEED_RUNS = 15
LAYOUTS = ("standard", "parallel", "ladder")


def _study_runs(root: Path, folder: Path, required: bool = True) -> list:
    """The finished runs collected under a study folder, in name order (none: an error when ``required``)."""
    runs = [read_run(p.parent) for p in sorted((root / folder).glob("*/metrics.jsonl"))]
    if required and not runs:
        raise FileNotFoundError(2, "no finished run", str(root / folder))
    return runs


def _seed_runs(root: Path) -> dict[tuple, object]:
    """The seeds table's runs (each layout at its chosen rate) by residual, seed and depth (the controls')."""
    return {(r.residual, r.seed, r.config.model.n_layers): r for r in _study_runs(root, STUDY_SEEDS)}


def study_lr_sweep(root: Path) -> str:
    """The layout study's learning-rate sweep: validation loss at the sweep's horizon per layout and rate, a
    layout's best rate in bold once worse rates bracket it; a layout or rate without a finished run says so."""
    sweep_runs, desync = _study_runs(root, STUDY_LR), _study_runs(root, STUDY_LR_DESYNC, required=False)
    by_layout = {layout_name(s.config.model): s for s in sweeps(group_runs(sweep_runs + desync), min_rates=1)}
    rates = sorted({lr for sweep in by_layout.values() for lr in sweep.losses})
    desync_layouts = sorted((name for name in by_layout if desync_every(name)), key=desync_every)
    rows = []
    for layout in (*LAYOUTS, *desync_layouts):
        sweep = by_layout.get(layout)
        best = sweep.choice.best if sweep is not None and sweep.bracketed else None
        cells = []
        for lr in rates:
            if sweep is None or lr not in sweep.losses:
                cells.append("not yet")
            else:
                value = f"{sweep.losses[lr]:.4f}"
                cells.append(f"**{value}**" if lr == best else value)
        name = f"{layout} (t = {sweep.config.model.desync_tp})" if layout in desync_layouts else layout
        rows.append([name, *cells])
    horizon = {sweep.horizon_step for sweep in by_layout.values()}
    also = f" and the {len(desync)} in `{STUDY_LR_DESYNC}`" if desync else ""
    return (
        markdown_table(["layout \\ peak lr", *(f"{lr:g}" for lr in rates)], rows)
        + f"\n\nValidation loss in nats/byte at step {', '.join(map(str, sorted(horizon)))}, one seed each; "
        f"from the {len(sweep_runs)} runs in `{STUDY_LR}`{also}. Bold: the layout's best rate, where a worse rate was "
        "tried on each side of it.\n"
    )


def study_seeds(root: Path) -> str:
    """The layout study's seeds: per metric and group mean ± sd and the paired difference to standard with its 95 %
    interval, read against the study's resolution of 0.01 nats per byte (``report.study.comparison_section``)."""
    runs = _study_runs(root, STUDY_SEEDS)
    groups = group_runs(runs)
    baseline = default_baseline(groups)
    speeds = sorted(train_tokens_per_s(run) for run in runs)
    lines = comparison_section(groups, baseline, resolution=0.01)
    seeds = "; ".join(f"{group.label}: {', '.join(map(str, sorted(group.seeds)))}" for group in groups)
    return (
        "\n".join(lines)
        + f"\n\n{len(runs)} of the study's {STUDY_SEED_RUNS} seed runs finished (seeds per group: {seeds}); "
        f"from `{STUDY_SEEDS}`. A difference needs two paired seeds for an interval. Training speed (each run's "
        f"median logged tokens/s; the median run, then the slowest–fastest): {statistics.median(speeds):,.0f} "
        f"({speeds[0]:,.0f}–{speeds[-1]:,.0f}); the 2-core VM was shared with other work during part of some runs.\n"
    )


def study_paper_gap(root: Path) -> str:
    """The paper's ladder − standard Wikitext gap in the study's unit, nats per byte (through the bytes per word of
    the study's own ``wikitext2_local`` evaluations), beside what the study's pairs can detect at their measured sd."""
    groups = group_runs(_study_runs(root, STUDY_SEEDS))
    baseline = default_baseline(groups)
    wikitext = baseline.runs[0].eval_summary["wikitext2_local"]
    # ln(word perplexity) / ln(byte perplexity) = (loss / words) / (loss / bytes) = bytes per word of the text
    bytes_per_word = math.log(wikitext["word_perplexity"]) / math.log(wikitext["byte_perplexity"])
    loss = [row for row in compare_groups(groups, baseline) if row.metric.name.startswith("validation loss")]
    tested = [row.difference for row in loss if row.difference is not None]
    ladder = next(row.difference for row in loss if row.group.label.startswith("ladder"))
    pooled = math.sqrt(statistics.fmean(d.sd**2 for d in tested))
    n = ladder.n
    paper = {(row.size, row.residual): row.wikitext_ppl for row in PRETRAINING}
    gaps = [
        (f"paper {size}: ladder − standard", math.log(paper[size, "ladder"] / paper[size, "standard"]))
        for size in ("1.2B", "3.5B")
    ]
    rows = []
    for name, per_word in gaps:
        rows.append(_gap_row(name, f"{per_word:+.4f}", per_word / bytes_per_word, n, ladder.sd, pooled))
    for effect in (0.01, 0.02, 0.05):
        rows.append(_gap_row(f"a difference of {effect:g} nats/byte", "—", effect, n, ladder.sd, pooled))
    header = [
        "difference",
        "nats per WikiText word",
        "nats per byte",
        f"power of {n} pairs (sd {ladder.sd:.4f})",
        f"pairs for 80 % (sd {ladder.sd:.4f})",
        f"pairs for 80 % (sd {pooled:.4f})",
    ]
    return (
        markdown_table(header, rows)
        + f"\n\nBytes per word {bytes_per_word:.2f}: ln(word perplexity) / ln(byte perplexity) of `wikitext2_local` in "
        f"the baseline's seed-{baseline.runs[0].seed} run. The paper's Wikitext perplexities are its Table 3 "
        f"(`ladder_train/paper.py`). Pair sd: the ladder − standard validation-loss pairs' ({ladder.sd:.4f}) and the "
        f"pooled sd of the {len(tested)} comparisons with the baseline ({pooled:.4f}), over the seeds in "
        f"`{STUDY_SEEDS}`. Power: two-sided paired t test at 95 % (noncentral t).\n"
    )


def _gap_row(name: str, per_word: str, per_byte: float, n: int, sd: float, pooled: float) -> list[str]:
    needed = [pairs_for_power(abs(per_byte), s) for s in (sd, pooled)]
    return [
        name,
        per_word,
        f"{per_byte:+.4f}",
        f"{power(abs(per_byte), sd, n):.0%}",
        *("more than 10,000" if k is None else f"{k:,}" for k in needed),
    ]


def study_unigram(root: Path) -> str:
    """The study's floor: a unigram model of the training bytes on the runs' validation bytes
    (``benchmarks/unigram_baseline.py``)."""
    data = json.loads((root / STUDY_UNIGRAM).read_text())
    return (
        f"For scale, a unigram model of the training bytes scores {data['nats_per_byte']:.3f} nats per byte on the "
        f"same {data['val_tokens']:,} validation bytes the runs score ({data['smoothing']} of "
        f"{data['vocab_size']} tokens, counted over {data['train_tokens']:,} training labels; `{STUDY_UNIGRAM}`, "
        f"written {data['date'][:10]} by `{data['command']}`).\n"
    )


def study_horizon(root: Path) -> str:
    """The learning-rate check at the horizon: full-length seed-0 runs at another rate than the sweep chose (on a
    quarter of the tokens), each beside the seed-0 run of its layout at the chosen rate."""
    chosen = _seed_runs(root)
    rows = []
    for run in _study_runs(root, STUDY_HORIZON):
        base = chosen[(run.residual, 0, run.config.model.n_layers)]
        other, at_chosen = final_val_loss(run), final_val_loss(base)
        rows.append(
            [
                run.residual,
                f"{base.config.train.optimizer.lr:g}",
                f"{at_chosen:.4f}",
                f"{run.config.train.optimizer.lr:g}",
                f"{other:.4f}",
                f"{other - at_chosen:+.4f}",
            ]
        )
    header = ["layout", "chosen lr", "val loss, chosen lr", "other lr", "val loss, other lr", "other − chosen"]
    return (
        markdown_table(header, rows)
        + f"\n\nValidation loss (nats/byte) at step 2,200, seed 0, one run per cell; from `{STUDY_HORIZON}` and "
        f"`{STUDY_SEEDS}`. One seed: a difference inside the seeds' pair-to-pair sd (about 0.017) does not show "
        "that either rate is better.\n"
    )


def study_ladder_rate(root: Path) -> str:
    """The ladder at 4e-3 seed by seed (seed 0 is the horizon run), beside its 8e-3 run and standard's 8e-3 run of
    the same seed, with the paired differences to standard; their mean from two seeds, their t interval from three."""
    at_4e3 = _study_runs(root, STUDY_HORIZON) + _study_runs(root, STUDY_LADDER_4E3, required=False)
    at_4e3 = [run for run in at_4e3 if run.residual == "ladder" and run.config.train.optimizer.lr == 4e-3]
    at_8e3 = _seed_runs(root)
    rows, news, olds, bases = [], [], [], []
    for run in sorted(at_4e3, key=lambda r: r.seed):
        depth = run.config.model.n_layers
        ladder8, standard8 = at_8e3[("ladder", run.seed, depth)], at_8e3[("standard", run.seed, depth)]
        new, old, base = final_val_loss(run), final_val_loss(ladder8), final_val_loss(standard8)
        news, olds, bases = [*news, new], [*olds, old], [*bases, base]
        rows.append(
            [str(run.seed), f"{old:.4f}", f"{new:.4f}", f"{base:.4f}", f"{old - base:+.4f}", f"{new - base:+.4f}"]
        )
    pairs = len(rows)
    if pairs > 1:
        old_gap, new_gap = paired_difference(olds, bases), paired_difference(news, bases)
        rows.append(["mean", "", "", "", f"{old_gap.mean:+.4f}", f"{new_gap.mean:+.4f}"])
    if pairs > 2:
        interval = "[{:+.4f}, {:+.4f}]"
        rows.append(["95 % t interval", "", "", "", *(interval.format(d.low, d.high) for d in (old_gap, new_gap))])
    header = ["seed", "ladder 8e-3", "ladder 4e-3", "standard 8e-3", "ladder 8e-3 − standard", "ladder 4e-3 − standard"]
    return (
        markdown_table(header, rows)
        + f"\n\nValidation loss (nats/byte) at step 2,200, one run per cell; the ladder at 4e-3 from `{STUDY_HORIZON}` "
        f"(seed 0) and `{STUDY_LADDER_4E3}`, the 8e-3 runs from `{STUDY_SEEDS}`; {pairs} pair(s) by seed"
        + (": no interval before three.\n" if pairs < 3 else " (paired t, as the seeds table).\n")
    )


def json_table(relative: str) -> Callable[[Path], str]:
    """A table stored as ``{"header": [...], "rows": [[...]], "note": "..."}`` by the script that measured it."""

    def make(root: Path) -> str:
        data = json.loads((root / relative).read_text())
        note = f"\n\n{data['note']}\n" if data.get("note") else "\n"
        return markdown_table(data["header"], data["rows"]) + note

    return make


def activation_memory(root: Path) -> str:
    """benchmarks/activation_memory.py's rows: the memory held after forward and the peak of each layout and
    checkpointing mode, each against the layout's mode none, with the loss and the gradients' largest difference."""
    rows = [json.loads(line) for line in (root / ACTIVATION_MEMORY).read_text().splitlines()]
    none = {row["layout"]: row for row in rows if row["mode"] == "none"}
    body = []
    for row in rows:
        base, held, peak = none[row["layout"]], row["held_after_forward_bytes"], row["peak_bytes"]
        body.append(
            [
                row["layout"],
                row["mode"],
                f"{held / 2**20:,.1f}",
                f"{held / base['held_after_forward_bytes']:.2f}",
                f"{peak / 2**20:,.1f}",
                f"{peak / base['peak_bytes']:.2f}",
                f"{row['loss']:.6f}",
                f"{row['max_grad_diff']:g}",
            ]
        )
    header = ["layout", "mode", "held MiB", "/ none", "peak MiB", "/ none", "loss", "max grad diff to none"]
    return markdown_table(header, body) + "\n"


ACTIVATION_MEMORY = "docs/results/activation_memory/cpu.jsonl"  # written by `python -m benchmarks.activation_memory`

TABLES: dict[str, Callable[[Path], str]] = {
    "study-lr-sweep": study_lr_sweep,
    "study-seeds": study_seeds,
    "study-paper-gap": study_paper_gap,
    "study-unigram": study_unigram,
    "study-horizon": study_horizon,
    "study-ladder-rate": study_ladder_rate,
    "predict-paper70": json_table("docs/results/predict_paper70.json"),  # written by `ladder-predict paper --out`
    "activation-memory": activation_memory,
    **doc_bench_tables.TABLES,  # the developer benchmarks' JSON lines (benchmarks/*.py --out)
    **doc_tp_tables.TABLES,  # ladder-bench's JSON lines, several invocations per file
    **doc_eval_tables.TABLES,  # ladder-eval's results JSON
    **doc_gpu_tables.TABLES,  # benchmarks/gpu_check.py's rows of one card and date
    **doc_predict_tables.TABLES,  # ladder-predict's JSON lines and benchmarks/predictor_sensitivity.py's
}


class MissingData(Exception):
    """A marked table whose data file is not there (yet): one line naming the table and the file."""


def make_table(name: str, root: Path) -> str:
    """The table ``name`` from its data; a missing data file raises MissingData, an unknown name KeyError."""
    try:
        return TABLES[name](root)
    except FileNotFoundError as err:
        raise MissingData(f"table {name}: {err.filename} not found (run the command beside the table)") from None


def remake(text: str, root: Path, skip_missing: bool = False) -> str:
    """``text`` with every marked table made again from its data; with ``skip_missing`` a table whose data is
    missing keeps its text."""

    def fill(match: re.Match) -> str:
        try:
            return match.group(1) + make_table(match.group("name"), root) + match.group(4)
        except MissingData as err:
            if not skip_missing:
                raise
            print(f"kept: {err}", file=sys.stderr)
            return match.group(0)

    return _BLOCK.sub(fill, text)


def stale_tables(root: Path, docs: tuple[str, ...] = DOCS) -> list[str]:
    """``DOC: NAME`` for every marked table whose text differs from what its data give."""
    stale = []
    for doc in docs:
        text = (root / doc).read_text()
        for match in _BLOCK.finditer(text):
            if match.group("body") != make_table(match.group("name"), root):
                stale.append(f"{doc}: {match.group('name')}")
    return stale


def _missing(name: str, root: Path) -> bool:
    try:
        make_table(name, root)
    except MissingData:
        return True
    return False


PROG = "python -m ladder_train.report.docs_tables"
HELP = f"""usage: {PROG} (--write | --check) [--root DIR]

  --write     remake every marked table in the docs
  --check     exit 1 if a marked table differs from its data
  --root DIR  the repository (default: here)"""


def parse_command(argv: list[str]) -> tuple[str, Path]:
    """(``write`` or ``check``, the repository) from the command line; anything else is an InputError of one line."""
    actions, root = set(), Path(".")
    args = iter(argv)
    for arg in args:
        if arg in ("--write", "--check"):
            actions.add(arg.removeprefix("--"))
        elif arg == "--root" or arg.startswith("--root="):
            folder = arg.removeprefix("--root=") if "=" in arg else next(args, "")
            if not folder:
                raise InputError("--root needs a folder")
            root = Path(folder)
        else:
            raise InputError(f"unknown argument {arg!r} (see --help)")
    if len(actions) != 1:
        raise InputError("give one of --write and --check")
    return actions.pop(), root


def write_tables(root: Path) -> int:
    """Remake every marked table; one whose data is missing keeps its text, and the exit status (1) says so."""
    missing = []
    for doc in DOCS:
        path = root / doc
        text = path.read_text()
        path.write_text(remake(text, root, skip_missing=True))
        missing += [m.group("name") for m in _BLOCK.finditer(text) if _missing(m.group("name"), root)]
    return 1 if missing else 0


def check_tables(root: Path) -> int:
    """0 when every marked table equals what its data give, else 1 with a line per stale table."""
    try:
        stale = stale_tables(root)
    except MissingData as err:
        print(err, file=sys.stderr)
        return 1
    for entry in stale:
        print(f"stale table: {entry} (remake it: {COMMAND})", file=sys.stderr)
    return 1 if stale else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(HELP)
        return 0
    try:
        action, root = parse_command(argv)
    except InputError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return write_tables(root) if action == "write" else check_tables(root)


if __name__ == "__main__":
    sys.exit(main())
