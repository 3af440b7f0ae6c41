"""``data.*``: where the training documents come from, how they are tokenized, packed and loaded, and the rules
among those fields (one source or a mixture, a chat template for chat data, a token folder named by its folder)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..folders import token_folder_of
from .schema import MAX_WAIT_S, bounded, choice


@dataclass
class WeightedSource:
    """One entry of ``data.sources``: a token folder (ladder-data prepare) and its weight in the mixture."""

    path: str = ""  # a token folder
    weight: float = 1.0  # its share of every global batch is weight / the sum of the weights


@dataclass
class DataConfig:
    # a hub dataset name, a local parquet/jsonl file or folder (train-*/validation-* names pick the split),
    # python-stdlib (the running Python's .py files: offline smoke runs), or a token folder (ladder-data prepare:
    # read with pread in a global order independent of the world size); null when data.sources is set
    source: str | None = "HuggingFaceFW/fineweb-edu"
    # a mixture of token folders instead of data.source: [{path: DIR, weight: 0.7}, ...], sampled to those shares
    # in every global batch (data/mixture.py); data.source is then unset (null)
    sources: list[WeightedSource] = field(default_factory=list)
    hub_config: str | None = "sample-10BT"  # the hub dataset's config name (ignored for local files)
    # the split trained on: a hub dataset's split name, or the train-* / validation-* files of a local folder
    split: str = "train"
    text_column: str = "text"  # the documents' column; input_ids for shards pre-tokenized by data/prepare.py
    tokenizer: str = "bigcode/starcoder"  # a hub tokenizer name, a local tokenizer.json path, or byte (257 tokens)
    # tokens per training sequence; windows of seq_len + 1 are cut from the stream
    seq_len: int = bounded(2048, lambda v: v >= 1, "at least 1")
    # data loader worker processes per rank (tokenization runs there); 0 = in the trainer
    num_workers: int = bounded(2, lambda v: v >= 0, ">= 0 (0 = tokenize in the trainer)")
    # seconds the trainer waits for a worker's next batch before stopping with an error: a stuck worker (one
    # waiting on a hung file system, say) then ends the run for a restart instead of idling it; 0 = wait forever
    worker_timeout_s: int = bounded(600, lambda v: 0 <= v <= MAX_WAIT_S, f"in [0, {MAX_WAIT_S}] (0 = wait forever)")
    # documents are shuffled in consecutive blocks of this many (per loader worker, seeded by run.seed and the
    # epoch; resumes exactly); 0 = file order
    shuffle_buffer: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = no shuffling)")
    # held-out documents for eval.val_every (its validation split); None = data.source's
    validation_source: str | None = None
    # text: documents, every token scored (pretraining) | chat: conversations (a 'messages' column of
    # {role, content} lists) rendered with data.chat_template, the loss on assistant tokens only (SFT)
    format: str = choice("text", ("text", "chat"))
    # chat: a model folder whose tokenizer_config.json holds the chat template (e.g. ${checkpoint.init_from})
    chat_template: str | None = None


def check_data(d: DataConfig) -> None:
    """data.source or data.sources (a mixture of token folders), exactly one; positive weights; a chat template for
    chat data; a token folder named by its folder, not one of its files."""
    if d.format == "chat" and not d.chat_template:
        raise ConfigError(
            "key 'data.chat_template' is required with data.format=chat: a model folder whose tokenizer_config.json "
            "holds the chat template"
        )
    if d.sources and d.source is not None:
        raise ConfigError(
            f"keys 'data.source' and 'data.sources' are both set (data.source={d.source}): use one; set "
            "data.source=null to train on the mixture"
        )
    if not d.sources and d.source is None:
        raise ConfigError("key 'data.source' is null and data.sources is empty: set one of them")
    for k, entry in enumerate(d.sources):
        if not entry.path:
            raise ConfigError(f"key 'data.sources[{k}].path' is empty: give each source a token folder")
        if not (math.isfinite(entry.weight) and entry.weight > 0):
            raise ConfigError(f"key 'data.sources[{k}].weight' must be a finite number > 0, got {entry.weight!r}")
    if d.sources and d.format != "text":
        raise ConfigError(f"key 'data.sources' holds token folders of text; data.format={d.format} is read on the fly")
    for key, path in token_folder_keys(d):
        folder = token_folder_of(path)
        if folder is not None:
            raise ConfigError(
                f"key '{key}'={path} is a file of the token folder {folder}: give the folder, {key}={folder}"
            )


def token_folder_keys(d: DataConfig) -> list[tuple[str, str]]:
    """(key, path) of every place a token folder may be named."""
    keys = [("data.source", d.source), ("data.validation_source", d.validation_source)]
    keys += [(f"data.sources[{k}].path", entry.path) for k, entry in enumerate(d.sources)]
    return [(key, str(path)) for key, path in keys if path]
