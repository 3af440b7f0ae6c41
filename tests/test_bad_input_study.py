"""Bad input to ``ladder-train study``: points that would share a folder, a ``--point`` the grid does not have, a
``--collect`` folder inside the study, a value too long for a folder name. Each is one line, exit 2, before any run
starts, or (a long name) not an error at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_errors import assert_bad_input, run_cli

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


def test_a_value_longer_than_a_folder_name_gets_a_shortened_name(tmp_path, capsys, monkeypatch):
    source = f"data/{'x' * 150}/{'y' * 150}"  # each part a usable name, the whole too long for one
    argv = ["study", "--config", SMOKE, f"data.source={source}", f"run.dir={tmp_path / 's'}", "--dry-run"]
    status, out, err = run_cli("ladder-train", argv, capsys, monkeypatch)
    assert status == 0, err
    name = out.splitlines()[1].split()[1]
    assert name.startswith("data.source=data_xxx") and len(name.encode()) == NAME_BYTES and "~" in name
