"""The data pipeline: token ids equal the tokenizer's, packing into seq_len + 1 windows separated by
<|endoftext|>, disjoint per-rank streams, exact resume (0 and 2 workers, across epochs), the offline smoke
corpus, and one-line errors for bad input."""

import json
import os
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from launch import REPO, run, smoke_training
from tokenizers import Tokenizer, pre_tokenizers

from ladder_train.config import DataConfig
from ladder_train.data import (
    MicroBatchLoader,
    as_loader,
    build_dataloader,
    byte_tokenizer,
    check_vocab,
    eos_id,
    load_tokenizer,
)
from ladder_train.data.sources import local_files
from ladder_train.errors import DataError


def starcoder(shared: Path) -> Tokenizer:
    return load_tokenizer(shared / "tokenizers/starcoder/tokenizer.json")


def fineweb_texts(shared: Path, n: int, shard: int = 0) -> list[str]:
    table = pq.read_table(shared / f"data/fineweb/train-0000{shard}-of-00004.parquet", columns=["text"])
    return table.column("text").to_pylist()[:n]


def write_parquet(path: Path, texts: list[str]) -> Path:
    pq.write_table(pa.table({"id": [str(i) for i in range(len(texts))], "text": texts}), path)
    return path


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def stream_of(loader) -> torch.Tensor:
    """All windows of a one-pass loader, in order, as one token stream; checks the (inputs, labels) shift."""
    windows = []
    for inputs, labels in loader:
        assert inputs.dtype == torch.long and inputs.shape == labels.shape
        assert torch.equal(inputs[:, 1:], labels[:, :-1])
        windows.append(torch.cat([inputs, labels[:, -1:]], dim=1))
    return torch.cat(windows).flatten()


def documents_in(stream: torch.Tensor) -> list[tuple[int, ...]]:
    """The complete documents of a stream: the runs ending in <|endoftext|> (0)."""
    ends = (stream == 0).nonzero().flatten().tolist()
    starts = [0] + [e + 1 for e in ends[:-1]]
    return [tuple(stream[s:e].tolist()) for s, e in zip(starts, ends, strict=True)]


# -- tokenizer -------------------------------------------------------------------------------------------


def test_byte_tokenizer_is_bytes_plus_one():
    tok = byte_tokenizer()
    assert set(pre_tokenizers.ByteLevel.alphabet()) == {t for t in tok.get_vocab() if t != "<|endoftext|>"}
    text = "déf f():\n\treturn 'ü' \x00 \xff"
    assert tok.encode(text).ids == [b + 1 for b in text.encode()]
    assert tok.encode("a<|endoftext|>").ids == [ord("a") + 1, 0]  # the special token is matched, not spelt
    assert tok.get_vocab_size() == 257
    assert tok.decode(tok.encode("déf f():\n").ids) == "déf f():\n"


def test_starcoder_ids_and_vocab(shared_dir):
    tok = starcoder(shared_dir)
    assert tok.encode("def hello(): print(1)").ids == [589, 17964, 2262, 1459, 26, 35, 27]  # shared/README.md
    check_vocab(tok, 49152)
    with pytest.raises(
        DataError,
        match=r"^model.vocab_size: the model's vocabulary is 50000 but the tokenizer has 49152 tokens; set model.vocab_size=49152",
    ):
        check_vocab(tok, 50000)


@pytest.mark.parametrize(
    "vocab, separator",
    [
        ({"<|endoftext|>": 0, "</s>": 1, "a": 2}, 0),  # StarCoder / GPT-2 first, even beside another
        ({"a": 0, "<|begin_of_text|>": 1, "<|end_of_text|>": 2}, 2),  # Llama 3
        ({"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3}, 2),  # Llama 2 / SentencePiece
        ({"<unk>": 0, "a": 1}, None),
    ],
)
def test_the_document_separator_of_each_tokenizer_family(tmp_path, vocab, separator):
    from tokenizers.models import WordLevel

    Tokenizer(WordLevel(vocab, unk_token=next(iter(vocab)))).save(str(tmp_path / "tokenizer.json"))
    if separator is None:
        with pytest.raises(DataError, match=r"tokenizer.json: the tokenizer has none of <\|endoftext\|>, <\|end_of"):
            load_tokenizer(tmp_path / "tokenizer.json")
        return
    assert eos_id(load_tokenizer(tmp_path / "tokenizer.json")) == separator


# -- packing ---------------------------------------------------------------------------------------------


def test_windows_are_the_tokenizers_ids_joined_by_eos(shared_dir, tmp_path):
    tok = starcoder(shared_dir)
    texts = fineweb_texts(shared_dir, 12)
    source = write_parquet(tmp_path / "docs.parquet", texts)
    cfg = DataConfig(source=str(source), seq_len=100)
    stream = stream_of(build_dataloader(cfg, tok, batch_size=3, num_workers=0, cycle=False))
    expected = [i for t in texts for i in tok.encode(t).ids + [0]]
    whole = len(expected) // (101 * 3) * (101 * 3)  # full batches of full windows; the tail is dropped
    assert len(stream) == whole > 0
    assert stream.tolist() == expected[:whole]
    assert documents_in(stream)[:3] == [tuple(tok.encode(t).ids) for t in texts[:3]]


def test_two_ranks_read_disjoint_documents_that_cover_the_source(shared_dir, tmp_path):
    tok = starcoder(shared_dir)
    folder = tmp_path / "shards"
    folder.mkdir()
    all_docs = set()
    for shard in range(4):  # 4 files: whole shards per rank; then 3 files: every other document per rank
        texts = fineweb_texts(shared_dir, 10, shard)
        write_parquet(folder / f"train-{shard:05d}-of-00004.parquet", texts)
        all_docs |= {tuple(tok.encode(t).ids) for t in texts}
    for n_files in (4, 3):
        if n_files == 3:
            gone = folder / "train-00003-of-00004.parquet"
            all_docs -= {tuple(tok.encode(t).ids) for t in pq.read_table(gone).column("text").to_pylist()}
            gone.unlink()
        cfg = DataConfig(source=str(folder), seq_len=64)
        docs = [
            documents_in(
                stream_of(
                    build_dataloader(cfg, tok, batch_size=2, dp_rank=r, dp_world_size=2, num_workers=0, cycle=False)
                )
            )
            for r in range(2)
        ]
        assert len(set(docs[0])) == len(docs[0]) and len(set(docs[1])) == len(docs[1])  # no document twice
        assert not set(docs[0]) & set(docs[1])
        assert set(docs[0]) | set(docs[1]) <= all_docs
        assert len(all_docs) - len(docs[0]) - len(docs[1]) <= 2  # only each rank's cut-off last document is missing
        assert abs(len(docs[0]) - len(docs[1])) <= 3


def test_validation_split_reads_only_validation_files(shared_dir):
    folder = shared_dir / "data/fineweb"
    assert [p.name for p in local_files(str(folder), "validation")] == ["validation-00000-of-00001.parquet"]
    assert [p.name for p in local_files(str(folder), "train")] == [f"train-0000{i}-of-00004.parquet" for i in range(4)]


# -- resume ----------------------------------------------------------------------------------------------


def WITH_WORKERS(*values):  # noqa: N802 (reads as a parameter case)
    """A case with loader workers: they start processes, so it runs in make test, not the inner loop."""
    return pytest.param(*values, marks=pytest.mark.slow)


@pytest.mark.parametrize("workers, shuffle", [(0, 0), WITH_WORKERS(2, 0), (0, 7), WITH_WORKERS(2, 7)])
def test_resume_after_k_batches_is_bit_identical(shared_dir, workers, shuffle):
    tok = starcoder(shared_dir)
    cfg = DataConfig(source=str(shared_dir / "data/fineweb"), seq_len=64, shuffle_buffer=shuffle)
    k, more = 5, 6
    loader = build_dataloader(cfg, tok, batch_size=2, dp_rank=1, dp_world_size=2, num_workers=workers)
    batches = iter(loader)
    for _ in range(k):
        next(batches)
    state = loader.state_dict()
    expected = [next(batches) for _ in range(more)]

    resumed = build_dataloader(cfg, tok, batch_size=2, dp_rank=1, dp_world_size=2, num_workers=workers)
    resumed.load_state_dict(state)
    got = list(islice(resumed, more))
    for (x, y), (x2, y2) in zip(expected, got, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    fresh = next(iter(build_dataloader(cfg, tok, batch_size=2, dp_rank=1, dp_world_size=2, num_workers=workers)))
    assert not torch.equal(fresh[0], got[0][0])  # the resumed loader did not start over

    other = build_dataloader(
        DataConfig(source=cfg.source, seq_len=32, shuffle_buffer=shuffle),
        tok,
        batch_size=2,
        dp_rank=1,
        dp_world_size=2,
        num_workers=workers,
    )
    with pytest.raises(
        DataError, match=r"^data loader state was saved for another data setup \(seq_len: saved 64, now 32"
    ):
        other.load_state_dict(state)


@pytest.mark.parametrize("workers, shuffle", [(0, 0), WITH_WORKERS(2, 0), (0, 2), WITH_WORKERS(2, 2)])
def test_epochs_cycle_without_dropping_tokens_and_resume_across_the_boundary(tmp_path, workers, shuffle):
    tok = byte_tokenizer()
    folder = tmp_path / "corpus"
    folder.mkdir()
    texts = [f"document {i}: " + "abc" * (i + 3) for i in range(6)]
    write_jsonl(folder / "a.jsonl", texts[:3])
    write_jsonl(folder / "b.jsonl", texts[3:])
    cfg = DataConfig(source=str(folder), tokenizer="byte", seq_len=15, shuffle_buffer=shuffle)
    loader = build_dataloader(cfg, tok, batch_size=2, num_workers=workers)
    batches = list(islice(loader, 30))  # 30 x 2 x 16 tokens: several passes over ~150 tokens
    assert loader.epoch >= 2

    if workers == 0 and shuffle:  # blocks of 2 documents permuted: each pass is still every document once
        stream = torch.cat([torch.cat([x, y[:, -1:]], 1) for x, y in batches]).flatten()
        docs = documents_in(stream)
        every = sorted(tuple(tok.encode(t).ids) for t in texts)
        passes = [docs[6 * e : 6 * e + 6] for e in range(len(docs) // 6)]
        assert len(passes) >= 4 and all(sorted(p) == every for p in passes)
        assert len({tuple(p) for p in passes}) > 1  # the permutation differs between epochs
    elif workers == 0:  # one reader: every pass is the whole corpus, the buffer carried over epoch boundaries
        files = [[tuple(tok.encode(t).ids) for t in texts[:3]], [tuple(tok.encode(t).ids) for t in texts[3:]]]
        stream = torch.cat([torch.cat([x, y[:, -1:]], 1) for x, y in batches]).flatten()
        docs = documents_in(stream)
        assert len(docs) >= 6 * 4
        for epoch in range(len(docs) // 6):  # datasets re-orders the files each epoch (seeded by the epoch)
            assert docs[6 * epoch : 6 * epoch + 6] in (files[0] + files[1], files[1] + files[0])

    for k in (4, 9, 17):  # states inside the first, second and a later epoch
        loader = build_dataloader(cfg, tok, batch_size=2, num_workers=workers)
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = loader.state_dict()
        resumed = build_dataloader(cfg, tok, batch_size=2, num_workers=workers)
        resumed.load_state_dict(state)
        for (x, y), (x2, y2) in zip(batches[k : k + 8], islice(resumed, 8), strict=True):
            assert torch.equal(x, x2) and torch.equal(y, y2)


@pytest.mark.slow
@pytest.mark.parametrize("resumed", [False, True])
def test_a_stuck_worker_is_a_one_line_error_after_the_timeout(tmp_path, monkeypatch, resumed):
    import stuck_worker

    from ladder_train.data import loader as loader_module

    write_jsonl(tmp_path / "a.jsonl", [f"document {i}: " + "abc" * 9 for i in range(6)])
    cfg = DataConfig(source=str(tmp_path / "a.jsonl"), tokenizer="byte", seq_len=15, worker_timeout_s=2)
    state = None
    if resumed:  # a resumed iterator already waits for its workers when it starts (the CI hang of 2026-11-28)
        first = build_dataloader(cfg, byte_tokenizer(), batch_size=2, num_workers=1)
        next(iter(first))
        state = first.state_dict()
        first.close()
    # as a worker deadlocked at its fork (a lock another thread of the trainer held): no batch, no signal handler
    monkeypatch.setattr(loader_module, "init_worker", stuck_worker.init)
    loader = build_dataloader(cfg, byte_tokenizer(), batch_size=2, num_workers=1)
    if state is not None:
        loader.load_state_dict(state)
    with pytest.raises(DataError) as err:
        next(iter(loader))
    assert str(err.value) == (
        "data: a loader worker gave no batch in 2 s (data.worker_timeout_s): it is stuck, so the run stops for a "
        "restart from its last checkpoint"
    )


def test_shuffle_is_seeded_and_a_resume_under_another_shuffle_is_refused(tmp_path):
    tok = byte_tokenizer()
    texts = [f"doc {i:02d} " + "xy" * (i % 5) for i in range(40)]
    source = write_jsonl(tmp_path / "docs.jsonl", texts)

    def documents(shuffle: int, seed: int) -> list[tuple[int, ...]]:
        cfg = DataConfig(source=str(source), tokenizer="byte", seq_len=15, shuffle_buffer=shuffle)
        return documents_in(stream_of(build_dataloader(cfg, tok, 2, seed=seed, num_workers=0, cycle=False)))

    in_order = documents(0, 0)
    assert in_order == [tuple(tok.encode(t).ids) for t in texts[: len(in_order)]]
    shuffled = documents(8, 0)
    assert shuffled == documents(8, 0) and shuffled != documents(8, 1)  # seeded by run.seed
    assert shuffled != in_order and len(shuffled) >= 30
    first_block = {tuple(tok.encode(t).ids) for t in texts[:8]}
    assert set(shuffled[:8]) == first_block  # a block shuffle: documents move only within their block of 8

    # blocks larger than a tokenizer group (64 documents): states inside the first block (stream position: the
    # epoch's start), inside the second (position: after 100 documents), and in the next epoch
    long_source = write_jsonl(tmp_path / "long.jsonl", [f"doc {i:03d} " + "xy" * (i % 5) for i in range(150)])
    cfg = DataConfig(source=str(long_source), tokenizer="byte", seq_len=15, shuffle_buffer=100)
    expected = list(islice(build_dataloader(cfg, tok, 2, num_workers=0), 100))
    for k in (5, 35, 70):
        loader = build_dataloader(cfg, tok, 2, num_workers=0)
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = loader.state_dict()
        resumed = build_dataloader(cfg, tok, 2, num_workers=0)
        resumed.load_state_dict(state)
        for (x, y), (x2, y2) in zip(expected[k : k + 12], islice(resumed, 12), strict=True):
            assert torch.equal(x, x2) and torch.equal(y, y2), k
    assert loader.epoch == 1
    other = build_dataloader(DataConfig(source=str(long_source), tokenizer="byte", seq_len=15), tok, 2, num_workers=0)
    with pytest.raises(DataError, match=r"\(shuffle_buffer: saved 100, now 0\); resume with the same data"):
        other.load_state_dict(state)


def test_the_stream_loader_keeps_its_position_per_rank(tmp_path):
    """As the trainer sees it (MicroBatchLoader): no global position, a token-file one refused, and where it
    continues after each kind of restore."""
    source = write_jsonl(tmp_path / "docs.jsonl", [f"doc {i:02d} " + "xy" * i for i in range(20)])
    cfg = DataConfig(source=str(source), tokenizer="byte", seq_len=15)
    loader = build_dataloader(cfg, byte_tokenizer(), 2, num_workers=0)
    assert isinstance(loader, MicroBatchLoader) and loader.global_state() is None
    assert loader.describe() == "the data stream starts at its beginning"
    next(iter(loader))
    resumed = build_dataloader(cfg, byte_tokenizer(), 2, num_workers=0)
    resumed.load_global_state(None)
    resumed.load_state_dict(loader.state_dict())
    assert resumed.describe() == "the data stream continues at this rank's saved position"
    resumed.load_state_dict(None)  # a checkpoint of another world size holds no position for this rank
    assert resumed.describe() == "the data stream is re-split per rank and starts again from its beginning"
    with pytest.raises(DataError, match=r"^data: the checkpoint was trained on token folders \(3 global batches"):
        resumed.load_global_state({"kind": "token_files", "global_batches": 3})
    given = as_loader([(torch.zeros(1, 15), torch.zeros(1, 15))])  # batches handed to the trainer: no position
    assert isinstance(given, MicroBatchLoader) and given.state_dict() is None and len(list(given)) == 1
    assert as_loader(loader) is loader


# -- the offline smoke corpus ----------------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_recipe_runs_with_no_network():
    code = f"""
import socket
local_connect = socket.socket.connect
def refuse_internet(sock, address):  # local (unix) sockets stay: worker processes pass tensors through them
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        raise OSError("network disabled in this test")
    return local_connect(sock, address)
socket.socket.connect = refuse_internet
from ladder_train.config import load_config
from ladder_train.data import build_dataloader, check_vocab, load_tokenizer
cfg = load_config({str(REPO / "recipes/smoke.yaml")!r})
tok = load_tokenizer(cfg.data.tokenizer)
check_vocab(tok, cfg.model.vocab_size)
for split in ("train", "validation"):
    x, y = next(iter(build_dataloader(cfg.data, tok, batch_size=4, split=split, num_workers=1)))
    assert x.shape == (4, cfg.data.seq_len) and int(x.max()) < 257, x.shape
    print(split, "ok", tok.decode(x[0, :40].tolist()).splitlines()[0][:20])
"""
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HOME": str(Path.home())}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "train ok" in done.stdout and "validation ok" in done.stdout
    assert "tokenizer = built-in byte-level tokenizer" in done.stderr and "corpus = python-stdlib" in done.stderr


def test_the_stdlib_corpus_lists_the_librarys_files_without_walking_its_skipped_folders(tmp_path, monkeypatch):
    from ladder_train.data import sources

    skipped = ["pkg/tests/d.py", "test/e.py", "site-packages/wheel/f.py", "lib2to3/g.py"]
    for name in ["a.py", "b.txt", "pkg/c.py", *skipped]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    monkeypatch.setattr(sources.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    scanned = []
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path=".": scanned.append(Path(path)) or scandir(path))
    sources._stdlib_py_files.cache_clear()
    try:
        train, validation = sources.stdlib_files("train"), sources.stdlib_files("validation")
    finally:
        sources._stdlib_py_files.cache_clear()  # the next test reads the real library
    assert train == [tmp_path / "a.py", tmp_path / "pkg/c.py"] and validation == []
    # site-packages can hold ten times the library's files: the skipped folders are never listed, and the
    # validation split reuses the train split's listing
    assert sorted(scanned) == [tmp_path, tmp_path / "pkg"]


# -- bad input: one line naming the file or key ----------------------------------------------------------


def one_line_error(cfg: DataConfig, tok=None) -> str:
    with pytest.raises(DataError) as err:
        build_dataloader(cfg, tok or byte_tokenizer(), batch_size=2, num_workers=2)
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_missing_path(tmp_path):
    missing = tmp_path / "nowhere" / "docs.parquet"
    assert one_line_error(DataConfig(source=str(missing))) == f"data.source: no such file or folder: {missing}"
    with pytest.raises(DataError, match=r"^data.tokenizer: no such file: .*/nothing.json$"):
        load_tokenizer(tmp_path / "nothing.json")


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.parquet"])
def test_empty_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"")
    assert one_line_error(DataConfig(source=str(path))) == f"{path}: empty file"
    if name.endswith(".parquet"):  # a valid parquet file with no rows
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
        assert one_line_error(DataConfig(source=str(path))) == f"{path}: empty file (0 rows)"
    else:  # blank lines only
        path.write_text("\n\n")
        assert one_line_error(DataConfig(source=str(path))) == f"{path}: empty file (no records)"


def test_no_text_column(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_parquet(folder / "train-0.parquet", ["fine"])
    pq.write_table(pa.table({"id": ["1"], "content": ["x"]}), folder / "train-1.parquet")
    message = one_line_error(DataConfig(source=str(folder)))
    assert message == f"{folder / 'train-1.parquet'}: no 'text' column (data.text_column); columns: id, content"
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text('{"body": "x"}\n')
    assert (
        one_line_error(DataConfig(source=str(jsonl)))
        == f"{jsonl}: no 'text' key (data.text_column) in the first record; keys: body"
    )


def test_non_utf8_file(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good, bad = b'{"text": "ok"}\n', '{"text": "café"}\n'.encode("latin-1")
    path.write_bytes(good + bad)
    at = len(good) + bad.index(b"\xe9")  # the Latin-1 é
    assert one_line_error(DataConfig(source=str(path))) == f"{path}: not UTF-8 (byte {at}: invalid continuation byte)"
    fake = tmp_path / "text.parquet"
    fake.write_bytes("not parquet: é".encode("latin-1"))
    assert one_line_error(DataConfig(source=str(fake))).startswith(f"{fake}: not a parquet file (")


def test_vocab_mismatch_names_the_key():
    with pytest.raises(
        DataError, match=r"^model.vocab_size: the model's vocabulary is 49152 but the tokenizer has 257 tokens"
    ):
        check_vocab(byte_tokenizer(), 49152, "model.vocab_size")


@pytest.mark.slow
def test_prepared_shards_give_the_same_windows(shared_dir, tmp_path):
    (tmp_path / "docs").mkdir()
    source = write_parquet(tmp_path / "docs" / "train-0.parquet", fineweb_texts(shared_dir, 8))
    tokenizer = str(shared_dir / "tokenizers/starcoder/tokenizer.json")
    prepare = [REPO / "data/prepare.py", "--source", source.parent, "--tokenizer", tokenizer]
    done = run(*prepare, "--out", tmp_path / "prepared", "--docs-per-shard", "3", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "prepared").iterdir()) == [f"train-0000{i}.parquet" for i in range(3)]
    tok = starcoder(shared_dir)
    on_the_fly = stream_of(
        build_dataloader(DataConfig(source=str(source), seq_len=50), tok, 2, num_workers=0, cycle=False)
    )
    prepared_cfg = DataConfig(source=str(tmp_path / "prepared"), text_column="input_ids", seq_len=50)
    prepared = stream_of(build_dataloader(prepared_cfg, tok, 2, num_workers=0, cycle=False))
    assert torch.equal(on_the_fly, prepared)


@pytest.mark.slow
def test_malformed_jsonl_line_after_the_first_is_one_line_naming_file_and_line(tmp_path):
    source = tmp_path / "docs.jsonl"
    good = [f'{{"text": "document {i} ' + "abc " * 50 + '"}' for i in range(40)]
    source.write_text("\n".join(good[:30] + ['{"text": "cut off', *good[30:]]) + "\n")
    done = run(*smoke_training(tmp_path / "run", f"data.source={source}", "data.num_workers=2", "train.max_steps=50"))
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"ladder-train: error: {source}: line 31 is not JSON (Invalid control character at column 18); "
        "expected one JSON object per line"
    )


def test_data_notes_come_from_rank_zero_once(tmp_path, monkeypatch, caplog):
    from ladder_train.config import DataConfig
    from ladder_train.data import build_dataloader, byte_tokenizer, load_tokenizer

    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "hello"}\n')
    cfg = DataConfig(source=str(source), tokenizer="byte", seq_len=4)
    for rank, expected in (("3", 0), ("0", 1)):
        monkeypatch.setenv("RANK", rank)
        caplog.clear()
        for _ in range(2):  # the validation loader opens the source again at every validation
            build_dataloader(cfg, byte_tokenizer(), 1, num_workers=0)
            load_tokenizer(cfg.tokenizer)
        corpus = [r for r in caplog.records if r.getMessage().startswith(f"data: corpus = local {source}")]
        assert len(corpus) == expected, (rank, [r.getMessage() for r in caplog.records])


def test_a_document_whose_text_is_a_number_is_one_line_naming_file_and_line(tmp_path):
    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "hello there"}\n{"text": "more words"}\n{"text": 5}\n')
    cfg = DataConfig(source=str(source), tokenizer="byte", seq_len=4)
    with pytest.raises(DataError) as caught:
        list(build_dataloader(cfg, byte_tokenizer(), 1, num_workers=0, cycle=False))
    assert str(caught.value) == f"{source}: line 3: 'text' is a int, not text (data.text_column)"


def test_a_jsonl_column_of_token_ids_is_taken_as_it_is_and_checked_against_the_vocabulary(tmp_path):
    """docs/guide.md: a column of token id lists is taken as it is; an id past the vocabulary is one line."""
    from ladder_train.data.tokenize_files import prepare

    tok = byte_tokenizer()
    texts = ["hello there", "general kenobi", "a longer third document " * 3]
    as_text = write_jsonl(tmp_path / "text.jsonl", texts)
    as_ids = tmp_path / "ids.jsonl"
    as_ids.write_text("".join(json.dumps({"text": tok.encode(t).ids}) + "\n" for t in texts))

    def stream(source: Path) -> torch.Tensor:
        cfg = DataConfig(source=str(source), tokenizer="byte", seq_len=4)
        return stream_of(build_dataloader(cfg, tok, 1, num_workers=0, cycle=False))

    assert torch.equal(stream(as_ids), stream(as_text))
    prepare(str(as_text), tmp_path / "from_text", "byte")
    prepare(str(as_ids), tmp_path / "from_ids", "byte")
    for name in ("tokens.bin", "offsets.bin"):
        assert (tmp_path / "from_ids" / name).read_bytes() == (tmp_path / "from_text" / name).read_bytes()

    past = tmp_path / "past.jsonl"
    past.write_text(json.dumps({"text": [5, 6, 257]}) + "\n")
    with pytest.raises(
        DataError,
        match=rf"^{past}: a document of token ids holds id 257, outside the tokenizer's vocabulary \(0..256\)$",
    ):
        stream(past)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"text": [5, 6]}) + "\n" + json.dumps({"text": "words"}) + "\n")
    with pytest.raises(DataError, match=rf"^{mixed}: the column mixes texts and token id lists"):
        stream(mixed)
    floats = tmp_path / "floats.jsonl"
    floats.write_text(json.dumps({"text": [5.5, 6]}) + "\n")
    with pytest.raises(DataError, match=rf"^{floats}: 'text' holds list, not text or a list of token ids"):
        stream(floats)
