"""The loaders of token folders (token_files.py): training micro-batches in the global order (global_order.py) and
validation windows in file order.

Training (:class:`TokenFileLoader`) yields this rank's micro-batches of global batch b, b + 1, ... Its position is
one number, the global batches consumed, the same on every rank: its global state in the ``MicroBatchLoader`` sense
(protocol.py), which the trainer keeps in its own checkpoint entry (saved once, restored at any world size).
:meth:`TokenFileLoader.load_global_state` refuses a resume whose seed, mixture, folders, global batch or sequence
length differ (one line naming what changed). Reading is a pread of each window (token_files.py), in the trainer's
process: no worker processes and no per-rank state.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from tokenizers import Tokenizer

from ..config import DataConfig
from ..errors import DataError
from .global_order import GlobalOrder
from .mixture import Mixture
from .sources import note
from .token_files import TokenFolder, check_tokenizer, open_token_folder

log = logging.getLogger(__name__)

KIND = "token_files"  # the trainer entry's data state of this loader
VALIDATION_NEEDED = (
    "data.validation_source: required for a validation loss when training on token folders (they hold one split): "
    "prepare one with ladder-data prepare SOURCE DIR --split validation and set data.validation_source=DIR"
)


def _open(path, where: str, tokenizer: Tokenizer, tokenizer_name: str, window: int) -> TokenFolder:
    folder = open_token_folder(path, where)
    check_tokenizer(folder, tokenizer, tokenizer_name)
    if folder.n_instances(window) == 0:
        raise DataError(
            f"{where}: {folder.path} holds {folder.n_tokens:,} tokens, fewer than one window of data.seq_len + 1 = "
            f"{window}"
        )
    return folder


def _as_batch(windows) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of a stack of windows, as collate_windows gives them."""
    batch = torch.from_numpy(windows)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


class TokenFileLoader:
    """This rank's micro-batches of the global order of ``folders`` mixed by ``weights`` (an endless iterable)."""

    def __init__(
        self,
        folders,
        weights,
        names,
        seq_len: int,
        seed: int,
        global_batch: int,
        micro_batch: int,
        rank: int = 0,
        world: int = 1,
    ):
        if global_batch % (micro_batch * world):
            raise DataError(
                f"train.global_batch_size={global_batch} is not a multiple of micro-batch {micro_batch} x {world} ranks"
            )
        self.folders, self.weights, self.window = list(folders), list(weights), seq_len + 1
        self.seq_len, self.seed, self.micro_batch, self.rank, self.world = seq_len, seed, micro_batch, rank, world
        self.mixture = Mixture(self.weights, global_batch, [f"{name}.weight" for name in names])
        self.order = GlobalOrder([f.n_instances(self.window) for f in self.folders], self.mixture, seed)
        self.global_batches = 0  # consumed: global batches whose every micro-batch this rank has handed out
        self._taken = 0  # micro-batches of the current global batch handed out

    @property
    def accumulation(self) -> int:
        return self.mixture.global_batch // (self.micro_batch * self.world)

    def read(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The (inputs, labels) of instances ``ids``, (source, instance) rows, in that order."""
        windows = np.empty((len(ids), self.window), dtype=np.int64)
        for k, folder in enumerate(self.folders):
            mine = np.flatnonzero(ids[:, 0] == k)
            if len(mine):
                windows[mine] = folder.windows(ids[mine, 1], self.window)
        return _as_batch(windows)

    def __iter__(self):
        while True:
            part = self.order.rank_part(self.global_batches, self.rank, self.world)
            for micro in range(self._taken, self.accumulation):
                self._taken = micro + 1
                if self._taken == self.accumulation:  # counted before the yield: the step that takes it saves it
                    self.global_batches, self._taken = self.global_batches + 1, 0
                yield self.read(part[micro * self.micro_batch : (micro + 1) * self.micro_batch])

    def close(self) -> None:
        """No worker processes to stop: the folders' open files are closed."""
        for folder in self.folders:
            folder.close()

    def describe(self) -> str:
        return f"the token-file order continues at global batch {self.global_batches + 1}, as on any world size"

    # the position: global, in the trainer entry ------------------------------------------------------------

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: dict | None) -> None:
        """Nothing per rank: the position is global."""

    def global_state(self) -> dict:
        """The data position and what it is a position in; the same on every rank."""
        if self._taken:
            raise RuntimeError("the token-file loader's state is asked for in the middle of a global batch")
        sources = [
            {"path": str(f.path), "weight": w, "meta_sha256": f.meta_sha256, "tokens": f.n_tokens}
            for f, w in zip(self.folders, self.weights, strict=True)
        ]
        return {
            "kind": KIND,
            "global_batches": self.global_batches,
            "seed": self.seed,
            "global_batch_size": self.mixture.global_batch,
            "seq_len": self.seq_len,
            "sources": sources,
        }

    def load_global_state(self, state: dict | None) -> None:
        """Continue at the saved global batch; a changed seed, mixture, folder, global batch or sequence length is
        refused in one line naming it (a silent change would repeat or skip instances)."""
        if not isinstance(state, dict) or state.get("kind") != KIND:
            raise DataError(
                "data: the checkpoint holds no token-file data position (it was trained on another data setup); "
                "resume with its data.* or start from its weights with checkpoint.load_model_only=true"
            )
        now = self.global_state() | {"global_batches": state["global_batches"]}
        checked = (("seed", "run.seed"), ("global_batch_size", "train.global_batch_size"), ("seq_len", "data.seq_len"))
        for key, name in checked:
            if state[key] != now[key]:
                raise DataError(
                    f"{name}: the checkpoint's token-file order was drawn with {name}={state[key]}, this run has "
                    f"{now[key]}; resume with {name}={state[key]} (another would repeat and skip instances)"
                )
        _same_sources(state["sources"], now["sources"])
        self.global_batches, self._taken = int(state["global_batches"]), 0


def _same_sources(saved: list[dict], now: list[dict]) -> None:
    def mix(sources):
        return ", ".join(f"{s['path']} ({s['weight']:g})" for s in sources)

    if [s["weight"] for s in saved] != [s["weight"] for s in now]:
        raise DataError(
            f"data.sources: the checkpoint's mixture was {mix(saved)}, this run's is {mix(now)}; resume "
            "with the same sources and weights"
        )
    for k, (old, new) in enumerate(zip(saved, now, strict=True)):
        if old["meta_sha256"] != new["meta_sha256"]:
            raise DataError(
                f"data.sources[{k}].path: {new['path']} holds other token files ({new['tokens']:,} tokens) than the "
                f"checkpoint's {old['path']} ({old['tokens']:,} tokens; another {old['meta_sha256'][:12]})"
            )


def refuse_stream_resume(state: dict | None) -> None:
    """A run reading documents on the fly cannot continue a checkpoint's token-file order: refused in one line
    (its stream would start again from the beginning and repeat what the token files gave)."""
    if isinstance(state, dict) and state.get("kind") == KIND:
        raise DataError(
            f"data: the checkpoint was trained on token folders ({state['global_batches']} global batches read); "
            "resume with the same data.source / data.sources folders, or start from its weights with "
            "checkpoint.load_model_only=true"
        )


class TokenWindows:
    """Validation: a token folder's windows in file order, rank r taking windows r, r + R, ...; micro-batches of
    ``batch_size``, the last partial one dropped; ``cycle`` starts again at the end."""

    def __init__(self, folder: TokenFolder, seq_len: int, batch_size: int, rank: int, world: int, cycle: bool):
        self.folder, self.window, self.batch_size, self.cycle = folder, seq_len + 1, batch_size, cycle
        self.indices = np.arange(rank, folder.n_instances(self.window), world)
        if len(self.indices) < batch_size:
            raise DataError(
                f"data.validation_source: {folder.path} holds {folder.n_instances(self.window)} windows of "
                f"{self.window} tokens, fewer than one batch of {batch_size} for each of {world} ranks"
            )

    def __iter__(self):
        while True:
            for start in range(0, len(self.indices) - self.batch_size + 1, self.batch_size):
                yield _as_batch(self.folder.windows(self.indices[start : start + self.batch_size], self.window))
            if not self.cycle:
                return

    def close(self) -> None:
        """No worker processes to stop: the folder's open file is closed."""
        self.folder.close()

    def describe(self) -> str:
        return f"the validation windows of {self.folder.path} in file order"

    # no position to keep: validation reads the same windows every time

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: dict | None) -> None:
        """Nothing to restore."""

    def global_state(self) -> None:
        return None

    def load_global_state(self, state: dict | None) -> None:
        """Nothing to restore."""


def token_loader(
    data_cfg: DataConfig,
    tokenizer: Tokenizer,
    source,
    training: bool,
    batch_size: int,
    dp_rank: int,
    dp_world_size: int,
    seed: int,
    global_batch_size: int | None,
    cycle: bool,
) -> TokenFileLoader | TokenWindows:
    """The loader of ``build_dataloader`` for token folders: the training mixture (``data.sources``, or the one folder
    ``data.source``) in the global order, or a validation folder in file order."""
    if data_cfg.format != "text":
        raise DataError(f"data.format: token folders hold text tokens; {data_cfg.format} data is read on the fly")
    window = data_cfg.seq_len + 1
    if not training:
        if not data_cfg.validation_source:  # the training folder itself: validating on training data
            raise DataError(VALIDATION_NEEDED)
        folder = _open(source, "data.validation_source", tokenizer, data_cfg.tokenizer, window)
        return TokenWindows(folder, data_cfg.seq_len, batch_size, dp_rank, dp_world_size, cycle)
    entries = list(data_cfg.sources)
    if entries:
        names = [f"data.sources[{k}]" for k in range(len(entries))]
        paths, weights = [e.path for e in entries], [e.weight for e in entries]
    else:
        names, paths, weights = ["data.source"], [source], [1.0]
    folders = [
        _open(p, f"{n}.path" if entries else n, tokenizer, data_cfg.tokenizer, window)
        for p, n in zip(paths, names, strict=True)
    ]
    global_batch = global_batch_size or batch_size * dp_world_size
    loader = TokenFileLoader(
        folders, weights, names, data_cfg.seq_len, seed, global_batch, batch_size, dp_rank, dp_world_size
    )
    for folder, share in zip(folders, loader.mixture.shares, strict=True):
        note(
            log,
            "data: token folder %s: %s tokens, %s instances of %d tokens, %.1f%% of each global batch",
            folder.path,
            f"{folder.n_tokens:,}",
            f"{folder.n_instances(window):,}",
            window,
            100 * share,
        )
    return loader
