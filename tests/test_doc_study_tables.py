"""The layout study's figures in docs/results.md that its tables make beyond a cell: the pooled pair sd behind the
power figures, recomputed by hand from the committed runs, and the runs' wall time from their metrics' clock times."""

from __future__ import annotations

import json
import math
import statistics
from datetime import UTC, datetime
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


def _final_val_losses(folder: Path = SEEDS, wikitext: bool = False, named: str = "") -> dict[tuple, dict[int, float]]:
    """{(residual, layers): {seed: validation loss at the run's last validation step}} (``wikitext``: the end-of-run
    WikiText-2 bits/byte instead) of the runs whose folder name holds ``named``, read from the committed folders'
    names, metrics rows and eval files alone (not through the report's code)."""
    losses: dict[tuple, dict[int, float]] = {}
    for metrics in sorted(folder.glob(f"*{named}*/metrics.jsonl")):
        keys = dict(part.split("=", 1) for part in metrics.parent.name.split(","))
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        val = [row for row in rows if "val_loss" in row]
        last = max(row["step"] for row in val)
        final = [row["val_loss"] for row in val if row["step"] == last][-1]  # a resumed run's last record
        if wikitext:
            evals = json.loads((metrics.parent / "eval" / f"step-{last}.json").read_text())
            final = evals["summary"]["wikitext2_local"]["bits_per_byte"]
        group = (keys["model.residual"], int(keys.get("model.n_layers", 8)))
        losses.setdefault(group, {})[int(keys.get("run.seed", 0))] = final
    return losses


def _paired(values: dict[int, float], baseline: dict[int, float]) -> tuple[int, float, float, float]:
    """n, mean, 95 % half-width and two-sided p of the paired t over the seeds both have."""
    from scipy import stats

    gaps = [values[seed] - baseline[seed] for seed in sorted(values) if seed in baseline]
    n, mean, sd = len(gaps), statistics.fmean(gaps), statistics.stdev(gaps)
    se = sd / math.sqrt(n)
    return n, mean, stats.t.ppf(0.975, n - 1) * se, 2 * stats.t.sf(abs(mean) / se, n - 1)


def test_results_md_quotes_the_each_at_its_rate_comparison_as_the_committed_runs_give_it():
    """Ladder 4e-3 − standard 8e-3 (issue 64's comparison), recomputed from the runs: its thirteen pairs, the
    interval, p, Holm over the protocol's five comparisons and WikiText-2, with the descriptions beside it (the 8e-3
    gap over the same seeds, the ladder's 4e-3 − 8e-3 on both metrics), as results.md's prose quotes them."""
    at_4e3, wiki_4e3 = {}, {}
    for folder in (ROOT / "docs/results/study_small/horizon", ROOT / "docs/results/study_small/ladder_4e-3"):
        at_4e3.update(_final_val_losses(folder, named="lr=4e-3")[("ladder", 8)])
        wiki_4e3.update(_final_val_losses(folder, wikitext=True, named="lr=4e-3")[("ladder", 8)])
    losses, wiki = _final_val_losses(), _final_val_losses(wikitext=True)
    standard = losses.pop(("standard", 8))
    n, mean, half, p = _paired(at_4e3, standard)
    family = sorted([p, *(_paired(runs, standard)[3] for runs in losses.values())])
    holm = max(min(1.0, (len(family) - rank) * q) for rank, q in enumerate(family) if q <= p)  # step-down, to p
    wn, wmean, whalf, wp = _paired(wiki_4e3, wiki[("standard", 8)])
    # the protocol's end: seeds 0-12, every one paired (step 2 stops the runs at seed 12)
    assert len(family) == 5 and n == wn == 13

    def signed(x: float) -> str:
        return f"{x:+.3f}".replace("-", "−")

    text = " ".join((ROOT / "docs/results.md").read_text().split())
    figure = (
        f"{signed(mean)} nats/byte [{signed(mean - half)}, {signed(mean + half)}], p = {p:.3f}, {holm:.3f} after Holm's"
    )
    assert f"standard at 8e-3) over the same thirteen seeds, the ladder is {figure}" in text  # the Result paragraph
    wiki_figure = f"{signed(wmean)} bits/byte [{signed(wmean - whalf)}, {signed(wmean + whalf)}], p = {wp:.3f}"
    assert f"at each layout's own rate it gives {wiki_figure}" in text
    table_figure = figure.replace(" nats/byte", "").replace(" = ", " ").replace("], p", "] at 4e-3 (p")
    assert f"With seeds 3-12 (thirteen pairs) the table gives {table_figure}" in text
    assert f"WikiText-2 {wiki_figure.replace(' = ', ' ')})" in text
    above = sum(at_4e3[seed] > standard[seed] for seed in at_4e3)
    assert f"above standard in {above} of the 13 pairs" in text

    # the descriptions beside it: the 8e-3 gap over the same seeds and the ladder's two rates, on both metrics
    ladder_8e3 = losses[("ladder", 8)]
    gap_4e3 = mean
    _, mean, half, _ = _paired(ladder_8e3, standard)
    assert f"the ladder's gap where it was, {signed(gap_4e3)} at 4e-3 against {signed(mean)} at 8e-3)" in text
    assert f"p {wp:.3f}), {signed(mean)} [{signed(mean - half)}, {signed(mean + half)}] at 8e-3 and" in text
    _, mean, half, _ = _paired(at_4e3, ladder_8e3)
    rates = f"{signed(mean)} [{signed(mean - half)}, {signed(mean + half)}]"
    assert f"its two rates end alike (4e-3 − 8e-3: {rates})" in text
    assert f"a 4e-3 − 8e-3 difference of {rates}: on average the rate" in text
    widest = max(abs(at_4e3[seed] - ladder_8e3[seed]) for seed in at_4e3)
    assert f"seed by seed the two rates differ by up to {widest:.3f}, either way" in text
    assert (
        min(at_4e3[s] - ladder_8e3[s] for s in at_4e3) < -0.05 < 0.05 < max(at_4e3[s] - ladder_8e3[s] for s in at_4e3)
    )
    _, mean, half, _ = _paired(wiki_4e3, wiki[("ladder", 8)])
    assert (
        mean > 0
        and f"score {mean:.3f} bits/byte above its 8e-3 runs ([{signed(mean - half)}, {signed(mean + half)}]" in text
    )


def test_the_paper_gap_tables_pooled_sd_is_the_committed_pairs_weighted_by_degrees_of_freedom():
    from tools.docs_tables import make_table

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


def test_the_seeds_note_gives_the_timed_runs_wall_time_first_row_to_last_with_resumes_counted(tmp_path):
    from fabricate import fabricate_run

    from tools.docs_tables import MANIFEST, make_table

    STUDY_SEEDS = MANIFEST["study-seeds"].data["seeds"]

    seeds = tmp_path / STUDY_SEEDS
    seeds.mkdir(parents=True)
    for layout, base in (("standard", 2.0), ("ladder", 2.1)):
        for seed in range(4):
            fabricate_run(seeds, f"{layout}_s{seed}", layout, base + seed / 100, [f"run.seed={seed}"], summary={})
    # seeds 2 and 3 carry clock times, a row a minute apart (and seed 3's standard run replays steps 4-6 after a
    # 30-minute pause); seeds 0 and 1 carry none, as the rows written before 2026-11-27
    start = 1_700_000_000
    for name, pause_at in (("standard_s2", None), ("ladder_s2", None), ("standard_s3", 7), ("ladder_s3", None)):
        metrics = seeds / name / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        if pause_at is not None:
            train = [row for row in rows if "loss" in row]
            at = rows.index(train[pause_at - 1]) + 1
            rows = rows[:at] + [{**row, "resumed": True} for row in train[3:6]] + rows[at:]
        clock, out = start, []
        for row in rows:
            clock += 60 + (1800 if row.get("resumed") and row["step"] == 4 else 0)
            out.append(json.dumps({**row, "time": datetime.fromtimestamp(clock, UTC).isoformat()}))
        metrics.write_text("\n".join(out) + "\n")
    note = make_table("study-seeds", tmp_path).split("\n\n")[-1]
    # fabricated runs log 12 rows (10 training, 2 validation): 11 minutes first to last; the resumed one 3 rows
    # more and the pause: 14 + 30 = 44 minutes. Median of 11, 11, 11, 44: 11
    assert (
        "Wall time of the 4 runs whose metrics rows carry clock times (seeds 2-3), from the first logged row (step 1) "
        "to the last (the end-of-run evaluation): median 11 min (11–44); 1 of them was cut off and resumed, their "
        "pause and replayed steps included." in note
    )


def test_the_committed_seeds_wall_time_is_the_one_results_md_quotes():
    from tools.docs_tables import make_table

    note = make_table("study-seeds", ROOT).split("\n\n")[-1]
    assert "Wall time of the 20 runs whose metrics rows carry clock times (seeds 3-12)" in note
    assert "median 71 min (56–125); 6 of them were cut off and resumed" in note
    text = " ".join((ROOT / "docs/results.md").read_text().split())
    assert "Seeds 3-12's runs took 56-125 minutes each on this VM, median 71," in text
    assert "six of the twenty were cut off and resumed" in text and "about 56 minutes" not in text
