"""Chat data (``data.format: chat``): conversations -> token ids and a loss mask, rendered with a model's chat
template (``data.chat_template``, read by :func:`ladder_train.data.chat.load_chat_template`).

A row's ``messages`` is a list of ``{"role": ..., "content": ...}`` messages. The conversation is rendered
prefix by prefix, so that the text of message ``i`` is ``render(messages[:i + 1])`` minus ``render(messages[:i])``
(an empty prefix renders as nothing). An assistant message's text is split once more, at the end of
``render(messages[:i], add_generation_prompt=True)``: before it is the turn's header (``<|im_start|>assistant\\n``
in ChatML), after it everything the model must generate, the content and the template's closing text of the
turn (``<|im_end|>\\n`` in ChatML). The mask rule:

- the tokens after an assistant header are targets: their labels are the tokens themselves;
- every other token (system and user messages, any other role, the role headers, whatever the template adds
  around them, and the ``<|endoftext|>`` that ends each conversation) is a context token: label -100.

Each piece is tokenized on its own (without the tokenizer's post-processor: the template writes any BOS itself)
and the pieces are concatenated, so a target never shares a token with the context before it. A template that
does not render conversations prefix by prefix (one that rewrites earlier turns once a later one exists) cannot
be split this way and is refused, as is a row without a ``messages`` list or a message without string
``role`` and ``content``: one DataError line, nothing skipped. A conversation without an assistant message is
valid; its tokens are all context.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain

import numpy as np
from tokenizers import Tokenizer

from ..errors import DataError, InputError
from .chat import ChatTemplate, load_chat_template

CHAT_COLUMN = "messages"  # the conversations' column in chat mode
ASSISTANT = "assistant"  # the role whose messages are the targets


class BadConversation(ValueError):
    """A row that cannot be rendered; the message is the reason, without where the row is (the caller knows)."""


def conversation_problem(messages) -> str | None:
    """Why ``messages`` is not a conversation (one short phrase), or None if it is one."""
    if messages is None:
        return f"no '{CHAT_COLUMN}' list (data.format=chat)"
    if not isinstance(messages, list):
        return f"'{CHAT_COLUMN}' holds {type(messages).__name__}, not a list of {{role, content}} messages"
    if not messages:
        return f"'{CHAT_COLUMN}' is an empty list"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"message {i} is {type(message).__name__}, not a {{role, content}} object"
        for key in ("role", "content"):
            value = message.get(key)
            if value is None:
                return f"message {i} has no '{key}'"
            if not isinstance(value, str):
                return f"message {i} '{key}' holds {type(value).__name__}, not text"
    return None


def load_template(folder: str) -> ChatTemplate:
    """``data.chat_template``'s template; a missing folder or template is one DataError line naming the key."""
    try:
        return load_chat_template(folder)
    except InputError as err:
        raise DataError(f"data.chat_template: {err}") from None


class ConversationEncoder:
    """Conversations -> (token ids, target mask) under one chat template (the module docstring's rule)."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, eos_id: int):
        self.template = template
        self.tokenizer = tokenizer
        self.eos_id = eos_id

    def _render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        try:
            return self.template.render(messages, add_generation_prompt=add_generation_prompt)
        except InputError as err:  # the template refused the conversation (raise_exception: roles must alternate...)
            roles = ", ".join(m["role"] for m in messages)
            raise BadConversation(f"{err} (roles: {roles})") from None

    def pieces(self, messages: list[dict]) -> list[tuple[str, bool]]:
        """The rendered conversation as consecutive (text, is_target) pieces; their texts join to
        ``render(messages)``. Raises BadConversation for a row that is no conversation or a template that does
        not render prefix by prefix."""
        if problem := conversation_problem(messages):
            raise BadConversation(problem)
        # null fields are what a columnar file writes for keys other rows have (a parquet struct): not this row's
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        out: list[tuple[str, bool]] = []
        done = ""  # render(messages[:i])
        for i, message in enumerate(messages):
            rendered = self._render(messages[: i + 1])
            if message["role"] == ASSISTANT:
                header = self._render(messages[:i], add_generation_prompt=True)
                if not (header.startswith(done) and rendered.startswith(header)):
                    raise self._not_prefix(i, message, "the conversation up to the assistant header")
                out += [(header[len(done) :], False), (rendered[len(header) :], True)]
            else:
                if not rendered.startswith(done):
                    raise self._not_prefix(i, message, "the conversation")
                out.append((rendered[len(done) :], False))
            done = rendered
        return [(text, target) for text, target in out if text]

    def _not_prefix(self, i: int, message: dict, what: str) -> BadConversation:
        return BadConversation(
            f"message {i} ({message['role']}): the chat template {self.template.source} does not render {what} "
            "prefix by prefix, so the loss mask cannot be cut out of it"
        )

    def encode(self, conversations: Iterable[list[dict]]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int32) of the conversations, each followed by ``<|endoftext|>``, and the target mask (bool,
        same length): True where the token is a target. One tokenizer call for all pieces."""
        per_conversation = [self.pieces(messages) for messages in conversations]
        pieces = list(chain.from_iterable(per_conversation))
        encodings = self.tokenizer.encode_batch_fast([text for text, _ in pieces], add_special_tokens=False)
        ids: list[list[int]] = []
        targets: list[list[bool]] = []
        at = 0
        for conversation in per_conversation:
            for (_, target), encoding in zip(conversation, encodings[at : at + len(conversation)], strict=True):
                ids.append(encoding.ids)
                targets.append([target] * len(encoding.ids))
            at += len(conversation)
            ids.append([self.eos_id])
            targets.append([False])
        n = sum(map(len, ids))
        return (
            np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=n),
            np.fromiter(chain.from_iterable(targets), dtype=bool, count=n),
        )
