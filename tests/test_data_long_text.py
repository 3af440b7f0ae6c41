"""A long text tokenized in pieces (data/long_text.py): the tokens of one encode of the whole text, in calls of a
few pieces each; tokenizers whose splitting is not known are encoded whole."""

from __future__ import annotations

import json
import os
import sysconfig

import numpy as np
import pyarrow.parquet as pq
import pytest
from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers

from ladder_train.data import byte_tokenizer, long_text
from ladder_train.data.long_text import PIECE_CHARS, PIECES_PER_ENCODE, cut_rule, pieces
from ladder_train.data.packing import document_ids

# contractions, digits, added tokens (each holding a boundary the cuts must not take), whitespace runs
SPECIAL = (
    "x<fim_prefix>y<|endoftext|>3<filename>a.py don't 12,345.67 it's  \n\n  'll ''s <gh_stars>10 "
    "Ωμέγα.日本 <fim_middle>"
)


@pytest.fixture
def starcoder(shared_dir) -> Tokenizer:
    return Tokenizer.from_file(str(shared_dir / "tokenizers/starcoder/tokenizer.json"))


@pytest.fixture
def texts(shared_dir) -> dict[str, str]:
    """Prose (FineWeb documents joined), code (the standard library's modules joined) and the special cases."""
    prose = pq.read_table(sorted((shared_dir / "data/fineweb").glob("train-*.parquet"))[0], columns=["text"])
    stdlib = sysconfig.get_paths()["stdlib"]
    modules = sorted(name for name in os.listdir(stdlib) if name.endswith(".py"))[:20]
    code = "\n".join(open(os.path.join(stdlib, name), encoding="utf-8", errors="replace").read() for name in modules)
    return {"prose": "".join(prose.column(0).to_pylist()[:150]), "code": code, "special": SPECIAL * 500}


def test_pieces_cut_anywhere_allowed_give_the_tokens_of_one_encode(starcoder, texts):
    added = cut_rule(starcoder)
    assert added is not None and "<fim_prefix>" in added  # StarCoder's splitting is GPT-2's regex after Digits
    for name, text in texts.items():
        text = text[:150_000]
        whole = starcoder.encode(text).ids
        for size in (7, 50, 1000):  # a cut at nearly every allowed place, then fewer
            spans = pieces(text, added, size)
            assert len(spans) > len(text) // (10 * size), (name, size)  # the text is cut, not encoded whole
            assert "".join(text[a:b] for a, b in spans) == text
            ids = [i for e in starcoder.encode_batch_fast([text[a:b] for a, b in spans]) for i in e.ids]
            assert ids == whole, (name, size)


def test_document_ids_of_short_and_long_texts_are_those_of_one_encode_each(starcoder, texts, monkeypatch):
    monkeypatch.setattr(long_text, "PIECE_CHARS", 64)
    docs = ["a short one", texts["special"], "", texts["prose"][:5000], "9" * 300]
    got = document_ids(docs, starcoder, starcoder.get_vocab_size(), "test")
    assert [doc.tolist() for doc in got] == [e.ids for e in starcoder.encode_batch_fast(docs)]
    assert all(doc.dtype == np.int32 for doc in got)


class Recorder:
    """A tokenizer that records the characters of each encode_batch_fast call."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def encode_batch_fast(self, texts):
        self.calls.append(sum(map(len, texts)))
        return self.tokenizer.encode_batch_fast(texts)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_a_long_text_is_encoded_a_few_pieces_at_a_time(starcoder, texts):
    """One document of 6 pieces: no encode call holds more than PIECES_PER_ENCODE pieces (about PIECE_CHARS each; one
    whole encode keeps about 250 bytes a token inside tokenizers), and the tokens are those of one whole encode."""
    text = (texts["prose"] * (1 + (6 * PIECE_CHARS) // len(texts["prose"])))[: 6 * PIECE_CHARS + 1000]
    recorder = Recorder(starcoder)
    (ids,) = document_ids([text], recorder, starcoder.get_vocab_size(), "test")
    assert len(recorder.calls) >= 3 and max(recorder.calls) <= PIECES_PER_ENCODE * (PIECE_CHARS + 100)
    assert np.array_equal(ids, np.asarray(starcoder.encode(text).ids, dtype=np.int32))


def test_a_tokenizer_whose_splitting_is_not_known_is_encoded_whole(starcoder):
    """The byte tokenizer (one split for the whole text), a normalizer, a prefix space, a single-word added token:
    cut_rule says no, and a long text goes to tokenizers in one call."""
    assert cut_rule(byte_tokenizer()) is None
    normalized = Tokenizer.from_str(starcoder.to_str())
    normalized.normalizer = normalizers.NFKC()
    prefixed = Tokenizer.from_str(starcoder.to_str())
    prefixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    word = Tokenizer.from_str(starcoder.to_str())
    word.add_tokens([AddedToken("ladder", single_word=True)])
    for tokenizer in (normalized, prefixed, word):
        assert cut_rule(tokenizer) is None
    recorder = Recorder(prefixed)
    text = SPECIAL * (2 * PIECE_CHARS // len(SPECIAL))
    document_ids([text], recorder, prefixed.get_vocab_size(), "test")
    assert recorder.calls == [len(text)]


def test_prepare_of_ordinary_and_long_documents_writes_each_ones_tokens(starcoder, texts, shared_dir, tmp_path):
    """ladder-data prepare with StarCoder: ordinary FineWeb documents and one long line, each document's tokens
    those of one encode, then the separator."""
    from ladder_train.data.tokenize_files import prepare

    table = pq.read_table(sorted((shared_dir / "data/fineweb").glob("train-*.parquet"))[1], columns=["text"])
    docs = table.column(0).to_pylist()[:100] + [texts["prose"][: 3 * PIECE_CHARS]]  # the last one cut in pieces
    assert len(docs[-1]) == 3 * PIECE_CHARS
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tokenizer_file = str(shared_dir / "tokenizers/starcoder/tokenizer.json")
    prepare(str(tmp_path / "docs.jsonl"), tmp_path / "out", tokenizer_file)
    separator = starcoder.token_to_id("<|endoftext|>")
    expected = [i for e in starcoder.encode_batch_fast(docs) for i in [*e.ids, separator]]
    assert np.fromfile(tmp_path / "out/tokens.bin", dtype=np.uint16).tolist() == expected
