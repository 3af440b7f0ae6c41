"""Texts to token ids, a long text in pieces: one ``encode`` of a whole document keeps about 250 bytes per token
inside ``tokenizers`` (its pre-tokenized splits, their alignments and the ``Encoding``) until it returns, so one long
line could take gigabytes (docs/guide.md, "Token folders", measures it). A text longer than ``PIECE_CHARS`` is cut
into pieces of about that many characters, encoded ``PIECES_PER_ENCODE`` at a time into int32 arrays and joined.

The cuts change no token: they are made only where the tokenizer's own splitting would split anyway, for the
tokenizers whose splitting is known (``cut_rule``): no normalizer, no post-processor that adds tokens, no
truncation or padding, and a pre-tokenizer of GPT-2's byte-level regex (``ByteLevel``, ``use_regex``, no prefix
space), alone or in a ``Sequence`` with ``Digits`` (StarCoder's). That regex's pieces are a contraction (``'s``,
``'re`` ...), a run of letters, of digits or of other non-space characters, each after at most one space, or a run
of whitespace; it looks at most one character ahead, and never behind. Between two printable ASCII characters of
different kinds (letter, digit, other), the first not an apostrophe, a piece always ends: the run holding the first
stops there in the whole text as at the end of the first piece, and the regex starts afresh at the second as at the
start of the next piece. ``Digits`` splits at a digit anyway. A cut must not fall inside an added token
(``<fim_prefix>`` holds such a boundary) and none may be ``single_word`` (its match looks behind). Other tokenizers,
and a long text with no such boundary, are encoded whole.
"""

from __future__ import annotations

import json
import re

import numpy as np
from tokenizers import Tokenizer

PIECE_CHARS = 1 << 17  # a piece's characters (some 30 MB inside tokenizers while it is encoded)
PIECES_PER_ENCODE = 2  # pieces per encode_batch_fast call

_LETTER, _DIGIT = "A-Za-z", "0-9"
_OTHER = r"!-/:-@\[-`{-~"  # printable ASCII that is neither letter, digit nor space
_OTHER_NO_APOSTROPHE = r"!-&(-/:-@\[-`{-~"
# the position between two printable ASCII characters of different kinds, the first not an apostrophe
_BOUNDARY = re.compile(
    rf"(?<=[{_LETTER}])(?=[{_DIGIT}{_OTHER}])"
    rf"|(?<=[{_DIGIT}])(?=[{_LETTER}{_OTHER}])"
    rf"|(?<=[{_OTHER_NO_APOSTROPHE}])(?=[{_LETTER}{_DIGIT}])"
)


def _regex_splitting(pre_tokenizer: dict) -> bool:
    """Whether a pre-tokenizer (its JSON) is GPT-2's byte-level regex, alone or with Digits in a Sequence."""
    parts = pre_tokenizer.get("pretokenizers", []) if pre_tokenizer.get("type") == "Sequence" else [pre_tokenizer]
    kinds = [part.get("type") for part in parts]
    byte_level = [part for part in parts if part.get("type") == "ByteLevel"]
    return (
        len(byte_level) == 1
        and set(kinds) <= {"ByteLevel", "Digits"}
        and byte_level[0].get("use_regex") is True
        and byte_level[0].get("add_prefix_space") is False
    )


def cut_rule(tokenizer: Tokenizer) -> list[str] | None:
    """The added tokens' texts (a cut must not fall inside one) when a text may be cut between ASCII characters of
    different kinds without changing its tokens (module docstring); None when the tokenizer's splitting is not
    known to allow it."""
    if tokenizer.normalizer is not None or tokenizer.truncation is not None or tokenizer.padding is not None:
        return None
    if tokenizer.pre_tokenizer is None or not _regex_splitting(json.loads(tokenizer.pre_tokenizer.__getstate__())):
        return None
    if tokenizer.post_processor is not None:
        if json.loads(tokenizer.post_processor.__getstate__()).get("type") != "ByteLevel":  # it only moves offsets
            return None
    added = list(tokenizer.get_added_tokens_decoder().values())
    if any(token.single_word for token in added):
        return None
    return [token.content for token in added]


def pieces(text: str, added: list[str], size: int = PIECE_CHARS) -> list[tuple[int, int]]:
    """(start, end) of the pieces ``text`` is cut into: each cut at the first boundary (module docstring) at least
    ``size`` characters after the last one and inside no added token's text; one piece when there is none."""
    spans, start = [], 0
    while start + size < len(text):
        cut = _next_cut(text, start + size, added)
        if cut is None:
            break
        spans.append((start, cut))
        start = cut
    spans.append((start, len(text)))
    return spans


def _next_cut(text: str, at: int, added: list[str]) -> int | None:
    while (found := _BOUNDARY.search(text, at)) is not None:
        cut = found.start()
        if not any(token in text[max(cut - len(token) + 1, 0) : cut + len(token) - 1] for token in added):
            return cut
        at = cut + 1
    return None


def text_ids(texts: list[str], tokenizer: Tokenizer) -> list[np.ndarray]:
    """Each text's token ids (int32), as ``tokenizer.encode_batch_fast(texts)`` gives them; a text longer than
    ``PIECE_CHARS`` encoded in pieces where the tokenizer allows it (module docstring)."""
    added = cut_rule(tokenizer) if any(len(text) > PIECE_CHARS for text in texts) else None
    long = {i for i, text in enumerate(texts) if added is not None and len(text) > PIECE_CHARS}
    short = [i for i in range(len(texts)) if i not in long]
    ids: list[np.ndarray | None] = [None] * len(texts)
    for i, encoding in zip(short, tokenizer.encode_batch_fast([texts[i] for i in short]), strict=True):
        ids[i] = np.asarray(encoding.ids, dtype=np.int32)
    for i in long:
        ids[i] = _pieces_ids(texts[i], tokenizer, added)
    return ids


def _pieces_ids(text: str, tokenizer: Tokenizer, added: list[str]) -> np.ndarray:
    spans, parts = pieces(text, added), []
    for first in range(0, len(spans), PIECES_PER_ENCODE):
        batch = [text[start:end] for start, end in spans[first : first + PIECES_PER_ENCODE]]
        parts += [np.asarray(encoding.ids, dtype=np.int32) for encoding in tokenizer.encode_batch_fast(batch)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
