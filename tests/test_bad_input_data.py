"""The token-folder path under bad input: ladder-data prepare never deletes or overwrites what it did not write,
runs one at a time per folder, and stops on Ctrl-C in one line; token ids past the vocabulary, a tokens.bin cut
short under a reader, a file named where its folder is meant and overlong names are each one line (exit 2), never a
traceback, an IndexError in the embedding or a SIGBUS."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_errors import assert_bad_input, run_cli

from ladder_train.config import DataConfig, load_config
from ladder_train.data import build_dataloader, byte_tokenizer, tokenize_files
from ladder_train.data.out_folder import LOCK_NAME, PARTS, locked
from ladder_train.data.token_files import OFFSETS_NAME, TOKEN_FOLDER_META, TOKENS_NAME
from ladder_train.data.tokenize_files import prepare
from ladder_train.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[1]
SEQ = 8  # windows of 9 tokens


def write_docs(path: Path, n: int, files: int = 1) -> Path:
    """A local jsonl source of ``files`` files of short documents."""
    path.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        (path / f"docs-{f}.jsonl").write_text(
            "".join(json.dumps({"text": f"doc {f} {i} " * 3}) + "\n" for i in range(n))
        )
    return path


def token_folder(tmp_path: Path, name: str = "tokens") -> Path:
    prepare(str(write_docs(tmp_path / f"src_{name}", 30, files=2)), tmp_path / name, "byte")
    return tmp_path / name


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative name -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def prepare_argv(source: Path, out: Path, *flags: str) -> list[str]:
    return ["prepare", str(source), str(out), "--tokenizer", "byte", *flags]


# -- 1. nothing a user wrote is deleted or overwritten ------------------------------------------------------


def test_prepare_refuses_a_folder_that_holds_anything_without_overwrite(tmp_path, capsys, monkeypatch):
    source = write_docs(tmp_path / "src", 5)
    folder = token_folder(tmp_path)
    before = snapshot(folder)
    named = f"{folder} already holds a token folder ({TOKEN_FOLDER_META}); pass --overwrite to replace it"
    assert_bad_input("ladder-data", prepare_argv(source, folder), named, capsys, monkeypatch)
    assert snapshot(folder) == before

    unfinished = tmp_path / "unfinished"  # a killed prepare's parts, and a user's note among them
    (unfinished / PARTS).mkdir(parents=True)
    (unfinished / PARTS / "000000.tokens").write_bytes(b"\0\0")
    (unfinished / PARTS / "notes.txt").write_text("mine")
    before = snapshot(unfinished)
    named = f"{unfinished} holds the files of an unfinished ladder-data prepare (.parts); pass --overwrite"
    assert_bad_input("ladder-data", prepare_argv(source, unfinished), named, capsys, monkeypatch)
    named = f"{unfinished / PARTS} holds files ladder-data prepare did not write (notes.txt)"
    assert_bad_input("ladder-data", prepare_argv(source, unfinished, "--overwrite"), named, capsys, monkeypatch)
    assert snapshot(unfinished) == before

    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("mine")
    named = f"{other} is not empty (it holds thesis.tex); choose a new or empty folder"
    assert_bad_input("ladder-data", prepare_argv(source, other), named, capsys, monkeypatch)
    assert snapshot(other) == {"thesis.tex": b"mine"}


def test_overwrite_replaces_prepares_own_files_and_nothing_else(tmp_path, capsys, monkeypatch):
    folder = token_folder(tmp_path)
    (folder / "README.md").write_text("mine")
    (folder / PARTS).mkdir()
    (folder / PARTS / "000003.lengths").write_bytes(b"stale")  # an interrupted prepare's part
    source = write_docs(tmp_path / "small", 4)
    status, _, err = run_cli("ladder-data", prepare_argv(source, folder, "--overwrite"), capsys, monkeypatch)
    assert status == 0, err
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["README.md", TOKENS_NAME, OFFSETS_NAME, TOKEN_FOLDER_META]
    )
    assert (folder / "README.md").read_text() == "mine"
    assert json.loads((folder / TOKEN_FOLDER_META).read_text())["documents"] == 4


def test_an_empty_folder_is_fine_and_a_failed_prepare_leaves_no_files(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    status, _, err = run_cli("ladder-data", prepare_argv(write_docs(tmp_path / "src", 3), empty), capsys, monkeypatch)
    assert status == 0 and (empty / TOKEN_FOLDER_META).is_file(), err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": [1, 2, 300]}) + "\n" for _ in range(3)))
    out = tmp_path / "new"
    status, _, err = run_cli("ladder-data", prepare_argv(bad, out), capsys, monkeypatch)  # found while working
    assert status == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"ladder-data: error: {bad}: a document of token ids holds id 300, outside the tokenizer's vocabulary (0..256)"
    )
    assert not out.exists()  # made by the failed call, so removed with its parts


# -- 2. one prepare per folder ------------------------------------------------------------------------------


def test_a_second_prepare_into_a_folder_being_written_is_refused(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    source = write_docs(tmp_path / "src", 3)
    with locked(out):  # a prepare at work (flock: another open file conflicts, also in this process)
        named = f"OUT_DIR: {out} is in use by another ladder-data prepare (host "
        assert_bad_input("ladder-data", prepare_argv(source, out), named, capsys, monkeypatch)
        assert_bad_input("ladder-data", prepare_argv(source, out, "--overwrite"), named, capsys, monkeypatch)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
    assert not (out / LOCK_NAME).exists()  # released and removed


def test_a_link_planted_as_the_lock_file_is_refused_in_one_line_and_its_target_is_untouched(
    tmp_path, capsys, monkeypatch
):
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone's file\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(victim)  # ln -s ~/victim OUT/.ladder-data.lock
    source = write_docs(tmp_path / "src", 3)
    named = f"ladder-data: error: {out / LOCK_NAME} is a symbolic link; "
    assert_bad_input("ladder-data", prepare_argv(source, out), named, capsys, monkeypatch)
    assert_bad_input("ladder-data", prepare_argv(source, out, "--overwrite"), named, capsys, monkeypatch)
    assert victim.read_bytes() == b"someone's file\n"
    assert [p.name for p in out.iterdir()] == [LOCK_NAME] and (out / LOCK_NAME).is_symlink()


def test_a_link_planted_as_the_parts_folder_is_refused_and_nothing_in_the_folder_it_names_is_deleted(
    tmp_path, capsys, monkeypatch
):
    folder = token_folder(tmp_path)
    elsewhere = tmp_path / "some_dir"  # someone's folder that happens to hold files by prepare's names
    elsewhere.mkdir()
    for name in (TOKENS_NAME, OFFSETS_NAME, "000000.tokens", "000000.lengths"):
        (elsewhere / name).write_bytes(b"someone's " + name.encode())
    theirs, ours = snapshot(elsewhere), snapshot(folder)
    (folder / PARTS).symlink_to(elsewhere)  # ln -s /some/dir O/.parts
    named = f"ladder-data: error: {folder / PARTS} is a symbolic link; "
    source = write_docs(tmp_path / "src", 3)
    assert_bad_input("ladder-data", prepare_argv(source, folder, "--overwrite"), named, capsys, monkeypatch)
    assert snapshot(elsewhere) == theirs and snapshot(folder) == ours and (folder / PARTS).is_symlink()


@pytest.mark.parametrize("name", [TOKENS_NAME, OFFSETS_NAME, TOKEN_FOLDER_META])
def test_a_link_planted_as_one_of_prepares_files_is_refused_with_overwrite_and_its_target_is_untouched(
    tmp_path, capsys, monkeypatch, name
):
    folder = token_folder(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone's file\n")
    (folder / name).unlink()
    (folder / name).symlink_to(victim)
    named = f"ladder-data: error: {folder / name} is a symbolic link; "
    source = write_docs(tmp_path / "src", 3)
    assert_bad_input("ladder-data", prepare_argv(source, folder, "--overwrite"), named, capsys, monkeypatch)
    assert victim.read_bytes() == b"someone's file\n" and (folder / name).is_symlink()


def test_a_lock_file_left_by_a_killed_prepare_blocks_nothing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text("host h, pid 1, since long ago\n")  # its holder died: nobody holds the lock
    status, _, err = run_cli("ladder-data", prepare_argv(write_docs(tmp_path / "src", 3), out), capsys, monkeypatch)
    assert status == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted([TOKENS_NAME, OFFSETS_NAME, TOKEN_FOLDER_META])


# -- 3. token ids past the vocabulary -----------------------------------------------------------------------


def with_bad_id(folder: Path, offset: int, token_id: int = 300) -> None:
    """Put ``token_id`` at token ``offset`` of a uint16 folder, leaving its metadata as it was (a lie)."""
    tokens = np.fromfile(folder / TOKENS_NAME, dtype="<u2")
    tokens[offset] = token_id
    tokens.tofile(folder / TOKENS_NAME)


def test_prepare_records_the_largest_id_and_info_reads_every_token(tmp_path, capsys, monkeypatch):
    folder = token_folder(tmp_path)
    largest = int(np.fromfile(folder / TOKENS_NAME, dtype="<u2").max())
    assert json.loads((folder / TOKEN_FOLDER_META).read_text())["max_token_id"] == largest
    status, out, err = run_cli("ladder-data", ["info", str(folder)], capsys, monkeypatch)
    assert status == 0 and f", largest id {largest}\n" in out, err
    with_bad_id(folder, 37)
    named = f"{folder / TOKENS_NAME}: token 37 is id 300, outside the vocabulary of its tokenizer 'byte' (ids 0..256"
    assert_bad_input("ladder-data", ["info", str(folder)], named, capsys, monkeypatch)


def test_the_loader_stops_an_id_past_the_vocabulary_before_the_model_sees_it(tmp_path):
    folder = token_folder(tmp_path)
    with_bad_id(folder, 3 * (SEQ + 1) + 2)  # instance 3
    cfg = DataConfig(source=str(folder), tokenizer="byte", seq_len=SEQ)
    loader = build_dataloader(cfg, byte_tokenizer(), 2, global_batch_size=2)
    batches = iter(loader)
    with pytest.raises(DataError) as caught:
        for _ in range(loader.order.sizes[0]):  # more than an epoch: every instance is read
            next(batches)
    assert str(caught.value).startswith(f"{folder / TOKENS_NAME}: token 29 is id 300, outside the vocabulary")


def test_a_folder_recording_ids_past_model_vocab_size_is_refused_before_training(tmp_path, capsys, monkeypatch):
    folder = token_folder(tmp_path)
    largest = json.loads((folder / TOKEN_FOLDER_META).read_text())["max_token_id"]
    with pytest.raises(ConfigError, match=rf"^key 'data.source'={folder}: the token folder holds ids up to {largest}"):
        load_config(None, [f"data.source={folder}", f"model.vocab_size={largest}", "eval.val_every=0"])
    with pytest.raises(ConfigError, match=r"^key 'data.sources\[0\].path'=.* outside model.vocab_size=100"):
        load_config(None, ["data.source=null", f"data.sources=[{{path: {folder}}}]", "model.vocab_size=100"])
    load_config(None, [f"data.source={folder}", f"model.vocab_size={largest + 1}", "eval.val_every=0"])  # fits
    smoke = str(REPO / "recipes/smoke.yaml")
    argv = ["--config", smoke, f"run.dir={tmp_path / 'run'}", f"data.source={folder}", "model.vocab_size=100"]
    assert_bad_input("ladder-train", argv, "outside model.vocab_size=100", capsys, monkeypatch)
    assert not (tmp_path / "run").exists()


# -- 4. a token file cut short under a reader ---------------------------------------------------------------


def test_a_token_file_cut_short_while_read_is_one_line_naming_it_not_a_bus_error(tmp_path):
    prepare(str(write_docs(tmp_path / "src", 400)), tmp_path / "tokens", "byte")
    folder = tmp_path / "tokens"
    assert (folder / TOKENS_NAME).stat().st_size > 4 * 4096  # pages wholly past the cut: a map's read faults there
    cfg = DataConfig(source=str(folder), tokenizer="byte", seq_len=SEQ)
    batches = iter(build_dataloader(cfg, byte_tokenizer(), 4, global_batch_size=4))
    next(batches)
    os.truncate(folder / TOKENS_NAME, 4)  # two tokens left: every later window is past the end
    with pytest.raises(DataError, match=rf"^{folder / TOKENS_NAME}: cut short while being read: 4 bytes now"):
        next(batches)


def test_a_folder_replaced_by_prepare_overwrite_under_a_reader_keeps_the_readers_files(tmp_path):
    folder = token_folder(tmp_path)
    cfg = DataConfig(source=str(folder), tokenizer="byte", seq_len=SEQ)
    reference = iter(build_dataloader(cfg, byte_tokenizer(), 4, global_batch_size=4))
    expected = [next(reference)[0] for _ in range(6)]
    reader = iter(build_dataloader(cfg, byte_tokenizer(), 4, global_batch_size=4))
    assert next(reader)[0].equal(expected[0])
    prepare(str(write_docs(tmp_path / "tiny", 2)), folder, "byte", overwrite=True)  # a much shorter folder
    assert json.loads((folder / TOKEN_FOLDER_META).read_text())["documents"] == 2
    for want in expected[1:]:  # the files the reader opened are still whole: renamed over, not rewritten
        assert next(reader)[0].equal(want)


# -- 5. a file of a token folder where the folder is meant --------------------------------------------------


def test_a_file_of_a_token_folder_is_refused_naming_the_folder(tmp_path, capsys, monkeypatch):
    folder = token_folder(tmp_path)
    file = folder / TOKENS_NAME
    with pytest.raises(ConfigError, match=rf"^key 'data.source'={file} is a file of the token folder {folder}: give"):
        load_config(None, [f"data.source={file}", "eval.val_every=0"])
    cfg = DataConfig(source=str(file), tokenizer="byte", seq_len=SEQ)  # built in code: no config checks
    with pytest.raises(DataError, match=rf"^data.source: {file} is a file of the token folder {folder}; give the"):
        build_dataloader(cfg, byte_tokenizer(), 2)
    named = f"FOLDER: {file} is a file of the token folder {folder}; give the folder"
    assert_bad_input("ladder-data", ["info", str(file)], named, capsys, monkeypatch)
    odd = tmp_path / "notes.txt"
    odd.write_text("x")
    with pytest.raises(DataError, match=rf"^data.source: {odd} is not a .parquet/.jsonl/.json file"):
        build_dataloader(DataConfig(source=str(odd), tokenizer="byte", seq_len=SEQ), byte_tokenizer(), 2)


# -- 6. Ctrl-C ----------------------------------------------------------------------------------------------


def test_ctrl_c_on_prepare_removes_its_partial_files_and_exits_130_in_one_line(tmp_path, capsys, monkeypatch):
    real = tokenize_files._tokenize_shard

    def interrupted_at_the_second_shard(task):
        if task[1] == 1:
            raise KeyboardInterrupt
        return real(task)

    monkeypatch.setattr(tokenize_files, "_tokenize_shard", interrupted_at_the_second_shard)
    out = tmp_path / "out"
    status, _, err = run_cli(
        "ladder-data", prepare_argv(write_docs(tmp_path / "src", 3, files=3), out), capsys, monkeypatch
    )
    assert status == 130 and "Traceback" not in err, err
    assert (
        err.strip().splitlines()[-1]
        == f"ladder-data: interrupted; no token folder written to {out} (partial files removed)"
    )
    assert not out.exists()
    kept = tmp_path / "kept"  # an existing folder stays, emptied of prepare's files only
    kept.mkdir()
    status, _, err = run_cli("ladder-data", prepare_argv(tmp_path / "src", kept), capsys, monkeypatch)
    assert status == 130 and list(kept.iterdir()) == [], err


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_ctrl_c_on_prepare_with_two_workers_leaves_one_line_and_no_process(tmp_path):
    out = tmp_path / "out"
    # Ctrl-C's default handler even when this test runs in a background job (which starts with SIGINT ignored)
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from ladder_train.cli import ladder_data; sys.exit(ladder_data())"
    )
    cmd = [sys.executable, "-c", code, "prepare", "python-stdlib", str(out), "--tokenizer", "byte", "--workers", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (out / PARTS).is_dir() or not any((out / PARTS).glob("*.tokens")):  # the workers are at work
        assert proc.poll() is None and time.monotonic() < deadline, "prepare ended or never started its workers"
        time.sleep(0.2)
    workers = children_of(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("ladder-data: interrupted; no token folder written to"), err[-3000:]
    assert not out.exists()
    deadline = time.monotonic() + 30  # multiprocessing's resource tracker ends when it sees its parent gone
    while (left := [pid for pid in workers if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(workers) >= 2 and not left


# -- 7. overlong names --------------------------------------------------------------------------------------


def test_a_300_character_folder_name_is_one_line(tmp_path, capsys, monkeypatch):
    long = tmp_path / ("x" * 300)
    source = write_docs(tmp_path / "src", 3)
    assert_bad_input("ladder-data", prepare_argv(source, long), "File name too long", capsys, monkeypatch)
    assert_bad_input("ladder-data", prepare_argv(source, long / "out"), "File name too long", capsys, monkeypatch)
    assert_bad_input("ladder-data", ["info", str(long)], "File name too long", capsys, monkeypatch)
    assert_bad_input("ladder-data", prepare_argv(long, tmp_path / "out"), "File name too long", capsys, monkeypatch)


def test_a_null_or_missing_text_is_one_line_naming_key_and_record_in_prepare_and_training(
    tmp_path, capsys, monkeypatch
):
    """A record without the text key, or with it null, in jsonl or parquet: ladder-data prepare says what the
    trainer says (one check, packing.check_documents), naming the file, the record and the key."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = json.dumps({"text": "hello there"}) + "\n"
    (tmp_path / "null.jsonl").write_text(good * 2 + '{"text": null}\n' + good)
    (tmp_path / "nokey.jsonl").write_text(good + '{"body": "words"}\n')
    pq.write_table(pa.table({"text": ["a b", "c", None, "d"]}), tmp_path / "null.parquet")
    cases = {
        "null.jsonl": "null.jsonl: line 3: 'text' is null, not text (data.text_column)",
        "nokey.jsonl": "nokey.jsonl: line 2 has no 'text' key (data.text_column)",
        "null.parquet": "null.parquet: row 2 (counting from 0): 'text' is null, not text (data.text_column)",
    }
    for name, line in cases.items():
        source = tmp_path / name
        argv = ["prepare", str(source), str(tmp_path / f"out-{name}"), "--tokenizer", "byte"]
        status, _, err = run_cli("ladder-data", argv, capsys, monkeypatch)  # found while working: after the bar
        assert status == 2 and err.strip().splitlines()[-1] == f"ladder-data: error: {tmp_path}/{line}", err
        cfg = DataConfig(source=str(source), tokenizer="byte", seq_len=4)
        with pytest.raises(DataError) as caught:
            list(build_dataloader(cfg, byte_tokenizer(), 1, num_workers=0, cycle=False))
        assert str(caught.value) == f"{tmp_path}/{line}"


def test_a_damaged_parquet_file_met_while_reading_is_named_not_a_traceback(tmp_path):
    """read_error_message looks for a null row in parquet files: one it cannot read gives the read failure's line."""
    from ladder_train.data.sources import read_error_message

    (tmp_path / "train.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 4 + b"PAR1")
    line = read_error_message(str(tmp_path), "train", "text", OSError("unexpected end of stream"))
    assert (
        line == f"data.source: {tmp_path} (split train): reading documents failed (OSError: unexpected end of stream)"
    )
