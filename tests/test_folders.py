"""The folder lock (ladder_train/folders.py lock_folder), the one lock of a run folder and of prepare's OUT_DIR: a
second holder is refused naming the first, a lock is the process's and not its forked children's, and the lock file is
never opened through a link. And the check every reader of a model folder makes before it opens a file
(``is_plain_file``): anything but a regular file is refused in one line, unopened."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cli_errors import planted_fifo

from ladder_train.errors import InputError
from ladder_train.files import (
    copy_to,
    is_plain_file,
    make_folder,
    open_to_write,
    remove_written,
    remove_written_tree,
    replace_written,
    write_text,
)
from ladder_train.folder_lock import LockHeld, lock_folder, lock_holder
from ladder_train.folders import folder_kind

NAME = "x.lock"


def test_a_second_lock_in_this_process_is_refused_naming_the_holder_and_close_releases_it(tmp_path):
    lock = lock_folder(tmp_path, NAME, "test")
    line = (tmp_path / NAME).read_text()
    assert line.startswith(f"host {os.uname().nodename}, pid {os.getpid()}, since ") and line.count("\n") == 1
    assert lock_holder(tmp_path, NAME) == line.strip()
    with pytest.raises(LockHeld) as refused:  # lockf alone would grant it, and drop both locks when either closed
        lock_folder(tmp_path, NAME, "test")
    assert refused.value.holder == line.strip() and refused.value.path == tmp_path / NAME
    assert lock_holder(tmp_path, NAME) == line.strip()  # the refusal did not release the first lock
    lock.close()
    assert (tmp_path / NAME).exists() and lock_holder(tmp_path, NAME) is None
    again = lock_folder(tmp_path, NAME, "test")
    again.close(remove=True)
    assert not (tmp_path / NAME).exists()
    assert lock_holder(tmp_path, NAME) is None


HOLD = """
import sys
from pathlib import Path
from ladder_train.folder_lock import lock_folder
lock = lock_folder(Path(sys.argv[1]), sys.argv[2], "test")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_another_process_is_refused_and_a_forked_child_keeps_no_lock(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path), NAME], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(LockHeld) as refused:
            lock_folder(tmp_path, NAME, "test")
        assert refused.value.holder.startswith(f"host {os.uname().nodename}, pid {holder.pid}, since ")
        assert lock_holder(tmp_path, NAME) == refused.value.holder
    finally:
        holder.kill()  # kill -9: the kernel drops its lock
        holder.wait()
    assert lock_holder(tmp_path, NAME) is None

    lock = lock_folder(tmp_path, NAME, "test")
    read_end, write_end = os.pipe()
    child = os.fork()  # inherits the open lock file, as a data-loader worker does
    if child == 0:
        os.close(write_end)
        os.read(read_end, 1)  # lives until the parent is done
        os._exit(0)
    try:
        os.close(read_end)
        lock.close()
        probe = subprocess.run(
            [sys.executable, "-c", HOLD, str(tmp_path), NAME], input="", capture_output=True, text=True, timeout=120
        )
        assert probe.returncode == 0 and probe.stdout == "held\n", probe.stderr  # flock would still be held
    finally:
        os.close(write_end)
        os.waitpid(child, 0)


@pytest.mark.parametrize("caller", [lock_folder, lock_holder])
def test_a_link_where_the_lock_file_belongs_is_refused_in_one_line_and_its_target_is_untouched(tmp_path, caller):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\x00bytes\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / NAME).symlink_to(victim)
    args = (folder, NAME, "test") if caller is lock_folder else (folder, NAME)
    with pytest.raises(InputError) as refused:
        caller(*args)
    message = str(refused.value)
    assert message.startswith(f"{folder / NAME} is a symbolic link") and "\n" not in message
    assert victim.read_bytes() == b"precious\x00bytes\n"
    assert (folder / NAME).is_symlink()  # left for its owner to remove
    (folder / NAME).unlink()
    (folder / NAME).symlink_to(tmp_path / "nowhere")  # a dangling link would be created through, too
    with pytest.raises(InputError):
        caller(*args)
    assert not (tmp_path / "nowhere").exists()


def test_a_lock_file_that_is_no_plain_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / NAME)  # opening a FIFO to read would wait for a writer
    for call in (lambda: lock_folder(tmp_path, NAME, "test"), lambda: lock_holder(tmp_path, NAME)):
        with pytest.raises(InputError, match=f"^{tmp_path / NAME} is not a plain file"):
            call()
    os.unlink(tmp_path / NAME)
    (tmp_path / NAME).mkdir()
    with pytest.raises(InputError, match="is not a plain file"):
        lock_holder(tmp_path, NAME)


def test_is_plain_file_is_true_for_a_regular_file_or_a_link_to_one_and_false_for_nothing(tmp_path):
    regular = tmp_path / "config.json"
    regular.write_text("{}")
    (tmp_path / "link").symlink_to(regular)  # links are followed: a Hugging Face cache links its files into blobs/
    (tmp_path / "dangling").symlink_to(tmp_path / "absent")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert is_plain_file(regular) and is_plain_file(str(regular)) and is_plain_file(tmp_path / "link")
    for nothing in ("absent", "dangling", "loop", "config.json/below"):
        assert not is_plain_file(tmp_path / nothing), nothing


def test_is_plain_file_refuses_a_fifo_socket_device_or_directory_in_one_line_without_opening_it(tmp_path):
    short = Path(tempfile.mkdtemp(dir="/tmp"))  # a socket's path must fit 108 bytes
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(short / "sock"))
    (tmp_path / "dir").mkdir()
    (tmp_path / "to-fifo").symlink_to(tmp_path / "fifo")
    cases = {
        short / "sock": "a socket",
        Path(os.devnull): "a character device",
        tmp_path / "dir": "a directory",
        tmp_path / "fifo": "a FIFO (named pipe)",
        tmp_path / "to-fifo": "a FIFO (named pipe) (through a symbolic link)",
    }
    try:
        with planted_fifo(tmp_path / "fifo") as fifo:
            for path, what in cases.items():
                with pytest.raises(InputError) as refused:
                    is_plain_file(path)
                assert str(refused.value) == f"{path}: {what}, where a regular file belongs; refused without opening it"
        assert not fifo["opened"]
    finally:
        server.close()
        (short / "sock").unlink()
        short.rmdir()


@pytest.mark.parametrize(
    "name, beside",
    [("config.json", "model.safetensors"), ("model.safetensors", "config.json"), ("COMPLETE", ".metadata")],
)
def test_folder_kind_names_a_fifo_where_a_deciding_file_belongs(tmp_path, name, beside):
    (tmp_path / beside).write_text("{}")
    with planted_fifo(tmp_path / name) as fifo, pytest.raises(InputError, match=f"^{tmp_path / name}: a FIFO"):
        folder_kind(tmp_path)
    assert not fifo["opened"]


# -- nothing written through a link ----------------------------------------------------------------------------

WRITERS = {
    "write_text": lambda path, tmp: write_text(path, "new"),
    "open_to_write a": lambda path, tmp: open_to_write(path, "a").close(),
    "open_to_write wb": lambda path, tmp: open_to_write(path, "wb").close(),
    "copy_to": lambda path, tmp: copy_to(tmp / "source", path),
    "replace_written": lambda path, tmp: replace_written(write_text(tmp / "source", "new"), path),
    "remove_written": lambda path, tmp: remove_written(path),
}


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("dangling", [False, True])
def test_every_writer_refuses_a_link_in_one_line_naming_it_and_the_target_is_untouched(tmp_path, writer, dangling):
    (tmp_path / "source").write_text("new")
    victim = tmp_path / ("nowhere" if dangling else "victim")
    if not dangling:
        victim.write_bytes(b"someone's file\n")
    (tmp_path / "folder").mkdir()
    link = tmp_path / "folder" / "file"
    link.symlink_to(victim)
    with pytest.raises(InputError) as refused:
        WRITERS[writer](link, tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{link} is a symbolic link; ") and "\n" not in message
    assert link.is_symlink() and (victim.read_bytes() == b"someone's file\n" if not dangling else not victim.exists())


def test_folders_the_project_makes_or_removes_are_never_links_and_nothing_behind_one_is_deleted(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "theirs").write_text("mine")
    for name in ("made", "removed"):
        (tmp_path / name).symlink_to(elsewhere)
    for call, path in ((make_folder, tmp_path / "made"), (remove_written_tree, tmp_path / "removed")):
        with pytest.raises(InputError, match=f"^{path} is a symbolic link; a folder of this project is never"):
            call(path)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["theirs"] and (elsewhere / "theirs").read_text() == "mine"
    tree = make_folder(tmp_path / "tree" / "deep")
    (tree / "to-elsewhere").symlink_to(elsewhere)  # a link inside a folder of the project's goes as an entry
    remove_written_tree(tmp_path / "tree")
    assert not (tmp_path / "tree").exists() and (elsewhere / "theirs").read_text() == "mine"
    with pytest.raises(InputError, match="is a folder, where this project writes a file"):
        remove_written(elsewhere)


def test_the_writers_write_and_remove_plain_files(tmp_path):
    path = write_text(tmp_path / "a.txt", "one\n")
    with open_to_write(path, "a") as handle:
        handle.write("two\n")
    assert path.read_text() == "one\ntwo\n"
    write_text(path, "three\n")
    assert copy_to(path, tmp_path / "b.txt").read_text() == "three\n"
    replace_written(tmp_path / "b.txt", path)
    assert path.read_text() == "three\n" and not (tmp_path / "b.txt").exists()
    remove_written(path)
    remove_written(path)  # nothing there: nothing to do
    assert not path.exists()
