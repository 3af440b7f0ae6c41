"""The layouts chart of a study report (``ladder-report --predictions``, report/layout_chart.py): each layout's paired
difference to standard against its all-reduces per token and layer, labelled with ladder-predict's predicted decode
speedups; made from the committed study seeds and prediction rows."""

import json
import math
import statistics
from pathlib import Path

import pytest
import scipy.stats
from PIL import Image

from ladder_train.config import load_config
from ladder_train.errors import InputError
from ladder_train.option_errors import layout_name
from ladder_train.report import write_report
from ladder_train.report.layout_chart import all_reduces_per_layer, read_predictions

REPO = Path(__file__).resolve().parents[1]
SEEDS = REPO / "docs/results/study_small/seeds"
PREDICTIONS = REPO / "docs/results/predict/layouts_1.2B_tp8.jsonl"


@pytest.mark.parametrize(
    "overrides, name, per_layer",
    [
        ([], "standard", 2),
        (["model.residual=parallel"], "parallel", 1),
        (["model.residual=ladder"], "ladder", 2),
        (["model.residual=desync", "model.desync_tp=2"], "desync-2", 1),
        (
            ["model.residual=desync", "model.desync_tp=2", "model.desync_reduce_every=4", "model.n_layers=8"],
            "desync-4",
            0.5,
        ),
        (["model.residual=desync", "model.desync_tp=2", "model.desync_layers=1", "model.n_layers=4"], "desync-2", 1.75),
    ],
)
def test_layout_names_and_their_all_reduces_per_layer(overrides, name, per_layer):
    model = load_config(None, ["model.dim=32", "model.n_heads=4", "model.ffn_dim=64", *overrides]).model
    assert layout_name(model) == name
    assert all_reduces_per_layer(model) == per_layer


def _final_val_losses(layout: str, lr: str) -> dict[int, float]:
    """Seed -> last validation loss of the committed 8-layer runs of a layout at a rate, read from the raw rows."""
    losses = {}
    for run in SEEDS.glob(f"model.residual={layout},train.optimizer.lr={lr},run.seed=*"):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        losses[int(run.name.rsplit("=", 1)[1])] = [row["val_loss"] for row in rows if "val_loss" in row][-1]
    return losses


def _hand_paired_row(layout: str, lr: str) -> str:
    """The layout's paired difference to standard and its 95 % t interval, computed here from the raw rows (the
    seeds grow as the study's runs land, so the figures are not written out)."""
    runs, base = _final_val_losses(layout, lr), _final_val_losses("standard", "8e-3")
    diffs = [runs[seed] - base[seed] for seed in sorted(runs.keys() & base.keys())]
    n, mean = len(diffs), statistics.fmean(diffs)
    half = scipy.stats.t.ppf(0.975, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return f"| {layout} | {n} | {mean:+.4f} | [{mean - half:+.4f}, {mean + half:+.4f}] |"


def test_the_study_report_charts_the_layouts_with_their_predicted_speedups(tmp_path):
    report = write_report([SEEDS], tmp_path, resolution=0.01, predictions=PREDICTIONS).read_text()
    section = report.split("## Layouts: quality, communication, predicted speed\n", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in section.splitlines() if line.startswith("| ")}
    # the study's committed seeds: the paired differences and intervals as computed by hand from the raw rows
    assert rows["ladder"] == _hand_paired_row("ladder", "8e-3") + " 2 (hidden) | 1.67x | 1.42x |"
    assert rows["parallel"].startswith(_hand_paired_row("parallel", "4e-3") + " 1 | 1.39x | 1.56x")
    assert rows["parallel"].startswith("| parallel | 3 | +0.0162 | [-0.0122, +0.0445] |")  # seeds 0-2, all it has
    assert "model.n_layers=4" not in section and "model.n_layers=6" not in section  # controls left out
    assert "PREDICTED by ladder-predict" in section and "1.2B at TP 8, batch 1, h100 profile" in section
    assert Image.open(tmp_path / "layouts.png").size[0] > 500


def test_predictions_of_two_settings_are_refused(tmp_path):
    rows = PREDICTIONS.read_text() + PREDICTIONS.read_text().replace('"tp": 8', '"tp": 4')
    (tmp_path / "p.jsonl").write_text(rows)
    with pytest.raises(InputError, match=r"p.jsonl: needs ladder-predict rows of one model, profile and TP degree"):
        read_predictions(tmp_path / "p.jsonl")
    speedups, setting = read_predictions(PREDICTIONS)
    assert speedups["desync-4"] == {"nvlink": pytest.approx(1.616, abs=1e-3), "pcie": pytest.approx(2.061, abs=1e-3)}


def test_a_layout_without_two_seeds_shared_with_standard_gets_no_point(tmp_path):
    from fabricate import fabricate_run

    study = tmp_path / "study"
    study.mkdir()
    for seed in (0, 1):
        fabricate_run(study, f"standard_s{seed}", "standard", 2.0 + seed, [f"run.seed={seed}"], summary={})
        fabricate_run(study, f"ladder_s{seed}", "ladder", 2.1 + seed, [f"run.seed={seed}"], summary={})
    for seed in (1, 5):  # one seed shared with standard: a mean of 0 would place it on standard's line
        overrides = ["model.desync_tp=2", f"run.seed={seed}"]
        fabricate_run(study, f"desync_s{seed}", "desync", 2.5, overrides, summary={})
    report = write_report([study], tmp_path / "out", predictions=PREDICTIONS).read_text()
    section = report.split("## Layouts: quality, communication, predicted speed\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[:3] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == [
        ["| layout", "pairs", "paired difference"],
        ["| ladder", "2", "+0.1000"],
        ["| standard", "2", "+0.0000"],
    ]


def test_a_second_study_folder_adds_the_desync_arms_to_the_chart(tmp_path):
    from fabricate import fabricate_run

    seeds, desync = tmp_path / "seeds", tmp_path / "seeds_desync"
    seeds.mkdir()
    desync.mkdir()
    for seed in (0, 1):
        fabricate_run(seeds, f"standard_s{seed}", "standard", 2.0 + seed, [f"run.seed={seed}"], summary={})
        overrides = ["model.desync_tp=2", "model.desync_reduce_every=4", f"run.seed={seed}"]
        fabricate_run(desync, f"desync4_s{seed}", "desync", 2.2 + seed, overrides, summary={})
    report = write_report([seeds, desync], tmp_path / "out", predictions=PREDICTIONS).read_text()
    section = report.split("## Layouts: quality, communication, predicted speed\n", 1)[1].split("\n## ", 1)[0]
    # desync-4 of the tiny preset's 2 layers: only the last module (layer 1's MLP) reduces -> 0.5 per layer
    # two pairs: a mean, no interval (the desync seeds table's rule too); a third pair gives it one
    assert "| desync-4 | 2 | +0.2000 | — | 0.5 | 1.62x | 2.06x |" in section
    fabricate_run(seeds, "standard_s2", "standard", 2.5, ["run.seed=2"], summary={})
    overrides = ["model.desync_tp=2", "model.desync_reduce_every=4", "run.seed=2"]
    fabricate_run(desync, "desync4_s2", "desync", 3.0, overrides, summary={})
    report = write_report([seeds, desync], tmp_path / "out3", predictions=PREDICTIONS).read_text()
    # pairs +0.2, +0.2, +0.5: mean 0.3, sd sqrt(0.03) = 0.1732, half-width t(0.975, 2) 4.3027 x 0.1732 / sqrt(3) = 0.4303
    assert "| desync-4 | 3 | +0.3000 | [-0.1303, +0.7303] | 0.5 | 1.62x | 2.06x |" in report
