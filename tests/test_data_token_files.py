"""Token folders (``ladder-data prepare``, data/token_files.py) and their global order (data/global_order.py,
data/mixture.py, data/token_loader.py): the folder is the packing path's stream, the same for any worker count;
the instances of each global batch do not depend on the world size, so a run stopped on 4 ranks and resumed on 2
reads what an uninterrupted 4-rank run reads; a 0.7 / 0.3 mixture keeps its shares; bad folders, weights and
resumes are refused in one line naming the file or key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from dist_utils import run_ranks

from ladder_train.config import DataConfig, load_config
from ladder_train.data import MicroBatchLoader, build_dataloader, byte_tokenizer
from ladder_train.data.global_order import GlobalOrder, permute
from ladder_train.data.mixture import Mixture
from ladder_train.data.token_files import OFFSETS_NAME, TOKEN_FOLDER_META, TOKENS_NAME, open_token_folder, token_dtype
from ladder_train.data.token_loader import TokenFileLoader, TokenWindows, refuse_stream_resume
from ladder_train.data.tokenize_files import prepare
from ladder_train.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
SEQ = 16  # windows of 17 tokens


def random_texts(n: int, seed: int) -> list[str]:
    """Documents of random lowercase words (so every window of the stream is distinct)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return [
        " ".join("".join(rng.choice(letters, rng.integers(1, 9))) for _ in range(rng.integers(3, 40))) for _ in range(n)
    ]


def write_source(folder: Path, texts: list[str], files: int) -> Path:
    """A local jsonl source of ``files`` files (the source's shards), the texts in order across them."""
    folder.mkdir(parents=True)
    for index, chunk in enumerate(np.array_split(np.array(texts, dtype=object), files)):
        (folder / f"docs-{index}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in chunk))
    return folder


def instance_map(folder: Path) -> dict[bytes, int]:
    """Window contents -> instance number of a token folder (windows of SEQ + 1 tokens)."""
    tokens = open_token_folder(folder).tokens
    windows = np.asarray(tokens[: len(tokens) // (SEQ + 1) * (SEQ + 1)], dtype=np.int64).reshape(-1, SEQ + 1)
    found = {row.tobytes(): i for i, row in enumerate(windows)}
    assert len(found) == len(windows)  # every window distinct: contents name the instance
    return found


def ids_of(batch, lookup: dict[bytes, int]) -> list[int]:
    inputs, labels = batch
    assert torch.equal(inputs[:, 1:], labels[:, :-1])
    windows = torch.cat([inputs, labels[:, -1:]], dim=1).numpy()
    return [lookup[row.astype(np.int64).tobytes()] for row in windows]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two token folders made with the byte tokenizer: A (1,200 documents in 3 files) and B (400 in 2)."""
    root = tmp_path_factory.mktemp("token_files")
    texts = {"a": random_texts(1200, 1), "b": random_texts(400, 2)}
    folders = {}
    for name, files in (("a", 3), ("b", 2)):
        source = write_source(root / f"src_{name}", texts[name], files)
        prepare(str(source), root / name, "byte", workers=1)
        folders[name] = root / name
    return {"root": root, "texts": texts, **folders}


def mixture_cfg(sources: str) -> DataConfig:
    """The data config of ``data.sources=SOURCES`` (a YAML list of {path, weight}), byte tokens."""
    return load_config(None, [f"data.sources={sources}", "data.tokenizer=byte", f"data.seq_len={SEQ}"]).data


def data_cfg(**fields) -> DataConfig:
    return DataConfig(tokenizer="byte", seq_len=SEQ, **fields)


def rank_loaders(cfg, world: int, micro: int, global_batch: int, seed: int = 0) -> list[TokenFileLoader]:
    tok = byte_tokenizer()
    return [
        build_dataloader(cfg, tok, micro, dp_rank=r, dp_world_size=world, seed=seed, global_batch_size=global_batch)
        for r in range(world)
    ]


def step_sets(loaders, steps: int, lookup) -> list[set[int]]:
    """The instances each step's global batch consumed, over all ranks (each rank its micro-batches of the step)."""
    iters = [iter(loader) for loader in loaders]
    out = []
    for _ in range(steps):
        seen: list[int] = []
        for it, loader in zip(iters, loaders, strict=True):
            for _ in range(loader.accumulation):
                seen += ids_of(next(it), lookup)
        assert len(seen) == len(set(seen))  # no instance twice in a global batch
        out.append(set(seen))
    return out


# -- the folder ------------------------------------------------------------------------------------------


def test_prepare_writes_the_packing_stream_with_its_metadata(corpus):
    tok = byte_tokenizer()
    texts = corpus["texts"]["a"]
    expected = [i for t in texts for i in tok.encode(t).ids + [0]]
    folder = open_token_folder(corpus["a"])
    assert isinstance(folder.tokens, np.memmap) and folder.tokens.dtype == np.dtype("<u2")
    assert folder.tokens.tolist() == expected
    lengths = [len(tok.encode(t).ids) + 1 for t in texts]
    assert folder.offsets().tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
    meta = json.loads((corpus["a"] / TOKEN_FOLDER_META).read_text())
    assert meta["tokens"] == len(expected) and meta["documents"] == 1200 and meta["dtype"] == "uint16"
    assert meta["separator_id"] == 0 and meta["source"]["shards"] == 3 and meta["max_token_id"] == max(expected)
    assert meta["tokenizer"]["name"] == "byte" and meta["tokenizer"]["vocab_size"] == 257
    assert len(meta["tokenizer"]["sha256"]) == 64


@pytest.mark.slow
def test_prepare_gives_the_same_files_for_any_worker_count(corpus, tmp_path):
    source = corpus["root"] / "src_a"
    prepare(str(source), tmp_path / "three", "byte", workers=3)  # three processes, one file each
    for name in (TOKENS_NAME, OFFSETS_NAME, TOKEN_FOLDER_META):
        assert (tmp_path / "three" / name).read_bytes() == (corpus["a"] / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / "three").iterdir()) == sorted(
        [TOKENS_NAME, OFFSETS_NAME, TOKEN_FOLDER_META]
    )


def test_uint32_when_the_vocabulary_does_not_fit_uint16(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    assert token_dtype(65536) == "uint16" and token_dtype(65537) == "uint32"
    vocab = {"<|endoftext|>": 0, **{f"w{i}": i for i in range(1, 70000)}}
    Tokenizer(WordLevel(vocab, unk_token="w1")).save(str(tmp_path / "tokenizer.json"))
    docs = [[69999, 5, 65536], [1, 2]]  # pre-tokenized documents (a column of id lists)
    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))}), tmp_path / "src/x.parquet")
    meta = prepare(str(tmp_path / "src"), tmp_path / "out", str(tmp_path / "tokenizer.json"), text_column="input_ids")
    folder = open_token_folder(tmp_path / "out")
    assert meta["dtype"] == "uint32" and folder.tokens.dtype == np.dtype("<u4") and meta["max_token_id"] == 69999
    assert folder.tokens.tolist() == [69999, 5, 65536, 0, 1, 2, 0]


def test_the_loader_benchmark_reads_what_it_times(tmp_path, capsys):
    from benchmarks.token_files import main

    out = tmp_path / "rows.jsonl"
    main(
        [
            "--tokens",
            "100000",
            "--seq-len",
            "16",
            "--global-batch",
            "8",
            "--micro-batch",
            "2",
            "--world-sizes",
            "1",
            "4",
            "--min-sequences",
            "16",
            "--out",
            str(out),
        ]
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["world_size"], r["sequences"], r["steps"]) for r in rows] == [(1, 24, 3), (4, 16, 8)]
    assert all(r["tokens"] == r["sequences"] * 16 and r["gpu_estimate"]["estimate"] for r in rows)
    flops = 6 * 1_208_083_968 + 12 * 40 * 1536 * 16  # the 1.2B preset's matmul parameters, its attention at seq 16
    assert rows[0]["gpu_estimate"]["flops_per_token"] == flops
    assert rows[0]["gpu_estimate"]["tokens_per_s_gpu"] == pytest.approx(0.5 * 989.4e12 / flops)
    assert "ESTIMATE (computed, not measured)" in capsys.readouterr().out


# -- the global order ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 1000, 4097])
def test_the_permutation_is_a_bijection_chosen_by_its_key(n):
    one = permute(np.arange(n), n, (0, 0, 0))
    assert sorted(one.tolist()) == list(range(n))
    if n >= 17:
        assert one.tolist() != list(range(n))
        assert one.tolist() != permute(np.arange(n), n, (1, 0, 0)).tolist()  # another seed
        assert one.tolist() != permute(np.arange(n), n, (0, 0, 1)).tolist()  # another epoch


def test_every_instance_once_per_epoch_then_a_new_permutation():
    n, g = 96, 8  # 12 global batches per epoch
    order = GlobalOrder([n], Mixture([1.0], g), seed=3)
    epochs = [np.concatenate([order.batch(b)[:, 1] for b in range(e * 12, (e + 1) * 12)]) for e in range(2)]
    assert sorted(epochs[0].tolist()) == sorted(epochs[1].tolist()) == list(range(n))  # each instance once
    assert epochs[0].tolist() != epochs[1].tolist()  # each epoch in its own order
    uneven = GlobalOrder([100], Mixture([1.0], g), seed=3)  # an epoch ends inside global batch 12
    counts = np.bincount(np.concatenate([uneven.batch(b)[:, 1] for b in range(25)]), minlength=100)
    assert counts.tolist() == [2] * 100  # 200 positions = two epochs, each instance twice


def test_four_ranks_read_the_instances_one_rank_reads(corpus):
    lookup = instance_map(corpus["a"])
    cfg = data_cfg(source=str(corpus["a"]))
    one = step_sets(rank_loaders(cfg, 1, 4, 16), 12, lookup)  # 4 micro-batches of 4 per step
    four = step_sets(rank_loaders(cfg, 4, 2, 16), 12, lookup)  # 2 micro-batches of 2 per rank per step
    assert four == one
    assert all(len(s) == 16 for s in one)
    assert len(set().union(*one)) == 12 * 16  # nothing read twice within the epoch
    assert one != step_sets(rank_loaders(cfg, 1, 4, 16, seed=1), 12, lookup)  # the seed draws the order


def test_stopped_on_four_ranks_resumed_on_two_continues_the_global_batches(corpus):
    lookup = instance_map(corpus["a"])
    cfg = data_cfg(source=str(corpus["a"]))
    k, n = 5, 12
    uninterrupted = step_sets(rank_loaders(cfg, 4, 1, 8), n, lookup)
    first = rank_loaders(cfg, 4, 1, 8)
    before = step_sets(first, k, lookup)
    states = [loader.global_state() for loader in first]
    assert all(state == states[0] for state in states) and states[0]["global_batches"] == k
    second = rank_loaders(cfg, 2, 2, 8)
    for loader in second:
        loader.load_global_state(json.loads(json.dumps(states[0])))  # as the trainer entry stores it (JSON)
    after = step_sets(second, n - k, lookup)
    assert before + after == uninterrupted
    consumed = [i for s in before + after for i in s]
    assert len(consumed) == len(set(consumed)) == n * 8  # none repeated, none skipped
    # as the trainer sees it: a MicroBatchLoader whose position is global, none per rank
    assert isinstance(second[0], MicroBatchLoader) and second[0].state_dict() is None
    assert second[0].describe() == f"the token-file order continues at global batch {n + 1}, as on any world size"


def test_validation_windows_are_split_over_ranks_in_file_order(corpus):
    folder = open_token_folder(corpus["b"])
    windows = [TokenWindows(folder, SEQ, 3, r, 2, cycle=False) for r in range(2)]
    lookup = instance_map(corpus["b"])
    assert isinstance(windows[0], MicroBatchLoader) and windows[0].global_state() is None
    read = [[i for batch in w for i in ids_of(batch, lookup)] for w in windows]
    n = folder.n_instances(SEQ + 1)
    assert read[0] == list(range(0, n, 2))[: len(read[0])] and read[1] == list(range(1, n, 2))[: len(read[1])]
    assert len(read[0]) == len(range(0, n, 2)) // 3 * 3  # the last partial batch dropped


# -- the mixture -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("weights", [[0.7, 0.3], [1.0, 2.0, 3.5], [0.123, 0.456, 0.2, 0.221]])
def test_mixture_counts_stay_within_one_instance_of_the_shares(weights):
    g = 64
    mixture = Mixture(weights, g)
    shares = np.array(weights) / sum(weights)
    previous = np.zeros(len(weights), dtype=np.int64)
    for b in range(1, 3000):
        consumed = np.array(mixture.consumed(b))
        assert consumed.sum() == b * g
        assert (consumed >= previous).all()  # counts never go back
        assert np.abs(consumed - b * g * shares).max() < 1
        previous = consumed
    assert sum(mixture.counts(17)) == g


def test_a_07_03_mixture_gives_those_shares_over_a_long_run(corpus):
    """4,000 instances (500 steps of 8 on 2 ranks). Drawn independently, source A's count would be binomial
    (n = 4,000, p = 0.7): sd sqrt(n p (1 - p)) = 29 instances, so +/- 3 sd = +/- 87 (2.2 share points). The
    quota method holds it to +/- 1 instance at every global batch boundary, asserted here (with the 3 sd bound
    beside it); neither source repeats an instance within its epoch."""
    lookup_a, lookup_b = instance_map(corpus["a"]), instance_map(corpus["b"])
    lookup = {key: ("a", i) for key, i in lookup_a.items()} | {key: ("b", i) for key, i in lookup_b.items()}
    cfg = mixture_cfg(f"[{{path: {corpus['a']}, weight: 0.7}}, {{path: {corpus['b']}, weight: 0.3}}]")
    assert cfg.source is None
    loaders = rank_loaders(cfg, 2, 2, 8)
    iters = [iter(loader) for loader in loaders]
    read = []
    for step in range(1, 501):
        for it in iters:
            for _ in range(2):
                read += ids_of(next(it), lookup)
        count_a = sum(1 for source, _ in read if source == "a")
        assert abs(count_a - 0.7 * 8 * step) <= 1
    n = len(read)
    count_a = sum(1 for source, _ in read if source == "a")
    assert n == 4000 and abs(count_a - 2800) <= 1 and abs(count_a - 0.7 * n) <= 3 * (n * 0.21) ** 0.5
    for name in ("a", "b"):  # less than an epoch of either: no instance twice
        mine = [i for source, i in read if source == name]
        assert len(set(mine)) == len(mine) < open_token_folder(corpus[name]).n_instances(SEQ + 1)


# -- bad input -------------------------------------------------------------------------------------------


def test_a_folder_made_with_another_tokenizer_is_refused(corpus, shared_dir):
    from ladder_train.data import load_tokenizer

    starcoder = str(shared_dir / "tokenizers/starcoder/tokenizer.json")
    cfg = DataConfig(source=str(corpus["a"]), tokenizer=starcoder, seq_len=SEQ)
    with pytest.raises(DataError) as caught:
        build_dataloader(cfg, load_tokenizer(starcoder), 2, global_batch_size=2)
    message = str(caught.value)
    assert message.startswith(f"{corpus['a'] / TOKEN_FOLDER_META}: tokenized with 'byte' (257 tokens, sha256 ")
    assert f"but data.tokenizer is '{starcoder}' (49152 tokens" in message and "\n" not in message


def copy_folder(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in (TOKENS_NAME, OFFSETS_NAME, TOKEN_FOLDER_META):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def test_truncated_or_inconsistent_folders_are_refused_naming_the_file(corpus, tmp_path):
    cut = copy_folder(corpus["b"], tmp_path / "cut")
    size = (cut / TOKENS_NAME).stat().st_size
    os.truncate(cut / TOKENS_NAME, size - 10)
    with pytest.raises(
        DataError, match=rf"^{cut / TOKENS_NAME}: {size - 10:,} bytes, but {TOKEN_FOLDER_META} says .* \(truncated\)$"
    ):
        open_token_folder(cut)

    counted = copy_folder(corpus["b"], tmp_path / "counted")
    meta = json.loads((counted / TOKEN_FOLDER_META).read_text())
    (counted / TOKEN_FOLDER_META).write_text(json.dumps({**meta, "tokens": meta["tokens"] + 5}))
    with pytest.raises(DataError, match=rf"^{counted / TOKENS_NAME}: .* \(truncated\)$"):
        open_token_folder(counted)

    offsets = copy_folder(corpus["b"], tmp_path / "offsets")
    values = np.fromfile(offsets / OFFSETS_NAME, dtype="<i8")
    values[-1] -= 3
    values.tofile(offsets / OFFSETS_NAME)
    with pytest.raises(DataError, match=rf"^{offsets / OFFSETS_NAME}: the offsets run from 0 to [\d,]+, but"):
        open_token_folder(offsets)

    shuffled = copy_folder(corpus["b"], tmp_path / "shuffled")
    values = np.fromfile(shuffled / OFFSETS_NAME, dtype="<i8")
    values[[3, 4]] = values[[4, 3]]
    values.tofile(shuffled / OFFSETS_NAME)
    open_token_folder(shuffled)  # training checks the first and last offsets only (it reads no other)
    with pytest.raises(DataError, match=rf"^{shuffled / OFFSETS_NAME}: offset 4 \(\d+\) is below offset 3"):
        open_token_folder(shuffled, every_offset=True)  # ladder-data info reads them all

    short = copy_folder(corpus["b"], tmp_path / "short")
    os.truncate(short / OFFSETS_NAME, 8 * 10)
    with pytest.raises(
        DataError, match=rf"^{short / OFFSETS_NAME}: 80 bytes, but {TOKEN_FOLDER_META} says 401 offsets"
    ):
        open_token_folder(short)

    unfinished = copy_folder(corpus["b"], tmp_path / "unfinished")
    (unfinished / TOKEN_FOLDER_META).unlink()
    with pytest.raises(DataError, match=rf"^{unfinished}: no {TOKEN_FOLDER_META}: not a token folder"):
        open_token_folder(unfinished)


def test_mixture_keys_are_checked_before_anything_runs(corpus, tmp_path):
    a, b = corpus["a"], corpus["b"]
    for weight in ("0", "-0.5"):
        with pytest.raises(
            ConfigError, match=rf"^key 'data.sources\[1\].weight' must be a finite number > 0, got {weight}"
        ):
            load_config(None, [f"data.sources=[{{path: {a}, weight: 0.7}}, {{path: {b}, weight: {weight}}}]"])
    with pytest.raises(ConfigError, match=r"^keys 'data.source' and 'data.sources' are both set"):
        load_config(None, [f"data.sources=[{{path: {a}}}]", f"data.source={b}"])
    with pytest.raises(ConfigError, match=r"^key 'data.source' is null and data.sources is empty"):
        load_config(None, ["data.source=null"])
    with pytest.raises(ConfigError, match=r"^key 'data.sources\[0\].path' is empty"):
        load_config(None, ["data.sources=[{weight: 1.0}]"])
    with pytest.raises(ConfigError, match=r"^key 'eval.val_every'=5 needs data.validation_source"):
        load_config(None, [f"data.sources=[{{path: {a}}}]", "eval.val_every=5"])
    missing = mixture_cfg(f"[{{path: {a}}}, {{path: {tmp_path / 'nowhere'}}}]")
    with pytest.raises(DataError, match=rf"^data.sources\[1\].path: no such folder: {tmp_path / 'nowhere'}$"):
        build_dataloader(missing, byte_tokenizer(), 2, global_batch_size=2)
    with pytest.raises(DataError, match=r"^data.sources\[1\].weight: 0.001 is a share of 0.000999, under one instance"):
        Mixture([1.0, 0.001], 512)


def test_a_resume_that_changes_the_seed_mixture_or_folder_is_refused(corpus, tmp_path):
    cfg = mixture_cfg(f"[{{path: {corpus['a']}, weight: 0.7}}, {{path: {corpus['b']}, weight: 0.3}}]")
    saved = rank_loaders(cfg, 1, 2, 4)[0].global_state()
    with pytest.raises(
        DataError, match=r"^run.seed: the checkpoint's token-file order was drawn with run.seed=0, this run has 1"
    ):
        rank_loaders(cfg, 1, 2, 4, seed=1)[0].load_global_state(saved)
    with pytest.raises(DataError, match=r"^train.global_batch_size: .* with train.global_batch_size=4, this run has 8"):
        rank_loaders(cfg, 1, 2, 8)[0].load_global_state(saved)
    reweighted = mixture_cfg(f"[{{path: {corpus['a']}, weight: 0.6}}, {{path: {corpus['b']}, weight: 0.4}}]")
    with pytest.raises(
        DataError,
        match=rf"^data.sources: the checkpoint's mixture was {corpus['a']} \(0.7\), {corpus['b']} \(0.3\), this run's is .*\(0.6\)",
    ):
        rank_loaders(reweighted, 1, 2, 4)[0].load_global_state(saved)
    other = tmp_path / "other"
    prepare(str(corpus["root"] / "src_a" / "docs-0.jsonl"), other, "byte")
    swapped = mixture_cfg(f"[{{path: {corpus['a']}, weight: 0.7}}, {{path: {other}, weight: 0.3}}]")
    with pytest.raises(DataError, match=rf"^data.sources\[1\].path: {other} holds other token files"):
        rank_loaders(swapped, 1, 2, 4)[0].load_global_state(saved)
    moved = copy_folder(corpus["b"], tmp_path / "moved")  # the same files elsewhere: allowed
    same = mixture_cfg(f"[{{path: {corpus['a']}, weight: 0.7}}, {{path: {moved}, weight: 0.3}}]")
    loader = rank_loaders(same, 1, 2, 4)[0]
    loader.load_global_state({**saved, "global_batches": 7})
    assert loader.global_batches == 7
    with pytest.raises(DataError, match=r"^data: the checkpoint holds no token-file data position"):
        loader.load_global_state(None)
    # the other direction: a run reading documents on the fly cannot continue the token-file order
    with pytest.raises(
        DataError, match=r"^data: the checkpoint was trained on token folders \(7 global batches read\)"
    ):
        refuse_stream_resume({**saved, "global_batches": 7})
    refuse_stream_resume(None)  # nothing to refuse


@pytest.mark.slow
def test_the_cli_refuses_a_mismatched_folder_before_training(corpus, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "ladder_train.train",
        "--config",
        str(REPO / "recipes/smoke.yaml"),
        f"run.dir={tmp_path / 'run'}",
        f"data.source={corpus['a']}",
        "data.tokenizer=../shared/tokenizers/starcoder/tokenizer.json",
        "model.vocab_size=49152",
    ]
    if not (REPO.parent / "shared/tokenizers/starcoder/tokenizer.json").is_file():
        pytest.skip("../shared not found: the StarCoder tokenizer is needed")
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    expected = f"ladder-train: error: {corpus['a'] / TOKEN_FOLDER_META}: tokenized with 'byte'"
    assert last.startswith(expected), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


# -- end to end: the trainer on 4 ranks, stopped, resumed on 2 -----------------------------------------------


def _train_recording(run_dir: str, folder: str, steps: int, every: int) -> tuple[list[list[int]], list[float]]:
    """Train the tiny model on token files; returns the instances of each step this rank consumed and the losses."""
    import torch.distributed as dist

    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    lookup = instance_map(Path(folder))
    env = init_distributed()
    cfg = load_config(
        None,
        [
            f"run.dir={run_dir}",
            f"data.source={folder}",
            "data.tokenizer=byte",
            f"data.seq_len={SEQ}",
            "model.vocab_size=257",
            "model.dim=32",
            "model.n_layers=2",
            "model.n_heads=4",
            "model.ffn_dim=64",
            f"model.max_seq_len={SEQ}",
            "train.global_batch_size=8",
            "train.micro_batch_size=1",
            f"train.max_steps={steps}",
            "train.dtype=fp32",
            "train.schedule.warmup_steps=1",
            "train.schedule.total_steps=10",
            f"checkpoint.every={every}",
            "checkpoint.keep=0",
            "wandb.mode=disabled",
            "eval.at_end=false",
        ],
    )
    trainer = Trainer(cfg, env)
    per_step: list[list[int]] = []
    take = trainer._next_micro_batch

    def recording():
        batch = take()
        if not per_step or len(per_step[-1]) == trainer.batch.per_rank:
            per_step.append([])
        per_step[-1] += ids_of(batch, lookup)
        return batch

    trainer._next_micro_batch = recording
    try:
        losses = [record["loss"] for record in trainer.train()]
    finally:
        dist.destroy_process_group()
    return per_step, losses


@pytest.mark.slow
def test_trainer_stopped_on_four_ranks_resumes_on_two_with_the_same_global_batches(corpus, tmp_path):
    folder, k, n = str(corpus["a"]), 2, 4
    whole = run_ranks(_train_recording, 4, str(tmp_path / "whole"), folder, n, 0)
    expected = [set().union(*(ids[s] for ids, _ in whole)) for s in range(n)]
    stopped = run_ranks(_train_recording, 4, str(tmp_path / "cut"), folder, k, k)  # checkpoint at step k
    resumed = run_ranks(_train_recording, 2, str(tmp_path / "cut"), folder, n, 0)  # resumes step k on 2 ranks
    got = [set().union(*(ids[s] for ids, _ in stopped)) for s in range(k)]
    got += [set().union(*(ids[s] for ids, _ in resumed)) for s in range(n - k)]
    assert got == expected
    # the same batches train the same: fp32, only the reduction order differs between 4 and 2 ranks
    assert resumed[0][1] == pytest.approx(whole[0][1][k:], rel=1e-5)
    assert all(len(s) == 8 for s in got)
    consumed = [i for s in got for i in s]
    assert len(consumed) == len(set(consumed))  # none repeated
    from ladder_train.checkpoint.safe_load import read_trainer_state

    saved = [read_trainer_state(tmp_path / "cut/checkpoints" / f"step-{s}") for s in (k, n)]
    assert [state["data"]["global_batches"] for state in saved] == [k, n]  # saved once, in the trainer entry
    assert [state["world_size"] for state in saved] == [4, 2]
