"""Data: the StarCoder tokenizer, streamed documents, packing into windows, the per-rank resumable loader.

tok = load_tokenizer(cfg.data.tokenizer)
check_vocab(tok, cfg.model.vocab_size)
loader = build_dataloader(cfg.data, tokenizer=tok, batch_size=micro, dp_rank=r, dp_world_size=w, seed=seed)
for inputs, labels in loader: ...          # LongTensor (batch, seq_len) each
state = loader.state_dict(); loader.load_state_dict(state)   # exact resume

Every loader ``build_dataloader`` returns is a :class:`MicroBatchLoader` (protocol.py): the micro-batches, its
position per rank (``state_dict``) or shared by every rank (``global_state``) and their restores, ``describe()``
and ``close()``; the trainer asks nothing else of its data.

With ``data.format: chat`` the documents are conversations and the labels are -100 except on the assistant's
tokens (conversations.py).

Token folders (``ladder-data prepare``: tokenize_files.py writes, token_files.py checks and maps) are read by
``build_dataloader`` too, through token_loader.py: a global order of instances (global_order.py) and a weighted
mixture (mixture.py, ``data.sources``) that do not depend on the world size; the position is
``loader.global_state()``, kept in the trainer's checkpoint entry.
"""

from .chat import ChatTemplate, load_chat_template
from .loader import PackedDataLoader, build_dataloader
from .model_files import run_tokenizer_config_folder, stop_tokens, tokenizer_config_folder
from .packing import PackedWindows, collate_windows
from .protocol import MicroBatchLoader, as_loader
from .sources import STDLIB_SOURCE, open_source
from .tokenizer import BYTE_TOKENIZER, byte_tokenizer, check_vocab, eos_id, load_tokenizer, model_tokenizer

__all__ = [
    "BYTE_TOKENIZER",
    "STDLIB_SOURCE",
    "ChatTemplate",
    "MicroBatchLoader",
    "PackedDataLoader",
    "PackedWindows",
    "as_loader",
    "build_dataloader",
    "byte_tokenizer",
    "check_vocab",
    "collate_windows",
    "eos_id",
    "load_chat_template",
    "load_tokenizer",
    "model_tokenizer",
    "open_source",
    "run_tokenizer_config_folder",
    "stop_tokens",
    "tokenizer_config_folder",
]
