"""Bad input to ``ladder-train study``: points that would share a folder, a ``--point`` the grid does not have, a
``--collect`` folder inside the study or a link planted where it copies, a point folder of someone else's, a value
too long for a folder name. Each is one line, exit 2, before any run starts or any file is copied, or (a long name)
not an error at all."""

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


def finished_study(tmp_path: Path) -> tuple[Path, list[str]]:
    """A study of two finished points (their small results only): (its folder, its argv without --collect)."""
    study = tmp_path / "s"
    for seed in (0, 1):
        run = study / f"run.seed={seed}"
        (run / "eval").mkdir(parents=True)
        for name, text in (
            ("config.yaml", "run: {}\n"),
            ("metrics.jsonl", "{}\n"),
            ("summary.json", '{"finished": 1}'),
        ):
            (run / name).write_text(text)
        (run / "eval" / "step-1.json").write_text("{}")
    return study, ["study", "--config", SMOKE, "run.seed=0,1", f"run.dir={study}"]


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
