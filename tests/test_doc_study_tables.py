"""The layout study's figures in docs/results.md that its tables make beyond a cell: the pooled pair sd behind the
power figures, recomputed by hand from the committed runs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from ladder_train.study.stats import PairedDifference, pooled_sd

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ROOT / "docs/results/study_small/seeds"


def _difference(n: int, sd: float) -> PairedDifference:
    return PairedDifference(n=n, mean=0.0, sd=sd, half_width=0.0, p_value=1.0, confidence=0.95)


def test_the_pooled_sd_weighs_each_comparisons_variance_by_its_degrees_of_freedom():
    # 12 x 0.01^2 + 2 x 0.04^2 = 0.0012 + 0.0032 = 0.0044 over 14 degrees of freedom: sqrt(0.000314) = 0.017728;
    # the unweighted mean of the two variances would give sqrt(0.00085) = 0.029155
    assert pooled_sd([_difference(13, 0.01), _difference(3, 0.04)]) == pytest.approx(math.sqrt(0.0044 / 14))
    assert pooled_sd([_difference(3, 0.02), _difference(3, 0.04)]) == pytest.approx(math.sqrt(0.001))  # equal weights
    assert pooled_sd([_difference(5, 0.03)]) == pytest.approx(0.03)
    with pytest.raises(ValueError, match="at least one"):
        pooled_sd([])


def _final_val_losses() -> dict[tuple[str, int], dict[int, float]]:
    """{(residual, layers): {seed: validation loss at the run's last validation step}}, read from the committed
    folders' names and metrics rows alone (not through the report's code)."""
    losses: dict[tuple[str, int], dict[int, float]] = {}
    for metrics in sorted(SEEDS.glob("*/metrics.jsonl")):
        keys = dict(part.split("=", 1) for part in metrics.parent.name.split(","))
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        val = [row for row in rows if "val_loss" in row]
        last = max(row["step"] for row in val)
        final = [row["val_loss"] for row in val if row["step"] == last][-1]  # a resumed run's last record
        group = (keys["model.residual"], int(keys.get("model.n_layers", 8)))
        losses.setdefault(group, {})[int(keys.get("run.seed", 0))] = final
    return losses


def test_the_paper_gap_tables_pooled_sd_is_the_committed_pairs_weighted_by_degrees_of_freedom():
    from ladder_train.report.docs_tables import make_table

    losses = _final_val_losses()
    standard = losses.pop(("standard", 8))
    weighted, df, variances = 0.0, 0, []
    for runs in losses.values():
        gaps = [runs[seed] - standard[seed] for seed in sorted(runs) if seed in standard]
        sd = statistics.stdev(gaps)
        weighted += (len(gaps) - 1) * sd**2
        df += len(gaps) - 1
        variances.append(sd**2)
    by_hand = math.sqrt(weighted / df)
    assert sorted(len(runs) for runs in losses.values()) == [3, 3, 3, 13] and df == 18
    # the issue 64 figures: weighted 0.0232; the unweighted mean of the four variances it replaces gave 0.0218
    assert f"{by_hand:.4f}" == "0.0232" and f"{math.sqrt(statistics.fmean(variances)):.4f}" == "0.0218"

    table = make_table("study-paper-gap", ROOT)
    assert f"pairs for 80 % (sd {by_hand:.4f}) |" in table.splitlines()[0]
    assert f"pooled sd of the 4 comparisons with the baseline ({by_hand:.4f}), each comparison's variance" in table
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table.splitlines()[2:7]}
    # at the weighted sd: 143 pairs for 80 % power at the paper's 3.5B gap (0.0055), 13 at 0.02 (127 and 12 unweighted)
    assert rows["paper 3.5B: ladder − standard"][-1] == "143"
    assert rows["a difference of 0.02 nats/byte"][-1] == "13"
    # and the results.md text that quotes them
    text = (ROOT / "docs/results.md").read_text()
    assert text.count("pooled pair sd 0.023") == 2 and "pooled pair sd 0.022" not in text
    assert "needs 49 / 45 pairs at the ladder's and the pooled sd (the table above), at a true 0.02 14 / 13" in text
