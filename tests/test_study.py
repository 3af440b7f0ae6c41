"""ladder-train study: the grid, a study that is killed and resumed, and the statistics
that compare its layouts (against values computed by hand)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_errors import someones_folder, untouched
from fabricate import fabricate_run

from ladder_train.cli import main as cli_main
from ladder_train.config import ConfigError, load_config, save_config
from ladder_train.errors import Preempted
from ladder_train.study import runner
from ladder_train.study.grid import NAME_BYTES, folder_name, grid, split_values
from ladder_train.study.stats import best_rate, half_width, holm, paired_difference, pairs_for_power, power

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(REPO / "recipes" / "smoke.yaml")


# -- the grid --------------------------------------------------------------------------------------------


def test_a_comma_list_sweeps_and_a_bracketed_list_is_one_value():
    assert split_values("train.optimizer.lr=2e-3,4e-3") == ("train.optimizer.lr", ["2e-3", "4e-3"])
    assert split_values("train.optimizer.betas=[0.9,0.95]") == ("train.optimizer.betas", ["[0.9,0.95]"])
    assert split_values("a=[1,2],[3,4]") == ("a", ["[1,2]", "[3,4]"])
    assert split_values("run.seed=0") == ("run.seed", ["0"])


def test_the_grid_is_the_product_first_key_outermost_and_names_each_point_by_its_settings():
    points = grid(["model.residual=standard,ladder", "train.optimizer.lr=1e-3,2e-3,4e-3", "run.dir=runs/s"])
    assert len(points) == 6 and [p.index for p in points] == list(range(6))
    assert points[0].name == "model.residual=standard,train.optimizer.lr=1e-3"
    assert points[1].name == "model.residual=standard,train.optimizer.lr=2e-3"
    assert points[5].name == "model.residual=ladder,train.optimizer.lr=4e-3"
    overrides = points[4].run_overrides(Path("runs/s"))
    assert overrides == [
        "model.residual=ladder",
        "train.optimizer.lr=2e-3",
        "run.dir=runs/s/model.residual=ladder,train.optimizer.lr=2e-3",
        "run.name=s/model.residual=ladder,train.optimizer.lr=2e-3",
    ]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["a=1", "a=2"], "given twice"),
        (["run.dir=x,y"], "cannot be swept"),
        (["run.name=a"], "set per point"),
        (["lr"], "not of the form"),
        (["a=[1,2"], "unbalanced"),
        (["a=1,,2"], "empty value"),
    ],
)
def test_bad_sweeps_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        grid(overrides)


def test_a_point_whose_settings_cannot_be_a_folder_name_gets_a_readable_name_and_a_hash_of_its_settings():
    # two sources that read the same with "/" as "_" (they once shared a folder and one reused the other's run)
    first, second = grid(["data.source=A/a/b,A/a_b", "run.seed=0", "run.dir=runs/s"])
    assert first.name == "data.source=A_a_b,run.seed=0~8c0a46d5"  # stable: studies resume by folder name
    assert second.name == "data.source=A_a_b,run.seed=0~21359bbb"
    # settings that can be a name as written keep it: the folders of existing studies are found again
    assert grid(["data.source=A_a_b", "run.seed=0"])[0].name == "data.source=A_a_b,run.seed=0"
    assert folder_name(("model.residual=standard", "train.optimizer.lr=4e-3", "run.seed=0")) == (
        "model.residual=standard,train.optimizer.lr=4e-3,run.seed=0"
    )
    assert folder_name(("a=x\ny",)) != folder_name(("a=x_y",))  # a control character is replaced too


def test_a_point_name_longer_than_a_file_name_may_be_is_cut_and_keeps_its_hash():
    fits = "x=" + "a" * (NAME_BYTES - 2)
    assert folder_name((fits,)) == fits
    long_ascii, long_utf8 = folder_name((fits + "a",)), folder_name(("data.source=" + "é" * 300,))
    assert len(long_ascii.encode()) == len(long_utf8.encode()) == NAME_BYTES
    assert long_ascii.startswith("x=aaa") and long_utf8.startswith("data.source=ééé")  # no "é" is cut in half
    assert folder_name(("x=" + "a" * 300,)) != folder_name(("x=" + "a" * 301,))


def own_config(study: Path, overrides: list[str], index: int, recipe: str = SMOKE) -> Path:
    """Point ``index``'s folder with the config.yaml its trainer writes as it starts (the study's run there)."""
    point = grid(overrides)[index]
    save_config(load_config(recipe, point.run_overrides(study)), point.run_dir(study) / "config.yaml")
    return point.run_dir(study)


def test_dry_run_lists_the_points_their_state_and_the_array_line(tmp_path, capsys):
    study = tmp_path / "s"
    argv = ["study", "--config", SMOKE, "model.residual=standard,parallel,ladder", "run.seed=0,1", f"run.dir={study}"]
    own_config(study, argv[3:], 3)
    (study / "model.residual=parallel,run.seed=1" / "summary.json").write_text('{"finished": true}')
    own_config(study, argv[3:], 4)
    (study / "model.residual=ladder,run.seed=0" / "checkpoints" / "step-40").mkdir(parents=True)
    assert cli_main([*argv, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"study {study}: 6 points of {SMOKE}"
    assert lines[1].split() == ["0", "model.residual=standard,run.seed=0", "[new]"]
    assert lines[4].split() == ["3", "model.residual=parallel,run.seed=1", "[finished]"]
    assert lines[5].split()[1:] == ["model.residual=ladder,run.seed=0", "[resumes", "at", "step", "40]"]
    assert lines[7].startswith(f"Slurm: sbatch --array=0-5 slurm/study.sh {SMOKE} ")
    assert not any((study / name).exists() for name in ("model.residual=standard,run.seed=0",))  # nothing written


def test_a_bad_point_is_refused_before_any_run_starts(tmp_path, capsys):
    argv = ["study", "--config", SMOKE, "model.n_layers=2,0", f"run.dir={tmp_path / 's'}"]
    assert cli_main(argv) == 2
    assert "model.n_layers" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


# -- running, killing and resuming -----------------------------------------------------------------------


def _study_cmd(study: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ladder_train.cli",
        "study",
        "--config",
        SMOKE,
        "model.residual=standard,ladder",
        "train.max_steps=20",
        "train.log_every=10",
        "checkpoint.every=10",
        f"run.dir={study}",
    ]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child's death signal is Linux's prctl")
def test_a_killed_study_resumes_without_redoing_finished_runs(tmp_path):
    study = tmp_path / "s"
    fixed = "train.max_steps=20,train.log_every=10,checkpoint.every=10"
    first, second = study / f"model.residual=standard,{fixed}", study / f"model.residual=ladder,{fixed}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(_study_cmd(study), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 600  # generous: a loaded 2-core machine
        while not list((second / "checkpoints").glob("step-*")) and time.time() < deadline:
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)  # the study dies at once; its trainer gets SIGTERM and checkpoints
        proc.wait(timeout=30)
    assert runner.finished(first), "the first point should have finished before the second checkpoints"
    finished_metrics = (first / "metrics.jsonl").read_text()
    trainer_log = second / "train.log"
    deadline = time.time() + 60
    while "preempted" not in trainer_log.read_text() and time.time() < deadline:
        time.sleep(0.2)
    assert "preempted" in trainer_log.read_text(), "the orphaned trainer must save and stop, not train on"
    # after its last line the trainer still closes its loader workers and process group: on a loaded machine that
    # takes seconds, so wait for it to end rather than guess how long
    deadline = time.time() + 60
    while _study_processes(study) and time.time() < deadline:
        time.sleep(0.2)
    assert not _study_processes(study)
    assert json.loads((second / "summary.json").read_text())["finished"] is False  # written as the run started
    assert not runner.finished(second)

    done = subprocess.run(_study_cmd(study), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"study: [0] model.residual=standard,{fixed}: finished, skipped" in done.stdout
    assert f"study: [1] model.residual=ladder,{fixed}: resumes at step" in done.stdout
    assert "resuming from" in done.stdout
    assert (first / "metrics.jsonl").read_text() == finished_metrics  # not trained again
    assert json.loads((second / "summary.json").read_text())["step"] == 20


class _TrainerStandIn:
    """A trainer that runs until the study passes a stop on: ``sig`` reaches the study while it waits for this
    trainer; then it exits 75 (it saved a checkpoint) or, ``finishing``, 0 with its run finished."""

    def __init__(self, sig: signal.Signals, run_dir: Path, finishing: bool):
        self.sig, self.run_dir, self.finishing = sig, run_dir, finishing
        self.received: list[int] = []
        self.returncode = None

    def wait(self, timeout=None):
        if not self.received:
            os.kill(os.getpid(), self.sig)  # its handler runs in this thread before the next line
            assert self.received, "the study should have passed the stop to its trainer"
        if self.finishing:
            (self.run_dir / "summary.json").write_text('{"finished": true}')
        self.returncode = 0 if self.finishing else 75
        return self.returncode

    def poll(self):
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.received.append(sig)


@pytest.mark.parametrize("finishing", [False, True], ids=["saves-and-stops", "finishes-its-point"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_study_stops_its_trainer_and_no_further_point_starts(tmp_path, monkeypatch, sig, finishing):
    study = runner.Study(SMOKE, ["model.residual=standard,ladder", f"run.dir={tmp_path / 's'}"])
    first, second = (point.run_dir(study.dir) for point in study.points)
    trainers = []

    def start(cmd, log, env):
        trainers.append(_TrainerStandIn(sig, first, finishing))
        return trainers[-1]

    monkeypatch.setattr(runner, "_start_trainer", start)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Preempted, match=f"{sig.name}"):
        study.run_all()
    # SIGTERM, not SIGINT: a trainer that already has the terminal's Ctrl-C would take a second SIGINT as "stop now"
    assert len(trainers) == 1 and trainers[0].received == [signal.SIGTERM]
    assert not second.exists()
    assert {s: signal.getsignal(s) for s in handlers} == handlers


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child's death signal is Linux's prctl")
def test_sigint_to_the_study_process_saves_its_trainer_and_exits_75(tmp_path):
    study = tmp_path / "s"
    first = study / "model.residual=standard,train.max_steps=400,train.log_every=1"
    cmd = [*_study_cmd(study)[:6], "model.residual=standard,ladder", "train.max_steps=400", "train.log_every=1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(tmp_path / "study.err", "w") as err:
        proc = subprocess.Popen([*cmd, f"run.dir={study}"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.time() + 300  # generous: a loaded 2-core machine
        while "step      1 |" not in _text(first / "train.log") and time.time() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # to the study's pid only, not its process group
        assert proc.wait(timeout=120) == 75, (tmp_path / "study.err").read_text()[-2000:]
    finally:
        proc.kill()
        proc.wait()
    assert not _study_processes(study)  # the study waited for its trainer
    assert "stopped by SIGINT" in (tmp_path / "study.err").read_text()
    assert list((first / "checkpoints").glob("step-*")) and not runner.finished(first)
    assert [p.name for p in study.iterdir()] == [first.name]  # the second point never started


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _study_processes(study: Path) -> list[str]:
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and str(study) in _cmdline(pid)]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


# -- the statistics ----------------------------------------------------------------------------------------


def test_paired_t_interval_against_hand_computed_values():
    # differences 1, 2, 3: mean 2, sd 1, s.e. 1/sqrt(3); t(0.975, 2) = 4.302653 (with 2 degrees of freedom the t
    # distribution has the closed form F(t) = 1/2 + t / (2 sqrt(2 + t^2)))
    diff = paired_difference([3.0, 4.0, 5.0], [2.0, 2.0, 2.0])
    assert (diff.n, diff.mean, diff.sd) == (3, 2.0, 1.0)
    assert diff.half_width == pytest.approx(4.302653 / 3**0.5, rel=1e-6)
    assert (diff.low, diff.high) == (pytest.approx(-0.484138, abs=1e-6), pytest.approx(4.484138, abs=1e-6))
    assert not diff.excludes_zero
    # t = 2 sqrt(3) = 3.4641: p = 2 (1 - F(t)) = 1 - t / sqrt(14) = 0.074180
    assert diff.p_value == pytest.approx(1 - 12**0.5 / 14**0.5, rel=1e-6)


def test_a_consistent_difference_excludes_zero():
    diff = paired_difference([2.10, 2.11, 2.12, 2.10], [2.00, 2.02, 2.01, 2.00])
    # differences 0.10, 0.09, 0.11, 0.10: mean 0.1, sd sqrt(0.0002/3); t(0.975, 3) = 3.182446
    assert diff.mean == pytest.approx(0.1)
    assert diff.half_width == pytest.approx(3.182446 * (0.0002 / 3) ** 0.5 / 2, rel=1e-5)
    assert diff.excludes_zero and diff.low > 0


def test_pairs_must_match():
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="at least two"):
        paired_difference([1.0], [1.0])


def test_best_rate_is_the_lowest_loss_and_says_when_it_is_on_the_edge():
    inside = best_rate({2e-3: 2.00, 4e-3: 1.90, 8e-3: 1.95})
    assert (inside.best, inside.loss, inside.at_edge) == (4e-3, 1.90, False)
    edge = best_rate({2e-3: 2.00, 4e-3: 1.90, 8e-3: 1.85})
    assert (edge.best, edge.at_edge) == (8e-3, True)
    assert best_rate({1e-3: 1.0, 2e-3: 1.0}).best == 1e-3  # a tie goes to the smaller rate


# -- the study's report ------------------------------------------------------------------------------------

SWEEP = ["train.schedule.total_steps=10", "train.schedule.warmup_steps=1"]  # the sweep's shorter horizon


def _eval(arc: float, bpb: float) -> dict:
    return {
        "arc_easy_local": {"acc": arc, "acc_stderr": 0.02},
        "piqa_local": {"acc": 0.51, "acc_stderr": 0.02},  # within two standard errors of chance (0.5): left out
        "wikitext2_local": {"bits_per_byte": bpb, "word_perplexity": 2**bpb},
    }


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    """A sweep of three rates per layout (one seed), then three seeds per layout at its best rate and a
    smaller standard model as the positive control. Final validation loss = base + 1. Made once for the tests
    that read it (none writes into it)."""
    root = tmp_path_factory.mktemp("study")
    sweep = {"standard": (2.0, 1.8, 1.9), "ladder": (2.1, 1.9, 1.7)}  # best: 2e-3 (inside), 4e-3 (on the edge)
    for layout, bases in sweep.items():
        for lr, base in zip((1e-3, 2e-3, 4e-3), bases, strict=True):
            # the sweep's own eval figures would pick other rates: the choice must not look at them
            summary = _eval(0.9 if lr == 1e-3 else 0.3, 0.1)
            fabricate_run(root, f"sweep_{layout}_{lr:g}", layout, base, [*SWEEP, f"train.optimizer.lr={lr}"], summary)
    seeds = {
        ("standard", 2e-3, "model.n_layers=2"): (2.0, 2.3, 2.6),
        ("ladder", 4e-3, "model.n_layers=2"): (1.9, 2.1, 2.2),
        ("standard", 2e-3, "model.n_layers=1"): (2.5, 2.85, 3.1),
    }
    for (layout, lr, layers), bases in seeds.items():
        for seed, base in enumerate(bases):
            overrides = [f"train.optimizer.lr={lr}", layers, f"run.seed={seed}"]
            summary = _eval(0.40 + 0.01 * seed, 1.5 + base / 10)
            fabricate_run(root, f"{layout}_{layers[-1]}_s{seed}", layout, base, overrides, summary)
    return root


def _table(text: str, heading: str) -> list[list[str]]:
    section = text.split(f"## {heading}\n")[1].split("\n## ")[0]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in section.splitlines() if line.startswith("| ")][2:]


def test_study_report_chooses_each_layouts_rate_on_the_sweep_and_pairs_the_seeds(study_dir, tmp_path):
    from ladder_train.report import write_report

    text = write_report([study_dir], tmp_path / "out", resolution=0.1).read_text()
    # a study's runs come in name order, which makes none of them a baseline: one row per run, no "vs" column
    results = _table(text, "Results")
    assert len(results) == 15 and " vs " not in text.split("## Results\n")[1].split("\n## ")[0]
    assert {row[0]: row[2] for row in results}["sweep_standard_0.002"] == "2.8000"  # validation loss, base + 1
    sweep = {row[0]: row for row in _table(text, "Learning-rate sweep")}
    assert sweep["standard"][1:] == ["10", "3.0000", "2.8000", "2.9000", "0.002"]
    assert sweep["ladder"][2:5] == ["3.1000", "2.9000", "2.7000"] and sweep["ladder"][5].startswith(
        "0.004 (on the sweep's edge"
    )

    rows = {(row[0], row[1]): row[2:] for row in _table(text, "Paired comparison")}
    loss = "validation loss (nats/token)"
    base, control = "standard (model.n_layers=2)", "standard (model.n_layers=1)"
    assert rows[(loss, base)] == ["0.002", "3", "3.3000 ± 0.3000", *["—"] * 6, "baseline"]
    # ladder - standard per seed: -0.1, -0.2, -0.4 -> mean -0.2333, sd 0.1528; t(0.975, 2) = 4.302653 ->
    # half-width 4.302653 x 0.1528 / sqrt(3) = 0.3795; t = 2.6458, p = 1 - t / sqrt(2 + t^2) = 0.118
    assert rows[(loss, "ladder")][:6] == ["0.004", "3", "3.0667 ± 0.1528", "-0.2333", "[-0.6128, +0.1461]", "0.118"]
    assert rows[(loss, "ladder")][-1] == (
        "cannot tell apart (the interval holds 0); half-width 0.3795 ≥ 0.1: too wide to resolve a difference of that size"
    )
    # the control: +0.5, +0.55, +0.5 -> mean 0.5167, sd 0.0289, half-width 0.0717, t = 31.0, p = 0.001: detected
    assert rows[(loss, control)][3:6] == ["+0.5167", "[+0.4450, +0.5884]", "0.001"]
    assert rows[(loss, control)][-1] == "worse than the baseline"
    # Holm never lowers a p-value, and the power columns are there at the report's resolution
    assert float(rows[(loss, "ladder")][6]) >= 0.118 and rows[(loss, control)][7].endswith("%")
    # eval: ARC above chance is compared, PIQA at chance is not; bits per byte follows the loss (base / 10)
    assert any(metric == "arc_easy_local acc" for metric, _ in rows)
    assert not any(metric.startswith("piqa_local") for metric, _ in rows)
    assert rows[("wikitext2_local bits_per_byte", "ladder")][3] == "-0.0233"
    assert (tmp_path / "out" / "lr_sweep.png").stat().st_size > 10_000
    assert "](paired_validation.png)" in text and (tmp_path / "out" / "paired_validation.png").stat().st_size > 10_000


def test_paired_validation_curves_hold_the_paired_interval_at_every_validation(study_dir):
    from ladder_train.report import find_runs, read_run
    from ladder_train.report.study import paired_validation_curves
    from ladder_train.study import analysis, groups

    repeated = analysis.seeded(groups.group_runs([read_run(p) for p in find_runs([study_dir])]))
    seeded = groups.group_runs([run for group in repeated for run in group.runs])  # labelled among themselves
    base = analysis.default_baseline(seeded)
    curves = {curve.label: curve for curve in paired_validation_curves(seeded, base)}
    assert sorted(curves) == ["ladder", "standard (model.n_layers=1)"]
    # validation loss = base + 11 - step, so every step's per-seed difference is the bases': -0.1, -0.2, -0.4
    ladder = curves["ladder"]
    assert ladder.pairs == 3 and len(ladder.tokens) == len(base.runs[0].val) > 1
    assert all(m == pytest.approx(-0.2333, abs=1e-4) for m in ladder.means)
    assert all(
        lo == pytest.approx(-0.6128, abs=1e-4) and hi == pytest.approx(0.1461, abs=1e-4) for lo, hi in ladder.intervals
    )
    assert [round(d[-1], 4) for d in ladder.per_seed] == [-0.1, -0.2, -0.4]
    # two pairs give the mean and each pair, no band: t(0.975, 1) = 12.7 would draw one over the whole chart
    ladder_runs = next(group for group in seeded if group.label == "ladder").runs
    two = groups.Group(label="ladder", runs=[run for run in ladder_runs if run.seed < 2])
    (curve,) = paired_validation_curves([base, two], base)
    assert curve.pairs == 2 and curve.intervals is None
    assert all(m == pytest.approx(-0.15, abs=1e-4) for m in curve.means)


def test_study_report_takes_another_baseline_by_label_and_refuses_an_unknown_one(study_dir, tmp_path, capsys):
    from ladder_train.cli import ladder_report as report_main
    from ladder_train.report import write_report

    text = write_report([study_dir], tmp_path / "out", baseline="ladder").read_text()
    rows = {(row[0], row[1]): row[2:] for row in _table(text, "Paired comparison")}
    assert rows[("validation loss (nats/token)", "standard (model.n_layers=2)")][3] == "+0.2333"
    assert report_main([str(study_dir), "--out", str(tmp_path / "o2"), "--baseline", "nope"]) == 2
    assert "--baseline 'nope': no group of seeds has that label" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()  # refused before anything is written


def test_a_link_planted_at_a_points_folder_is_refused_before_its_trainer_starts(tmp_path, capsys):
    elsewhere = someones_folder(tmp_path)
    study = tmp_path / "s"
    study.mkdir()
    (study / "model.residual=standard").symlink_to(elsewhere)
    argv = ["study", "--config", SMOKE, "model.residual=standard,ladder", f"run.dir={study}"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"ladder-train: error: {study / 'model.residual=standard'} is a symbolic link; a folder of this project is "
        "never written through a link: remove it"
    )
    assert untouched(elsewhere)  # no trainer wrote into it
    assert not (study / "model.residual=ladder").exists()  # nor did the study go on to the next point


def test_collect_copies_the_finished_points_small_results_and_nothing_else(tmp_path, capsys):
    study = tmp_path / "s"
    argv = ["study", "--config", SMOKE, "model.residual=standard,ladder", f"run.dir={study}"]
    done, running = study / "model.residual=standard", study / "model.residual=ladder"
    for index, run in enumerate((done, running)):
        (run / "checkpoints" / "step-4").mkdir(parents=True)
        (run / "checkpoints" / "step-4" / "model.distcp").write_bytes(b"weights")
        own_config(study, argv[3:4], index)
        (run / "metrics.jsonl").write_text('{"step": 4, "loss": 1.0}\n')
    (done / "summary.json").write_text('{"finished": true, "step": 4}\n')
    (done / "eval").mkdir()
    (done / "eval" / "step-4.json").write_text('{"summary": {}}\n')
    assert cli_main([*argv, "--collect", str(tmp_path / "data")]) == 0
    assert capsys.readouterr().out.strip() == f"study {study}: 1 of 2 points finished, copied to {tmp_path / 'data'}"
    copied = sorted(p.relative_to(tmp_path / "data").as_posix() for p in (tmp_path / "data").rglob("*") if p.is_file())
    assert copied == [
        "model.residual=standard/config.yaml",
        "model.residual=standard/eval/step-4.json",
        "model.residual=standard/metrics.jsonl",
        "model.residual=standard/summary.json",
    ]


def test_holm_adjusts_the_smallest_p_most_and_keeps_the_order_monotone():
    # the study's four validation-loss comparisons: ladder, parallel, the 4- and 6-layer controls
    adjusted = holm([0.040, 0.134, 0.099, 0.573])
    # by hand: 4 x 0.040 = 0.160; 3 x 0.099 = 0.297; 2 x 0.134 = 0.268, raised to 0.297; 1 x 0.573
    assert adjusted == pytest.approx([0.160, 0.297, 0.297, 0.573])
    assert holm([0.9, 0.5]) == [1.0, 1.0]  # capped at 1, and never below an earlier adjusted value
    assert holm([]) == []


def test_the_half_width_n_pairs_project_is_the_t_intervals():
    # t(0.975, 10) = 2.2281: 2.2281 x 0.017 / sqrt(11) = 0.01142; t(0.975, 12) = 2.1788: x 0.017 / sqrt(13) = 0.01027;
    # t(0.95, 2) = 2.9200 (a 90 % interval): x 0.020 / sqrt(3) = 0.03372
    assert half_width(0.017, 11) == pytest.approx(0.011421, abs=1e-6)
    assert half_width(0.017, 13) == pytest.approx(0.010273, abs=1e-6)
    assert half_width(0.020, 3, confidence=0.90) == pytest.approx(0.033717, abs=1e-6)
    # the interval of measured pairs has the half-width their own sd projects
    measured = paired_difference([1.02, 1.04, 1.09], [1.0, 1.0, 1.0])
    assert measured.half_width == pytest.approx(half_width(measured.sd, 3)) == pytest.approx(0.08957, abs=1e-5)


def test_power_and_the_pairs_it_takes_match_the_noncentral_t():
    # 3 pairs, a true difference of 0.043 at pair sd 0.020: the centre is 0.043 / (0.020 / sqrt 3) = 3.72 on 2
    # degrees of freedom against t(0.975, 2) = 4.30, about half the mass beyond it
    assert power(0.043, 0.020, 3) == pytest.approx(0.517, abs=0.002)
    # many pairs and a large effect: the interval always excludes 0 (the far tail is 0, not nan)
    assert power(0.048, 0.017, 11) == pytest.approx(1.0, abs=1e-6)
    # no effect: the test rejects at its own level
    assert power(0.0, 0.02, 5) == pytest.approx(0.05, abs=1e-9)
    # 80 % power at a true 0.01: 25 / 34 / 52 pairs at sd 0.017 / 0.020 / 0.025, and the count is the fewest
    assert [pairs_for_power(0.01, sd) for sd in (0.017, 0.020, 0.025)] == [25, 34, 52]
    assert power(0.01, 0.017, 24) < 0.8 <= power(0.01, 0.017, 25)
    assert pairs_for_power(1e-6, 0.02, most=100) is None


def test_flat_config_gives_the_omegaconf_round_trips_keys_and_values_without_the_identity_keys():
    """flat_config walks the dataclasses (the docs' remakes call it ~180 times); it must give what the resolved
    OmegaConf container gives, lists as tuples and mappings as keys, for list and mapping fields too."""
    from ladder_train.config import load_config, to_dict
    from ladder_train.study.groups import flat_config

    cfg = load_config(
        REPO / "recipes/smoke.yaml",
        ["model.rope_scaling={rope_type: linear, factor: 2.0}", "run.seed=7", "wandb.mode=disabled"],
    )

    def walk(node, prefix, out):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.", out)
            else:
                out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
        return out

    flat = flat_config(cfg)
    expected = walk(to_dict(cfg), "", {})
    expected = {k: v for k, v in expected.items() if k not in ("run.seed", "run.name", "run.dir")}
    assert flat == {k: v for k, v in expected.items() if not k.startswith("wandb.")}
    assert flat["model.rope_scaling.factor"] == 2.0 and flat["model.rope_scaling.rope_type"] == "linear"
    assert flat["train.optimizer.betas"] == tuple(cfg.train.optimizer.betas)
    assert "run.seed" not in flat and not any(key.startswith("wandb.") for key in flat)
