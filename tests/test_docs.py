"""The docs' tables made from committed data (tools/docs_tables/) equal what that data give, and
an edited number is caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools.docs_tables import DOCS, MANIFEST, main, parse_command, remake, stale_tables

ROOT = Path(__file__).resolve().parents[1]
STUDY_LR, STUDY_LR_DESYNC = (MANIFEST["study-lr-sweep"].data[key] for key in ("sweep", "desync"))
STUDY_SEEDS, STUDY_SEEDS_DESYNC = (MANIFEST["study-desync-seeds"].data[key] for key in ("seeds", "desync_seeds"))
STUDY_HORIZON, STUDY_LADDER_4E3 = (MANIFEST["study-ladder-rate"].data[key] for key in ("horizon", "ladder_4e3"))
STUDY_SEED_RUNS = MANIFEST["study-seeds"].args["planned_runs"]
SMOLLM2, SMOLLM2_RETRAINED = (MANIFEST[name].data["folder"] for name in ("smollm2-conversion", "smollm2-retrained"))


def test_every_table_made_from_data_equals_what_its_data_give():
    assert stale_tables(ROOT) == []


def test_the_manifest_names_every_marked_table_and_a_builder_taking_its_data_and_args():
    import inspect
    import re

    from tools.docs_tables import DOCS

    marked = {name for doc in DOCS for name in re.findall(r"<!-- table ([\w-]+): ", (ROOT / doc).read_text())}
    assert marked == set(MANIFEST)
    for name, entry in MANIFEST.items():
        params = list(inspect.signature(entry.function()).parameters)
        given = ["rows", "path"] if entry.rows is not None else ["root"]
        keywords = set(entry.args) | (set() if entry.rows is not None else set(entry.data))
        assert params[: len(given)] == given and set(params[len(given) :]) == keywords, name


def _copy_docs(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for name in ("README.md",):
        shutil.copyfile(ROOT / name, tmp_path / name)
    return tmp_path


def test_an_edited_number_in_a_table_is_caught_and_write_restores_it(tmp_path):
    root = _copy_docs(tmp_path)
    results = root / "docs" / "results.md"
    text = results.read_text()
    assert "**1.9322**" in text  # standard's best rate in the learning-rate sweep
    results.write_text(text.replace("**1.9322**", "**1.9222**"))
    assert stale_tables(root) == ["docs/results.md: study-lr-sweep"]
    assert main(["--check", "--root", str(root)]) == 1
    assert main(["--write", "--root", str(root)]) == 0
    assert results.read_text() == text and stale_tables(root) == []


def test_the_command_takes_write_or_check_and_refuses_anything_else_in_one_line(capsys):
    assert parse_command(["--write", "--root=docs_copy"]) == ("write", Path("docs_copy"))
    assert parse_command(["--root", "docs_copy", "--check"]) == ("check", Path("docs_copy"))
    capsys.readouterr()
    assert main(["--check", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == "python -m tools.docs_tables: error: unknown argument '--bogus' (see --help)\n"
    for argv in ([], ["--write", "--check"], ["--check", "--root"]):  # nothing is written or checked
        assert main(argv) == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert main(["--help"]) == 0 and "--write" in capsys.readouterr().out


def test_a_new_run_changes_the_table_it_feeds(tmp_path):
    """The table follows the data: dropping one run's folder turns its cell into 'not run'."""
    root = _copy_docs(tmp_path)
    shutil.rmtree(root / "docs/results/study_small/lr/model.residual=parallel,train.optimizer.lr=3.2e-2")
    remade = remake((root / "docs" / "results.md").read_text(), root)
    assert "| parallel | 2.0133 | **1.9739** | 1.9768 | 2.0275 | not run |" in remade


def test_a_run_whose_metrics_change_is_read_again_in_the_same_process(tmp_path):
    """The tables read each run folder once per state of its files: an edited metrics.jsonl feeds the next remake."""
    from tools.docs_tables import make_table

    root = _copy_docs(tmp_path)
    assert "| parallel | 2.0133 | **1.9739** | 1.9768 | 2.0275 | 2.1708 |" in make_table("study-lr-sweep", root)
    metrics = root / "docs/results/study_small/lr/model.residual=parallel,train.optimizer.lr=3.2e-2/metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"val_loss": 2.1708166375756264', '"val_loss": 2.9'))
    assert "| parallel | 2.0133 | **1.9739** | 1.9768 | 2.0275 | 2.9000 |" in make_table("study-lr-sweep", root)


def test_the_study_seeds_table_pairs_each_group_with_standard_by_seed(tmp_path):
    """Two seeds per group: the paired difference and its interval are the ones computed by hand."""
    import pytest
    from fabricate import fabricate_run

    from tools.docs_tables import MissingData, make_table

    with pytest.raises(MissingData, match="table study-seeds: .*study_small/seeds"):
        make_table("study-seeds", tmp_path)
    seeds = tmp_path / STUDY_SEEDS
    seeds.mkdir(parents=True)
    for layout, layers, bases in (("standard", 2, (2.0, 2.2)), ("ladder", 2, (2.1, 2.4)), ("standard", 1, (2.5, 2.6))):
        for seed, base in enumerate(bases):
            overrides = [f"model.n_layers={layers}", f"run.seed={seed}"]
            fabricate_run(seeds, f"{layout}_{layers}_s{seed}", layout, base, overrides, summary={})
    table = make_table("study-seeds", tmp_path)
    rows = {
        tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
        for line in table.splitlines()
        if line.startswith("| validation")
    }
    # ladder - standard: +0.1, +0.2 -> mean 0.15, sd 0.0707; t(0.975, 1) = 12.7062 -> half-width 0.6353
    assert rows[("validation loss (nats/token)", "ladder")][3:5] == ["+0.1500", "[-0.4853, +0.7853]"]
    assert "half-width 0.6353 ≥ 0.01" in rows[("validation loss (nats/token)", "ladder")][-1]
    # t = 3 on 1 degree of freedom: p = 1 - 2 atan(3) / pi = 0.2048; the 1-layer control's +0.5, +0.4: t = 9,
    # p = 1 - 2 atan(9) / pi = 0.0704. Holm over the two: 2 x 0.0704 = 0.141, then max(0.141, 0.2048) = 0.205
    assert rows[("validation loss (nats/token)", "ladder")][5:7] == ["0.205", "0.205"]
    assert rows[("validation loss (nats/token)", "standard (model.n_layers=1)")][5:7] == ["0.070", "0.141"]
    assert rows[("validation loss (nats/token)", "standard (model.n_layers=2)")][-1] == "baseline"
    assert f"6 of the study's {STUDY_SEED_RUNS} planned seed runs finished" in table and "ladder: 0, 1" in table
    assert "slowest–fastest): 506 (506–506)" in table  # fabricated tokens/s 501..510: median 505.5


def test_the_retrained_smollm2_table_reads_its_own_folder(tmp_path):
    """The retraining's table is the conversion table's function on another folder: the conversion's results
    copied there give the same figures under the retrained labels; without them the table is missing data."""
    import pytest

    from tools.docs_tables import MissingData, make_table

    with pytest.raises(MissingData, match="smollm2_retrained"):
        make_table("smollm2-retrained", tmp_path)
    shutil.copytree(ROOT / SMOLLM2, tmp_path / SMOLLM2_RETRAINED)
    conversion, retrained = make_table("smollm2-conversion", ROOT), make_table("smollm2-retrained", tmp_path)
    assert "| upper 15 layers ladder, retrained | 83.83 | 105.88 | 36.0 ± 3.4 |" in retrained
    assert retrained.replace(", retrained", "").replace(str(SMOLLM2_RETRAINED), str(SMOLLM2)) == conversion


def test_the_horizon_check_sets_each_run_beside_its_layouts_seed_0_at_the_chosen_rate(tmp_path):
    from fabricate import fabricate_run

    from tools.docs_tables import make_table

    seeds, horizon = tmp_path / STUDY_SEEDS, tmp_path / STUDY_HORIZON
    seeds.mkdir(parents=True)
    horizon.mkdir(parents=True)
    for layout, base in (("standard", 2.0), ("ladder", 2.1)):
        fabricate_run(seeds, f"{layout}_s0", layout, base, ["train.optimizer.lr=8e-3", "run.seed=0"], summary={})
        seed_1 = base + (5.2 if layout == "ladder" else 5)
        fabricate_run(seeds, f"{layout}_s1", layout, seed_1, ["train.optimizer.lr=8e-3", "run.seed=1"], summary={})
    fabricate_run(horizon, "standard_4e-3", "standard", 1.9, ["train.optimizer.lr=4e-3", "run.seed=0"], summary={})
    table = make_table("study-horizon", tmp_path)
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines() if line.startswith("| standard")]
    # final validation loss = base + 1: 3.0 at the chosen 8e-3 (seed 0, not seed 1's 8.0), 2.9 at 4e-3
    assert rows == [["standard", "0.008", "3.0000", "0.004", "2.9000", "-0.1000"]]
    # the noise it is read against: ladder − standard pairs +0.1 and +0.3, sd 0.1414
    assert "pair-to-pair sd (ladder − standard: 0.141 over 2 pairs)" in table


def test_the_ladders_rate_table_pairs_each_seed_with_standard_and_averages_the_differences(tmp_path):
    from fabricate import fabricate_run

    from tools.docs_tables import make_table

    for folder in (STUDY_SEEDS, STUDY_HORIZON, STUDY_LADDER_4E3):
        (tmp_path / folder).mkdir(parents=True)
    for seed in (0, 1):
        for layout, base in (("standard", 2.0 + seed), ("ladder", 2.1 + seed)):
            overrides = ["train.optimizer.lr=8e-3", f"run.seed={seed}"]
            fabricate_run(tmp_path / STUDY_SEEDS, f"{layout}_s{seed}", layout, base, overrides, summary={})
    lr4 = ["train.optimizer.lr=4e-3"]
    fabricate_run(tmp_path / STUDY_HORIZON, "ladder_s0", "ladder", 2.02, [*lr4, "run.seed=0"], summary={})
    fabricate_run(tmp_path / STUDY_HORIZON, "standard_s0", "standard", 1.9, [*lr4, "run.seed=0"], summary={})
    fabricate_run(tmp_path / STUDY_LADDER_4E3, "ladder_s1", "ladder", 3.04, [*lr4, "run.seed=1"], summary={})
    table = make_table("study-ladder-rate", tmp_path)
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:] if line.startswith("| ")]
    # final validation loss = base + 1; standard's 4e-3 horizon run is not the ladder's
    assert rows == [
        ["0", "3.1000", "3.0200", "3.0000", "+0.1000", "+0.0200", "-0.0800"],
        ["1", "4.1000", "4.0400", "4.0000", "+0.1000", "+0.0400", "-0.0600"],
        ["mean", "", "", "", "+0.1000", "+0.0300", "-0.0700"],
    ]
    assert "2 pair(s) by seed: no interval before three." in table


def fabricate_ladder_rate(root, gaps_8e3, gaps_4e3, wiki_gaps_4e3=None, wiki_gaps_8e3=None):
    """Seeds 0.. of standard and the ladder at 8e-3 and of the ladder at 4e-3 (seed 0 in the horizon folder), the
    ladder's final validation loss standard's + its gap; with ``wiki_gaps_4e3`` WikiText-2 bits/byte too, the
    ladder's at 8e-3 standard's + ``wiki_gaps_8e3`` (0 when not given)."""
    from fabricate import fabricate_run

    for folder in (STUDY_SEEDS, STUDY_HORIZON, STUDY_LADDER_4E3):
        (root / folder).mkdir(parents=True)
    for seed, (gap_8e3, gap_4e3) in enumerate(zip(gaps_8e3, gaps_4e3, strict=True)):
        for layout, base in (("standard", 2.0 + seed), ("ladder", 2.0 + seed + gap_8e3)):
            wiki_gap = wiki_gaps_8e3[seed] if wiki_gaps_8e3 and layout == "ladder" else 0.0
            wiki = {} if wiki_gaps_4e3 is None else {"wikitext2_local": {"bits_per_byte": 1.0 + seed + wiki_gap}}
            overrides = ["train.optimizer.lr=8e-3", f"run.seed={seed}"]
            fabricate_run(root / STUDY_SEEDS, f"{layout}_s{seed}", layout, base, overrides, summary=wiki)
        if wiki_gaps_4e3 is not None:
            wiki = {"wikitext2_local": {"bits_per_byte": 1.0 + seed + wiki_gaps_4e3[seed]}}
        folder = root / (STUDY_HORIZON if seed == 0 else STUDY_LADDER_4E3)
        overrides = ["train.optimizer.lr=4e-3", f"run.seed={seed}"]
        fabricate_run(folder, f"ladder_s{seed}", "ladder", 2.0 + seed + gap_4e3, overrides, summary=wiki)


def ladder_rate_table(root: Path, *gaps, **wiki_gaps) -> tuple[str, dict[str, list[str]]]:
    """The study-ladder-rate table of ``fabricate_ladder_rate(root, *gaps, **wiki_gaps)``, and its rows: each
    row's name and its three interval cells."""
    from tools.docs_tables import make_table

    fabricate_ladder_rate(root, *gaps, **wiki_gaps)
    table = make_table("study-ladder-rate", root)
    lines = [line.split("|") for line in table.splitlines() if line.startswith("| ")]
    return table, {cells[1].strip(): [c.strip() for c in cells[5:-1]] for cells in lines}


def test_the_ladders_rate_table_gives_the_paired_interval_from_three_seeds(tmp_path):
    table, rows = ladder_rate_table(tmp_path, (0.1, 0.1, 0.1), (0.02, 0.04, 0.09))
    # 4e-3 gaps 0.02, 0.04, 0.09: mean 0.05, sd sqrt(0.0013) = 0.03606, t(0.975, 2) = 4.3027 -> half-width 0.08957;
    # the 8e-3 gaps are all 0.1 (sd 0); 4e-3 - 8e-3 = -0.08, -0.06, -0.01: mean -0.05, the same sd and half-width
    assert rows["mean"] == ["+0.1000", "+0.0500", "-0.0500"]
    assert rows["95 % t interval"] == ["[+0.1000, +0.1000]", "[-0.0396, +0.1396]", "[-0.1396, +0.0396]"]
    assert "3 pair(s) by seed (paired t, as the seeds table)." in table


def test_the_ladders_rate_table_adjusts_its_p_over_the_protocols_family_and_gives_wikitext_beside_it(tmp_path):
    table, rows = ladder_rate_table(
        tmp_path, (0.02, 0.04, 0.09), (0.05, 0.06, 0.07), wiki_gaps_4e3=(0.1, 0.3, 0.2), wiki_gaps_8e3=(0.0, 0.1, 0.2)
    )
    # three pairs, t with 2 degrees of freedom: two-sided p = 1 - t / sqrt(2 + t^2)
    # 8e-3: gaps 0.02, 0.04, 0.09, t = 0.05 / (0.036056 / sqrt 3) = 2.4019 -> p = 0.1383
    # 4e-3: gaps 0.05, 0.06, 0.07, t = 0.06 / (0.01 / sqrt 3) = 10.392 -> p = 0.00917
    # 4e-3 - 8e-3: +0.03, +0.02, -0.02, t = 0.01 / (0.026458 / sqrt 3) = 0.65465 -> p = 0.5799
    assert rows["p"] == ["0.138", "0.009", "0.580"]
    # Holm over the seeds table's one comparison (ladder 8e-3, p 0.1383) and this one (0.00917): the smaller
    # times two, 0.0183
    assert rows["Holm p (2 comparisons)"] == ["", "0.018", ""]
    # WikiText-2 gaps 0.1, 0.3, 0.2: mean 0.2, sd 0.1, half-width 4.3027 x 0.1 / sqrt 3 = 0.2484, t = 3.4641 -> p 0.0742
    assert "WikiText-2 (bits per byte), paired by seed: ladder 4e-3 − standard 8e-3 +0.2000 " in table
    # the ladder's own rates: 0.1 − 0.0, 0.3 − 0.1, 0.2 − 0.2: mean 0.1, sd 0.1, t = 1.7321 -> p = 1 − t / sqrt 5 = 0.2254
    assert (
        "[-0.0484, +0.4484], p = 0.074 (3 pairs); ladder 4e-3 − ladder 8e-3 +0.1000 [-0.1484, +0.3484], p = 0.225 "
        "(3 pairs)." in table
    )


def test_the_learning_rate_table_gives_each_desync_arm_its_row_and_bolds_only_a_bracketed_best(tmp_path):
    from fabricate import fabricate_run

    from tools.docs_tables import make_table

    for folder in (STUDY_LR, STUDY_LR_DESYNC):
        (tmp_path / folder).mkdir(parents=True)
    arms = {
        (STUDY_LR, "standard", ()): {"2e-3": 2.2, "4e-3": 2.0, "8e-3": 2.1},  # 4e-3 bracketed: bold
        (STUDY_LR, "ladder", ()): {"4e-3": 2.3, "8e-3": 2.25},  # best on the edge of its rates: not bold
        (STUDY_LR_DESYNC, "desync", ("model.desync_reduce_every=2",)): {"2e-3": 2.4, "4e-3": 2.35, "8e-3": 2.5},
        (STUDY_LR_DESYNC, "desync", ("model.desync_reduce_every=4",)): {"4e-3": 2.6},  # a probe of one rate
    }
    for (folder, residual, extra), losses in arms.items():
        for lr, base in losses.items():
            overrides = [f"train.optimizer.lr={lr}", *(["model.desync_tp=2", *extra] if extra else [])]
            fabricate_run(tmp_path / folder, f"{residual}{''.join(extra)}_{lr}", residual, base, overrides, {})
    table = make_table("study-lr-sweep", tmp_path)
    rows = table.splitlines()[2:7]
    # final validation loss = base + 1
    assert rows == [
        "| standard | 3.2000 | **3.0000** | 3.1000 |",
        "| parallel | not run | not run | not run |",
        "| ladder | not run | 3.3000 | 3.2500 |",
        "| desync-2 (t = 2) | 3.4000 | **3.3500** | 3.5000 |",
        "| desync-4 (t = 2) | not run | 3.6000 | not run |",
    ]
    assert "from the 5 runs in `docs/results/study_small/lr` and the 4 in" in table


def _desync_seeds_table(tmp_path, arms):
    """The desync seeds table over standard seeds 0-2 (final validation loss 3 + seed) and desync runs whose final
    loss is standard's plus the given gap, by arm (reduce every K) and seed."""
    from fabricate import fabricate_run

    from tools.docs_tables import make_table

    for folder in (STUDY_SEEDS, STUDY_SEEDS_DESYNC):
        (tmp_path / folder).mkdir(parents=True)
    for seed in range(3):
        overrides = ["train.optimizer.lr=8e-3", f"run.seed={seed}"]
        fabricate_run(tmp_path / STUDY_SEEDS, f"standard_s{seed}", "standard", 2.0 + seed, overrides, summary={})
    for every, gaps in arms.items():
        for seed, gap in enumerate(gaps):
            overrides = ["model.desync_tp=2", f"model.desync_reduce_every={every}", f"run.seed={seed}"]
            name = f"desync{every}_s{seed}"
            fabricate_run(tmp_path / STUDY_SEEDS_DESYNC, name, "desync", 2.0 + seed + gap, overrides, summary={})
    table = make_table("study-desync-seeds", tmp_path)
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:] if line.startswith("| ")]
    return table, rows


def test_the_desync_seeds_table_pairs_each_arm_with_standards_seed_and_adjusts_over_the_arms(tmp_path):
    table, rows = _desync_seeds_table(tmp_path, {2: (0.02, 0.04, 0.09), 4: (0.10, 0.11, 0.12)})
    assert table.splitlines()[0] == (
        "| seed | standard | desync-2 (t = 2) | desync-4 (t = 2) | desync-2 − standard | desync-4 − standard |"
    )
    # desync-2: mean 0.05, sd 0.03606, half-width t(0.975, 2) 0.03606 / sqrt(3) = 0.08957, p 0.1383;
    # desync-4: mean 0.11, sd 0.01, half-width 0.02484, p 0.002743; Holm: 2 x 0.002743 = 0.0055, then 0.1383
    assert rows == [
        ["0", "3.0000", "3.0200", "3.1000", "+0.0200", "+0.1000"],
        ["1", "4.0000", "4.0400", "4.1100", "+0.0400", "+0.1100"],
        ["2", "5.0000", "5.0900", "5.1200", "+0.0900", "+0.1200"],
        ["mean", "", "", "", "+0.0500", "+0.1100"],
        ["95 % t interval", "", "", "", "[-0.0396, +0.1396]", "[+0.0852, +0.1348]"],
        ["p (Holm)", "", "", "", "0.138", "0.005"],
    ]
    assert "pairs by seed: desync-2 3, desync-4 3." in table


def test_the_desync_seeds_table_marks_runs_not_yet_landed_and_tests_only_arms_with_three_pairs(tmp_path):
    table, rows = _desync_seeds_table(tmp_path, {2: (0.02, 0.04), 4: (0.10, 0.11, 0.12)})
    assert rows[2] == ["2", "5.0000", "not yet", "5.1200", "not yet", "+0.1200"]
    assert rows[3] == ["mean", "", "", "", "+0.0300", "+0.1100"]
    # desync-4 alone in Holm's family: its own p-value
    assert rows[4:] == [
        ["95 % t interval", "", "", "", "", "[+0.0852, +0.1348]"],
        ["p (Holm)", "", "", "", "", "0.003"],
    ]
    assert "pairs by seed: desync-2 2, desync-4 3." in table


def test_the_ladder_pairs_table_gives_each_seed_the_figures_of_the_pairs_so_far(tmp_path):
    import json

    from fabricate import fabricate_run

    from tools.docs_tables import make_table

    (tmp_path / STUDY_SEEDS).mkdir(parents=True)
    for seed, (ladder_gap, parallel_gap) in enumerate(((0.02, 0.01), (0.04, 0.03), (0.09, 0.02))):
        overrides = ["train.optimizer.lr=8e-3", f"run.seed={seed}"]
        for layout, base in (("standard", 2.0), ("ladder", 2.0 + ladder_gap), ("parallel", 2.0 + parallel_gap)):
            fabricate_run(tmp_path / STUDY_SEEDS, f"{layout}_s{seed}", layout, base + seed, overrides, summary={})
    # seed 2's runs carry clock times (rows written since 2026-11-27 do); the later one is the pair's finish
    for layout, time in (("standard", "2026-11-27T10:00:00+00:00"), ("ladder", "2026-11-27T11:30:59+00:00")):
        metrics = tmp_path / STUDY_SEEDS / f"{layout}_s2" / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        metrics.write_text("".join(json.dumps({**row, "time": time}) + "\n" for row in rows))
    table = make_table("study-ladder-pairs", tmp_path)
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:] if line.startswith("| ")]
    # ladder gaps 0.02, 0.04 (two pairs): mean 0.03, sd 0.01414, t(0.975, 1) 12.706 -> half-width 0.1271, p 0.2048;
    # with 0.09 (three): mean 0.05, sd 0.03606, half-width 0.0896, p 0.1383. Parallel's gaps 0.01, 0.03, 0.02 give
    # p 0.0742, so Holm over the two: max(0.2048, 2 x 0.0742) = 0.2048, then max(0.1383, 0.1484) = 0.1484
    assert rows == [
        ["0", "3.0000", "3.0200", "+0.0200", "2 of 2", "—", "1", "", "", "", "", "", ""],
        ["1", "4.0000", "4.0400", "+0.0400", "2 of 2", "—", "2", "+0.0300", "[-0.0971, +0.1571]", "0.1271", "0.0141"]
        + ["0.205", "0.205"],
        ["2", "5.0000", "5.0900", "+0.0900", "2 of 2", "2026-11-27 11:30", "3", "+0.0500", "[-0.0396, +0.1396]"]
        + ["0.0896", "0.0361", "0.138", "0.148"],
    ]
    # t(0.975, 10) x 0.03606 / sqrt(11) = 0.0242; t(0.975, 12) x 0.03606 / sqrt(13) = 0.0218
    assert "At the last row's pair sd (0.0361) the projected half-width is: 11 pairs 0.0242, 13 pairs 0.0218." in table
    assert "Holm p adjusts over the seeds table's 2 validation-loss comparisons" in table


CUT_FILES = [
    ("docs/results/checkpoint/cpu.jsonl", 2),  # a table's plain JSON lines
    ("docs/results/tp_generation/cpu.jsonl", 3),  # ladder-bench rows (bench_schema.read_bench)
    ("docs/results/gpu/h200_2026-11-28.jsonl", 4),  # gpu_check's rows
    ("docs/results/study_small/lr/model.residual=parallel,train.optimizer.lr=2e-3/metrics.jsonl", 3),  # a run's
    ("docs/results/study_small/unigram.json", 5),  # a builder's own JSON file, one line of it cut
]


@pytest.mark.parametrize("data,line", CUT_FILES, ids=[Path(d).parent.name for d, _ in CUT_FILES])
def test_a_results_file_with_a_line_cut_short_is_named_with_its_line_and_nothing_written(tmp_path, capsys, data, line):
    root = _copy_docs(tmp_path)
    lines = (root / data).read_text().splitlines(keepends=True)
    cut = lines[line - 1].rstrip("\n")
    lines[line - 1] = cut[: len(cut) // 2] + "\n"
    (root / data).write_text("".join(lines))
    before = {doc: (root / doc).read_text() for doc in DOCS}
    for action in ("--check", "--write"):
        capsys.readouterr()
        assert main([action, "--root", str(root)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"python -m tools.docs_tables: error: {root / data}:{line}: "), err
        assert "not JSON" in err[0] or "not a JSON line" in err[0], err
    assert {doc: (root / doc).read_text() for doc in DOCS} == before
