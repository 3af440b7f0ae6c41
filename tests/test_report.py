"""ladder-report on fabricated runs: the table's numbers and the plots."""

import json
import math

import pytest
from fabricate import fabricate_run
from PIL import Image

from ladder_train.cli import ladder_report as main
from ladder_train.report import write_report
from ladder_train.report.link_sweep import predicted_decode_ms


def fabricate_bench(path):
    rows = []
    for layout, tps in (("standard", 100.0), ("parallel", 120.0), ("ladder", 150.0)):
        for batch in (1, 4):
            rows.append(
                {
                    "layout": layout,
                    "batch": batch,
                    "tokens_per_s": tps * batch,
                    "decode_ms_per_token": 1000 / tps,
                    "tp": 2,
                    "device": "cpu (2 cores)",
                    "emulated_link_latency_ms": 5.0,
                    "none": {"tokens_per_s": 180.0 * batch},
                    "speedup_vs_standard": tps / 100 * 0.9,  # prefill dilutes the whole-generation speedup
                    "decode_speedup_vs_standard": tps / 100,
                    "comm_share": 0.4,
                    "module_ms": {"attention": 2.0, "mlp": 2.5},
                    "ttft_ms": {"p50": 40.0 / batch, "p90": 44.0 / batch},
                    "tpot_ms": {"p50": 1000 / tps, "p90": 1100 / tps},
                    "tokens_per_s_runs": {"samples": [tps * batch * f for f in (0.95, 1.0, 1.02)]},
                }
            )
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_report_table_and_plots(tmp_path):
    standard = fabricate_run(tmp_path, "repro_standard", "standard", 2.0)
    ladder = fabricate_run(tmp_path, "repro_ladder", "ladder", 2.2)
    bench = fabricate_bench(tmp_path / "bench.jsonl")
    report = write_report([standard, ladder], tmp_path / "out", [bench])
    text = report.read_text()
    table = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines()
        if line.startswith("| ")
    }
    # mean of the last five train losses: base + 10 - (6..10) -> base + 2
    assert table["train loss (mean of last 5 logs)"] == ["4.0000", "4.2000", "+5.00 %"]
    assert table["validation loss (final)"] == ["3.0000", "3.2000", "+6.67 %"]
    assert table["validation perplexity"][:2] == [f"{math.exp(3.0):.2f}", f"{math.exp(3.2):.2f}"]
    assert table["arc_easy_local (acc_norm)"][:2] == ["0.2700", "0.2720"]
    assert table["piqa_local (acc)"][:2] == ["0.5500", "0.5500"]
    assert table["training tokens/s (median)"][:2] == ["506", "506"]
    # the last ladder row (batch 4): whole-generation speedup beside the decode-step speedup
    assert table["ladder"][:7] == ["4", "600.0", "6.67", "10.00 (11.00)", "6.67 (7.33)", "1.350×", "1.500×"]
    # runs of +-5 %: parallel's 1.2x (114-122.4 against 95-102 tokens/s at batch 1) clears standard's spread
    assert "Within the spread" not in text
    assert "emulated" in text
    # X = 5 ms against modules of 2.0 / 2.5 ms: the report says only one module can hide each all-reduce
    assert "Emulated X = 5 ms is 2.5x the shorter module's decode compute (attention 2.00 ms, mlp 2.50 ms)" in text
    for name in ("loss.png", "lr.png", "tp_bench.png"):
        assert f"]({name})" in text
        png = tmp_path / "out" / name
        assert png.stat().st_size > 10_000
        with Image.open(png) as image:
            assert image.format == "PNG" and image.size[0] >= 600 and image.size[1] >= 300


def test_report_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a run folder (missing metrics.jsonl)" in err
    assert not (tmp_path / "out").exists()


def test_report_names_a_broken_metrics_line(tmp_path):
    run = fabricate_run(tmp_path, "r", "ladder", 1.0)
    with (run / "metrics.jsonl").open("a") as f:
        f.write("{not json\n")
    with pytest.raises(Exception, match=r"metrics.jsonl:13: not a JSON line"):
        write_report([run], tmp_path / "out")


def sweep_row(layout, latency_ms, decode_ms, tokens_per_s):
    args = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=64, residual=layout)
    return {
        "shape": "L2-d32-h4-f64-v64",
        "model_args": {**args, "ladder_layers": None},
        "layout": layout,
        "batch": 8,
        "tp": 2,
        "emulated_link_latency_ms": latency_ms,
        "decode_ms_per_token": decode_ms,
        "tokens_per_s": tokens_per_s,
        "module_ms": {"attention": 10.0, "mlp": 10.0},
        "none": {"decode_ms_per_token": 42.0},  # 2 layers x (10 + 10) + 2 ms of head
    }


def test_link_sweep_prediction_is_the_serialised_timeline():
    """Modules of 10 ms, X = 40 ms, 2 layers, 2 ms of head. Standard: 4 x (10 + 40) + 2 = 202. Parallel:
    2 x (20 + 40) + 2 = 122. Ladder: A0 0-10 (link 10-50), M0 10-20 (link queued 50-90), A1 after a0's wait
    50-60 (link 90-130), M1 after m0's wait 90-100 (link 130-170), both waits then the head: 172."""
    assert predicted_decode_ms(sweep_row("standard", 0, 1, 1), 40.0) == pytest.approx(202.0)
    assert predicted_decode_ms(sweep_row("parallel", 0, 1, 1), 40.0) == pytest.approx(122.0)
    assert predicted_decode_ms(sweep_row("ladder", 0, 1, 1), 40.0) == pytest.approx(172.0)
    # below a module's compute every ladder all-reduce hides but the last: 4 x 10 + 5 + 2
    assert predicted_decode_ms(sweep_row("ladder", 0, 1, 1), 5.0) == pytest.approx(47.0)


def test_report_of_a_link_sweep(tmp_path):
    rows = []
    for latency, measured in (
        (5.0, {"standard": 62.0, "parallel": 52.0, "ladder": 48.0}),
        (40.0, {"standard": 205.0, "parallel": 125.0, "ladder": 176.0}),
    ):
        for layout, decode_ms in measured.items():
            row = sweep_row(layout, latency, decode_ms, 1000 / decode_ms)
            row["decode_speedup_vs_standard"] = measured["standard"] / decode_ms
            row["speedup_vs_standard"] = row["decode_speedup_vs_standard"] * 0.95
            rows.append(row)
    bench = tmp_path / "sweep.jsonl"
    bench.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = fabricate_run(tmp_path, "r", "ladder", 1.0)
    text = write_report([run], tmp_path / "out", [bench]).read_text()
    lines = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| 40 ")]
    ladder = next(line for line in lines if line[2] == "ladder")
    # X / module = 4; measured 205 / 176 = 1.16x; predicted 202 / 172 = 1.17x
    assert ladder[:7] == ["40", "4.00", "ladder", "176.0", "1.11×", "1.16×", "1.17×"]
    assert "](link_sweep.png)" in text and (tmp_path / "out" / "link_sweep.png").stat().st_size > 10_000


def test_the_report_says_when_the_runs_spread_covers_a_difference(tmp_path):
    from ladder_train.report.tp_bench import spread_notes

    rows = [
        {"layout": "standard", "batch": 1, "tokens_per_s_runs": {"samples": [100.0, 90.0, 110.0]}},
        {"layout": "ladder", "batch": 1, "tokens_per_s_runs": {"samples": [105.0, 108.0, 111.0]}},
        {"layout": "parallel", "batch": 1, "tokens_per_s_runs": {"samples": [111.0, 115.0, 120.0]}},
    ]
    (note, _) = spread_notes(rows)
    assert "the tokens/s of ladder at batch 1 overlap standard's" in note and "parallel" not in note
    assert spread_notes(rows[::2]) == []


def test_report_of_benchmarks_alone(tmp_path, capsys):
    bench = fabricate_bench(tmp_path / "bench.jsonl")
    assert main(["--bench", str(bench), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Tensor-parallel generation" in text and "## Results" not in text
    with pytest.raises(SystemExit):  # argparse's usage error (exit 2)
        main(["--out", str(tmp_path / "none")])
    assert "give run folders, --bench files, or both" in capsys.readouterr().err


def test_report_groups_seeds_and_gives_mean_sd_and_differences(tmp_path):
    """Three seeds per layout (final validation loss = base + 1) and one ladder run at another lr."""
    runs = [
        fabricate_run(tmp_path, f"{layout}_s{seed}", layout, base, [f"run.seed={seed}"])
        for layout, bases in (("standard", (2.0, 2.3, 2.6)), ("ladder", (1.9, 2.1, 2.2)))
        for seed, base in enumerate(bases)
    ]
    runs.append(fabricate_run(tmp_path, "ladder_lr", "ladder", 2.5, ["run.seed=0", "train.optimizer.lr=0.001"]))
    text = write_report(runs, tmp_path / "out").read_text()
    section = text.split("## Seeds")[1]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| group")
    }
    # standard: 3.0, 3.3, 3.6 -> mean 3.3, sd 0.3; train loss (mean of last five) = base + 2
    assert rows["standard"][:3] == ["3 (0, 1, 2)", "3.3000 ± 0.3000", "4.3000 ± 0.3000"]
    (ladder_label,) = [label for label in rows if label.startswith("ladder") and "lr=0.001" not in label]
    # ladder: 2.9, 3.1, 3.2 -> mean 3.0667, sd sqrt(0.07/3) = 0.1528; difference -0.2333 with
    # s.e. sqrt(0.09/3 + 0.02333/3) = 0.1944; per-seed differences -0.1, -0.2, -0.4 -> -0.2333 ± 0.1528
    assert rows[ladder_label] == [
        "3 (0, 1, 2)",
        "3.0667 ± 0.1528",
        "4.0667 ± 0.1528",
        "-0.2333 ± 0.1944",
        "-0.2333 ± 0.1528",
    ]
    # the lr run is its own group of one, named by the key that differs; no sd and no pairing for it
    (lr_label,) = [label for label in rows if "train.optimizer.lr=0.001" in label]
    assert rows[lr_label] == ["1 (0)", "3.5000", "4.5000", "+0.2000", "—"]
    png = tmp_path / "out" / "loss_seeds.png"
    assert "](loss_seeds.png)" in section and png.stat().st_size > 10_000


def test_a_studys_loss_and_lr_plots_draw_one_legend_entry_per_group_not_per_seed(tmp_path):
    """Seeds of one configuration share a colour and one legend entry (a 27-run study's legend was 54 lines that
    covered the plot); a run alone keeps its own label; the schedule is drawn once per group."""
    from ladder_train.plots import new_figure
    from ladder_train.report.runs import read_run
    from ladder_train.report.tables import draw_loss, draw_lr
    from ladder_train.study import group_runs

    paths = [
        fabricate_run(tmp_path, f"{layout}_s{seed}", layout, 2.0 + seed / 10, [f"run.seed={seed}"])
        for layout in ("standard", "ladder")
        for seed in range(3)
    ]
    paths.append(fabricate_run(tmp_path, "ladder_lr", "ladder", 2.5, ["run.seed=0", "train.optimizer.lr=0.001"]))
    groups = group_runs([read_run(path) for path in paths])
    fig, ax = new_figure(8, 5)
    draw_loss(ax, groups)
    labels = ax.get_legend_handles_labels()[1]
    # the ladder's seeds are told from the lone ladder run by the key in which they differ
    expected = ["standard, 3 runs", "ladder (train.optimizer.lr=0.0003), 3 runs", "ladder_lr", "validation (dashed)"]
    assert labels == expected
    assert len(ax.lines) == 7 * 2 + 1  # every run's training and validation curves, and the style's key
    colours = {line.get_color() for line in ax.lines[:6]}  # standard's three runs, train and validation
    assert colours == {"C0"}
    fig, ax = new_figure(8, 3.5)
    draw_lr(ax, groups)
    assert [line.get_label() for line in ax.lines] == labels[:3]
    assert list(ax.lines[0].get_ydata()) == [1e-3 * step / 10 for step in range(1, 11)]
    # a sweep of 15 configurations: past the default cycle's 10 colours none repeats
    from ladder_train.plots import series_colour

    assert series_colour(2, 10) == "C2" and len({str(series_colour(i, 15)) for i in range(15)}) == 15


def test_the_loss_unit_is_nats_per_byte_only_where_every_run_reads_bytes(tmp_path):
    from ladder_train.report.runs import loss_unit, read_run

    byte = [read_run(fabricate_run(tmp_path, f"b{seed}", "ladder", 2.0, ["data.tokenizer=byte"])) for seed in range(2)]
    hub = read_run(fabricate_run(tmp_path, "hub", "ladder", 2.0))
    assert hub.config.data.tokenizer == "bigcode/starcoder"
    assert (loss_unit(byte), loss_unit([hub]), loss_unit([*byte, hub]), loss_unit([])) == (
        "nats/byte",
        "nats/token",
        "nats/token",
        "nats/token",
    )


def test_runs_named_one_by_one_keep_a_legend_entry_each_and_a_studys_seeds_share_one(tmp_path, monkeypatch):
    """Two seeds of one configuration: named as two run folders each is its own line (the reader chose them);
    given as their study folder they are one group."""
    import ladder_train.report as report

    study = tmp_path / "study"
    study.mkdir()
    paths = [fabricate_run(study, f"std_s{seed}", "standard", 2.0, [f"run.seed={seed}"]) for seed in (0, 1)]
    drawn = []
    monkeypatch.setattr(report, "plot_loss", lambda groups, out: drawn.append(groups) or out / "loss.png")
    write_report(paths, tmp_path / "named")
    write_report([study], tmp_path / "study_out")
    assert [[(g.label, len(g.runs)) for g in groups] for groups in drawn] == [
        [("std_s0 (standard)", 1), ("std_s1 (standard)", 1)],
        [("standard", 2)],
    ]
