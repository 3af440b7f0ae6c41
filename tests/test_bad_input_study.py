"""Bad input to ``ladder-train study``: points that would share a folder, a ``--point`` the grid does not have, a
``--collect`` folder inside the study or a link planted where it copies, a point folder of someone else's, a value
too long for a folder name. Each is one line, exit 2, before any run starts or any file is copied, or (a long name)
not an error at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_errors import assert_bad_input, run_cli

from ladder_train.config import load_config, save_config
from ladder_train.study.grid import NAME_BYTES, grid

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes" / "smoke.yaml")


def test_points_that_would_share_a_folder_are_refused_before_any_run(tmp_path, capsys, monkeypatch):
    study = tmp_path / "s"
    argv = ["study", "--config", SMOKE, "run.seed=0,1,0", "train.max_steps=1", f"run.dir={study}"]
    assert_bad_input(
        "ladder-train",
        argv,
        "points 0 and 2 would share the folder 'run.seed=0,train.max_steps=1'",
        capsys,
        monkeypatch,
    )
    assert not study.exists()


def test_a_value_written_as_another_points_folder_name_is_refused(tmp_path, capsys, monkeypatch):
    # "a/b" becomes "a_b" plus a hash; a value spelled as that very name is the one way left to collide
    taken = grid(["data.source=a/b"])[0].name.split("=", 1)[1]
    argv = ["study", "--config", SMOKE, f"data.source=a/b,{taken}", f"run.dir={tmp_path / 's'}", "--dry-run"]
    assert_bad_input("ladder-train", argv, f"would share the folder 'data.source={taken}'", capsys, monkeypatch)


@pytest.mark.parametrize("index", ["2", "-1"])
def test_a_point_the_grid_does_not_have_is_refused(tmp_path, capsys, monkeypatch, index):
    argv = ["study", "--config", SMOKE, "run.seed=0,1", f"run.dir={tmp_path / 's'}", "--point", index]
    assert_bad_input("ladder-train", argv, f"--point {index}: study {tmp_path / 's'} has 2 points", capsys, monkeypatch)


@pytest.mark.parametrize("inside", ["", "results/latest"], ids=["the-study-folder", "a-folder-inside-it"])
def test_collect_into_the_study_itself_is_refused(tmp_path, capsys, monkeypatch, inside):
    study = tmp_path / "s"
    finished = study / "run.seed=0"
    finished.mkdir(parents=True)
    for name, text in (("config.yaml", "run: {}\n"), ("metrics.jsonl", "{}\n"), ("summary.json", '{"finished": true}')):
        (finished / name).write_text(text)
    dest = study / inside
    argv = ["study", "--config", SMOKE, "run.seed=0", f"run.dir={study}", "--collect", str(dest)]
    assert_bad_input("ladder-train", argv, f"--collect {dest}: it is inside the study's folder", capsys, monkeypatch)
    assert sorted(p.name for p in study.rglob("*")) == ["config.yaml", "metrics.jsonl", "run.seed=0", "summary.json"]


def finished_study(tmp_path: Path, recipe: str = SMOKE) -> tuple[Path, list[str]]:
    """A study of two finished points (their small results only): (its folder, its argv without --collect)."""
    study = tmp_path / "s"
    for point in grid(["run.seed=0,1"]):
        run = point.run_dir(study)
        (run / "eval").mkdir(parents=True)
        save_config(load_config(recipe, point.run_overrides(study)), run / "config.yaml")  # what its trainer wrote
        for name, text in (("metrics.jsonl", "{}\n"), ("summary.json", '{"finished": 1}')):
            (run / name).write_text(text)
        (run / "eval" / "step-1.json").write_text("{}")
    return study, ["study", "--config", recipe, "run.seed=0,1", f"run.dir={study}"]


def tree(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: a file's bytes, a link's target."""
    return {
        str(p.relative_to(folder)): str(p.readlink()) if p.is_symlink() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


@pytest.mark.parametrize("planted", ["metrics.jsonl", "eval/step-1.json", "eval", ""], ids=lambda p: p or "point")
def test_a_link_planted_where_collect_copies_is_refused_and_its_target_is_untouched(
    tmp_path, capsys, monkeypatch, planted
):
    study, argv = finished_study(tmp_path)
    victim = tmp_path / "victim"  # a folder where a folder is planted, else a file
    if planted in ("eval", ""):
        victim.mkdir()
        (victim / "theirs.txt").write_text("mine")
    else:
        victim.write_bytes(b"someone's file\n")
    dest = tmp_path / "dest"
    link = dest / "run.seed=1" / planted if planted else dest / "run.seed=1"
    link.parent.mkdir(parents=True)
    link.symlink_to(victim)  # ln -s ~/victim DEST/POINT/metrics.jsonl
    before, theirs = tree(dest), tree(victim) if victim.is_dir() else victim.read_bytes()
    named = f"ladder-train: error: {link} is a symbolic link; "
    for flags in ([], ["--overwrite"]):
        assert_bad_input("ladder-train", [*argv, "--collect", str(dest), *flags], named, capsys, monkeypatch)
    assert tree(dest) == before  # refused before any copy, the other point's too
    assert (tree(victim) if victim.is_dir() else victim.read_bytes()) == theirs


def test_collect_into_a_point_folder_that_holds_other_files_needs_overwrite_and_keeps_them(
    tmp_path, capsys, monkeypatch
):
    study, argv = finished_study(tmp_path)
    dest = tmp_path / "dest"
    (dest / "run.seed=1").mkdir(parents=True)
    (dest / "run.seed=1" / "notes.md").write_text("mine")
    (dest / "run.seed=1" / "metrics.jsonl").write_text("mine")
    named = f"--collect {dest}: {dest / 'run.seed=1'} holds files study --collect does not write (notes.md); pass"
    assert_bad_input("ladder-train", [*argv, "--collect", str(dest)], named, capsys, monkeypatch)
    assert tree(dest) == {"run.seed=1/metrics.jsonl": b"mine", "run.seed=1/notes.md": b"mine"}
    status, _, err = run_cli("ladder-train", [*argv, "--collect", str(dest), "--overwrite"], capsys, monkeypatch)
    assert status == 0, err
    assert tree(dest)["run.seed=1/notes.md"] == b"mine" and tree(dest)["run.seed=1/metrics.jsonl"] == b"{}\n"
    status, _, err = run_cli("ladder-train", [*argv, "--collect", str(dest)], capsys, monkeypatch)
    assert status == 2 and "notes.md" in err  # collected again: its own files alone would be replaced at once
    (dest / "run.seed=1" / "notes.md").unlink()
    assert run_cli("ladder-train", [*argv, "--collect", str(dest)], capsys, monkeypatch)[0] == 0
    assert_bad_input("ladder-train", [*argv, "--overwrite"], "--overwrite: only with --collect", capsys, monkeypatch)


def test_a_value_longer_than_a_folder_name_gets_a_shortened_name(tmp_path, capsys, monkeypatch):
    source = f"data/{'x' * 150}/{'y' * 150}"  # each part a usable name, the whole too long for one
    argv = ["study", "--config", SMOKE, f"data.source={source}", f"run.dir={tmp_path / 's'}", "--dry-run"]
    status, out, err = run_cli("ladder-train", argv, capsys, monkeypatch)
    assert status == 0, err
    name = out.splitlines()[1].split()[1]
    assert name.startswith("data.source=data_xxx") and len(name.encode()) == NAME_BYTES and "~" in name


# -- another study's runs and results are never taken for this one's ---------------------------------------------


def other_recipe(tmp_path: Path) -> str:
    """The smoke recipe at another learning rate: another study's recipe, with the same point names."""
    text = Path(SMOKE).read_text()
    assert "lr: 3.0e-3" in text
    path = tmp_path / "other.yaml"
    path.write_text(text.replace("lr: 3.0e-3", "lr: 1.0e-3"))
    return str(path)


def test_collect_of_another_study_into_a_folder_of_its_results_needs_overwrite(tmp_path, capsys, monkeypatch):
    first, argv = finished_study(tmp_path / "first")
    dest = tmp_path / "dest"
    assert run_cli("ladder-train", [*argv, "--collect", str(dest)], capsys, monkeypatch)[0] == 0
    collected = tree(dest)
    assert "run.seed=0/config.yaml" in collected
    second, argv2 = finished_study(tmp_path / "second", other_recipe(tmp_path))  # the same point names
    (second / "run.seed=0" / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    named = (
        f"--collect {dest}: {dest / 'run.seed=0'} holds another run's results (its config.yaml is not "
        f"{second / 'run.seed=0' / 'config.yaml'}'s, of another config: train.optimizer.lr: 0.003 there, 0.001 here); "
        "pass --overwrite to replace them"
    )
    assert_bad_input("ladder-train", [*argv2, "--collect", str(dest)], named, capsys, monkeypatch)
    assert tree(dest) == collected  # refused before any copy
    assert run_cli("ladder-train", [*argv, "--collect", str(dest)], capsys, monkeypatch)[0] == 0  # the same again
    assert tree(dest) == collected
    status, _, err = run_cli("ladder-train", [*argv2, "--collect", str(dest), "--overwrite"], capsys, monkeypatch)
    assert status == 0, err
    assert tree(dest)["run.seed=0/metrics.jsonl"] == b'{"step": 1, "loss": 9.0}\n'


def test_results_without_their_config_in_the_collect_folder_need_overwrite(tmp_path, capsys, monkeypatch):
    _, argv = finished_study(tmp_path)
    dest = tmp_path / "dest"
    (dest / "run.seed=1" / "eval").mkdir(parents=True)
    (dest / "run.seed=1" / "eval" / "step-9.json").write_text("mine")
    named = f"{dest / 'run.seed=1'} holds results without a config.yaml (eval/step-9.json), whose run cannot be told"
    assert_bad_input("ladder-train", [*argv, "--collect", str(dest)], named, capsys, monkeypatch)
    assert tree(dest) == {"run.seed=1/eval/step-9.json": b"mine"}


def test_a_study_of_another_recipe_in_the_first_ones_folder_is_refused_before_any_run(tmp_path, capsys, monkeypatch):
    from ladder_train.study import runner

    study, argv = finished_study(tmp_path)  # finished, trained on smoke.yaml at lr 3e-3
    started = []
    monkeypatch.setattr(runner, "_start_trainer", lambda *args: started.append(args))
    other = ["study", "--config", other_recipe(tmp_path), *argv[3:]]
    before = tree(study)
    named = (
        f"study {study}: {study / 'run.seed=0'} holds a run of another config (train.optimizer.lr: 0.003 there, "
        "0.001 here); this study would take it for its point 0"
    )
    dest, both = tmp_path / "dest", " (1 more points alike)"
    for extra, more in (([], both), (["--point", "0"], ""), (["--collect", str(dest)], both)):
        assert_bad_input("ladder-train", [*other, *extra], f"{named}{more}: move it elsewhere", capsys, monkeypatch)
    assert_bad_input("ladder-train", [*other, "--point", "1"], "holds a run of another config", capsys, monkeypatch)
    assert not started and tree(study) == before and not dest.exists()
    status, out, err = run_cli("ladder-train", [*other, "--dry-run"], capsys, monkeypatch)
    assert status == 0, err
    assert (
        "[holds a run of another config (train.optimizer.lr: 0.003 there, 0.001 here): refused]" in out.splitlines()[1]
    )
    # its own recipe's study finds them finished, and skips them
    status, out, err = run_cli("ladder-train", argv, capsys, monkeypatch)
    assert status == 0, err
    assert "study: [0] run.seed=0: finished, skipped" in out and not started


def test_a_run_folder_with_results_and_no_config_is_not_taken_as_a_point(tmp_path, capsys, monkeypatch):
    from ladder_train.study import runner

    monkeypatch.setattr(runner, "_start_trainer", lambda *args: pytest.fail("a trainer started"))
    study = tmp_path / "s"
    (study / "run.seed=0" / "checkpoints" / "step-4").mkdir(parents=True)  # whose checkpoint: nothing says
    argv = ["study", "--config", SMOKE, "run.seed=0", f"run.dir={study}"]
    named = f"{study / 'run.seed=0'} holds a run without its config.yaml, so whose it is cannot be told"
    assert_bad_input("ladder-train", argv, named, capsys, monkeypatch)


def test_a_points_own_run_as_the_trainer_records_it_is_its_own(tmp_path, capsys, monkeypatch):
    from ladder_train.study import runner

    study = runner.Study(SMOKE, ["train.optimizer.lr=1e-3", "train.max_steps=1", f"run.dir={tmp_path / 's'}"])
    (point,) = study.points
    status, _, err = run_cli("ladder-train", ["--config", SMOKE, *point.run_overrides(study.dir)], capsys, monkeypatch)
    assert status == 0, err
    assert runner.finished(point.run_dir(study.dir))
    study.refuse_foreign_runs()  # the config.yaml the trainer wrote reads as this point's
    assert "[finished]" in study.describe([])


@pytest.mark.parametrize(
    "values, first, second",
    [
        (["train.optimizer.lr=1e-3,0.001"], "train.optimizer.lr=1e-3", "train.optimizer.lr=0.001"),
        (["run.seed=0,00"], "run.seed=0", "run.seed=00"),
        (["train.optimizer.lr=1e-3,0.01"], None, None),
    ],
)
def test_two_points_of_one_config_are_refused_naming_both(tmp_path, capsys, monkeypatch, values, first, second):
    argv = ["study", "--config", SMOKE, *values, f"run.dir={tmp_path / 's'}", "--dry-run"]
    if first is None:  # values that differ once read are two points
        status, out, err = run_cli("ladder-train", argv, capsys, monkeypatch)
        assert status == 0 and out.startswith(f"study {tmp_path / 's'}: 2 points"), err
        return
    named = f"study: points 0 ({first}) and 1 ({second}) are one config once their values are read"
    assert_bad_input("ladder-train", argv, named, capsys, monkeypatch)
    assert not (tmp_path / "s").exists()


def test_a_point_another_command_trained_under_another_spelling_is_refused(tmp_path, capsys, monkeypatch):
    from ladder_train.study import runner

    monkeypatch.setattr(runner, "_start_trainer", lambda *args: pytest.fail("a trainer started"))
    study = tmp_path / "s"
    (first,) = grid(["train.optimizer.lr=1e-3"])
    save_config(load_config(SMOKE, first.run_overrides(study)), first.run_dir(study) / "config.yaml")
    (first.run_dir(study) / "summary.json").write_text('{"finished": true}')
    argv = ["study", "--config", SMOKE, "train.optimizer.lr=0.001,0.01", f"run.dir={study}"]
    named = (
        f"study {study}: point 0 (train.optimizer.lr=0.001) is the config {first.run_dir(study)} holds a run of, once "
        "the values are read"
    )
    for extra in ([], ["--point", "0"]):
        assert_bad_input("ladder-train", [*argv, *extra], named, capsys, monkeypatch)
    assert [p.name for p in study.iterdir()] == [first.name]
    status, out, err = run_cli(
        "ladder-train", [*argv, "--point", "1"], capsys, monkeypatch
    )  # 0.01: a config of its own
    assert status == 0 and "train.optimizer.lr=0.01" in out, err


def test_collect_of_a_repeat_of_the_study_from_another_folder_needs_overwrite(tmp_path, capsys, monkeypatch):
    _, argv = finished_study(tmp_path / "first")
    dest = tmp_path / "dest"
    assert run_cli("ladder-train", [*argv, "--collect", str(dest)], capsys, monkeypatch)[0] == 0
    collected = tree(dest)
    repeat, argv2 = finished_study(tmp_path / "repeat")  # the same recipe and points, trained again elsewhere
    named = f"{repeat / 'run.seed=0' / 'config.yaml'}'s, of this config from another run folder); pass --overwrite"
    assert_bad_input("ladder-train", [*argv2, "--collect", str(dest)], named, capsys, monkeypatch)
    assert tree(dest) == collected
