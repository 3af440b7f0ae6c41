"""The stream loader's workers come from a fork server, not a fork of the trainer (ladder_train/data/workers.py):
what crosses to a worker pickles and reads the same windows for every source kind, token folders cross nothing,
and the resume path of the kill -9 tests runs 20 times in a row from a multi-threaded process without a hang."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import signal
import threading
import time
from itertools import islice
from multiprocessing import forkserver
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import AddedToken

from ladder_train.config import DataConfig, load_config
from ladder_train.data import PackedDataLoader, build_dataloader, byte_tokenizer
from ladder_train.data.tokenize_files import prepare
from ladder_train.data.workers import PRELOAD, init_worker
from ladder_train.lifetime import PREEMPTION_SIGNALS

REPO = Path(__file__).resolve().parents[1]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def texts(n: int) -> list[str]:
    return [f"document {i}: " + "abc " * (i % 7 + 2) for i in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def chat_source(root: Path) -> tuple[DataConfig, object]:
    """A chat source in ChatML, read with the byte tokenizer plus the template's two special tokens."""
    model = root / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}))
    rows = [
        {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "answer " * i}]}
        for i in range(12)
    ]
    source = write_jsonl(root / "chat.jsonl", rows)
    tok = byte_tokenizer()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    return DataConfig(source=str(source), tokenizer="byte", format="chat", chat_template=str(model), seq_len=11), tok


def source_of(kind: str, root: Path) -> tuple[DataConfig, object]:
    """The data setup of one source kind the data tests build, with its tokenizer."""
    if kind == "chat":
        return chat_source(root)
    if kind == "jsonl":
        source = write_jsonl(root / "a.jsonl", [{"text": t} for t in texts(20)])
    elif kind == "token ids":
        source = write_jsonl(root / "ids.jsonl", [{"text": [5, 6, 7 + i, 250] * (i + 2)} for i in range(20)])
    elif kind == "parquet folder":
        source = root / "parquet"
        source.mkdir()
        for k in range(2):
            pq.write_table(pa.table({"text": texts(20)[k::2]}), source / f"train-{k:05d}-of-00002.parquet")
    else:
        source = kind  # python-stdlib
    return DataConfig(source=str(source), tokenizer="byte", seq_len=11, shuffle_buffer=3), byte_tokenizer()


def windows(dataset, n: int) -> list[tuple]:
    """The next ``n`` windows of a dataset or a running iteration of one, each as a tuple of tensors."""
    return [w if isinstance(w, tuple) else (w,) for w in islice(iter(dataset), n)]


@pytest.mark.parametrize("kind", ["jsonl", "parquet folder", "token ids", "python-stdlib", "chat"])
def test_the_dataset_a_worker_gets_pickles_and_reads_the_same_windows(tmp_path, kind):
    cfg, tok = source_of(kind, tmp_path)
    loader = build_dataloader(cfg, tok, batch_size=2, dp_rank=1, dp_world_size=2, seed=3, num_workers=0)
    # the pickler multiprocessing sends a worker's arguments with (the fork server's and spawn's)
    copy = pickle.loads(ForkingPickler.dumps(loader.dataset))
    stream = iter(loader.dataset)
    expected = windows(stream, 12)
    state = loader.dataset.state_dict()  # after 12 windows: a resumed worker gets this with the dataset
    following = windows(stream, 1)
    assert len(expected) == 12 and len(following) == 1
    for a, b in zip(expected, windows(copy, 12), strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    copy.load_state_dict(state)
    resumed = pickle.loads(ForkingPickler.dumps(copy))
    assert all(torch.equal(x, y) for x, y in zip(windows(resumed, 1)[0], following[0], strict=True))


@pytest.mark.slow
def test_a_worker_loader_starts_its_workers_in_the_fork_server_with_a_picklable_init(tmp_path):
    source = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts(10)])
    loader = build_dataloader(DataConfig(source=str(source), tokenizer="byte", seq_len=11), byte_tokenizer(), 2)
    assert loader.num_workers == 2 and loader.multiprocessing_context.get_start_method() == "forkserver"
    init = pickle.loads(ForkingPickler.dumps(loader.worker_init_fn))
    assert init.func is init_worker and init.keywords == {"trainer_pid": os.getpid()}
    for name in PRELOAD:  # the server skips a preload module that fails to import, silently
        importlib.import_module(name)


def signal_sets(pid: int) -> dict[str, set[int]]:
    """The signals process ``pid`` blocks, ignores and catches (Linux /proc)."""
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {
        key: {n for n in range(1, 65) if int(status[key], 16) >> (n - 1) & 1} for key in ("SigBlk", "SigIgn", "SigCgt")
    }


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")
def test_the_fork_server_outlasts_preemption_signals_and_the_workers_take_them(tmp_path):
    """A hang-up or Slurm's signal reaches every process of the run: the trainer finishes its step with its workers,
    so the server (their parent) must not die of one, and the workers keep their grace. (The resource tracker, which
    another test of this process may have started: tests/test_train_signals.py's hang-up of a whole trainer.)"""
    source = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts(10)])
    cfg = DataConfig(source=str(source), tokenizer="byte", seq_len=11, num_workers=1)
    loader = build_dataloader(cfg, byte_tokenizer(), 2)
    next(iter(loader))  # from the worker, after its init_worker
    preemption = {int(s) for s in PREEMPTION_SIGNALS}
    server = signal_sets(forkserver._forkserver._forkserver_pid)
    assert preemption <= server["SigBlk"] & server["SigIgn"]
    for worker in loader._iterator._workers:
        sets = signal_sets(worker.pid)
        assert not preemption & sets["SigBlk"] and preemption <= sets["SigCgt"]  # init_worker's grace handler
    loader.close()


def test_token_folders_read_in_the_trainer_so_nothing_of_theirs_crosses_to_a_worker(tmp_path):
    folders = []
    for name in ("a", "b"):
        source = write_jsonl(tmp_path / f"src_{name}" / "docs.jsonl", [{"text": t} for t in texts(30)])
        prepare(str(source.parent), tmp_path / name, "byte", workers=1)
        folders.append(tmp_path / name)
    one = DataConfig(source=str(folders[0]), tokenizer="byte", seq_len=11, num_workers=2)
    mixture = load_config(
        None,
        [f"data.sources=[{{path: {folders[0]}}}, {{path: {folders[1]}}}]", "data.seq_len=11", "data.tokenizer=byte"],
    )
    for cfg in (one, mixture.data):
        loader = build_dataloader(cfg, byte_tokenizer(), batch_size=2)
        assert not isinstance(loader, torch.utils.data.DataLoader), type(loader)  # no worker processes
        next(iter(loader))


# -- the must-show: the kill -9 resume tests' loader path, 20 times in a row -------------------------------


@contextlib.contextmanager
def within(seconds: int, what: str):
    """Fail instead of waiting for ever: SIGALRM interrupts the main thread after ``seconds``."""

    def expire(signum, frame):
        raise TimeoutError(f"{what}: no result in {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def busy_threads():
    """Other threads at work while workers start, as in a trainer (pin-memory, checkpoint writer, logging): each
    round starts and ends threads, which take the interpreter's thread locks a fork copies."""
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            helper = threading.Thread(target=sum, args=(range(1000),))
            helper.start()
            helper.join()

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def worker_parents(loader: PackedDataLoader) -> set[int]:
    pids = [w.pid for w in loader._iterator._workers]
    return {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in pids}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
def test_the_kill_9_resume_loader_path_runs_twenty_times_in_a_row_without_a_hang(tmp_path):
    """The data side of tests/test_checkpoint.py's and tests/test_train_signals.py's kill -9 resumes (the smoke
    recipe, one worker per rank, rank 1 of 2): build the loader, take batches, take its state, build anew from the
    state, take more; each round bounded, every batch an uninterrupted run's."""
    for k in range(2):  # two shards: one per rank
        write_jsonl(tmp_path / "src" / f"part-{k}.jsonl", [{"text": t} for t in texts(40)[k::2]])
    overrides = [f"data.source={tmp_path / 'src'}", "data.seq_len=15", "data.num_workers=1", "data.worker_timeout_s=60"]
    cfg = load_config(REPO / "recipes" / "smoke.yaml", overrides)
    tok = byte_tokenizer()

    def loader() -> PackedDataLoader:
        return build_dataloader(cfg.data, tok, batch_size=2, dp_rank=1, dp_world_size=2, seed=cfg.run.seed)

    taken, more = 3, 3
    with within(300, "the uninterrupted run"):
        reference = list(islice(loader(), taken + more))
    with busy_threads():
        for round_ in range(20):
            start = time.monotonic()
            with within(120, f"round {round_ + 1}"):
                first = loader()
                batches = iter(first)
                got = [next(batches) for _ in range(taken)]
                assert os.getpid() not in worker_parents(first)
                assert worker_parents(first) == {forkserver._forkserver._forkserver_pid}
                state = first.state_dict()
                first.close()
                resumed = loader()
                resumed.load_state_dict(state)
                got += list(islice(resumed, more))
                resumed.close()
            assert len(got) == len(reference), f"round {round_ + 1}"
            for (x, y), (x2, y2) in zip(reference, got, strict=True):
                assert torch.equal(x, x2) and torch.equal(y, y2), f"round {round_ + 1}"
            print(f"round {round_ + 1}: {time.monotonic() - start:.1f} s")
