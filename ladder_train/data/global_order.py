"""The global order of token-file instances: which instances make global batch b, independent of the world size.

An *instance* is a window of ``seq_len + 1`` tokens cut from a token folder's stream: instance i of a folder is
tokens ``[i W, (i + 1) W)`` with ``W = seq_len + 1`` (documents keep their separators, as in the packing path; the
last partial window is never read). A folder of N instances is read epoch after epoch, each epoch in its own
permutation of ``0 .. N-1`` drawn from ``(run.seed, source number, epoch)``.

Global batch b is a fixed set of G (``train.global_batch_size``) instances: the mixture (mixture.py) says how
many come from each source, each source gives the next ones of its permuted stream, and the G are then placed in
a permutation of the batch drawn from ``(run.seed, b)``, so micro-batches mix the sources. Data-parallel rank r of
R takes positions ``[r G / R, (r + 1) G / R)`` of it, its micro-batches in order. Nothing here depends on R, so a
run resumed on any world size continues at the next global batch with exactly the instances an uninterrupted run
would have read.

The permutations are Feistel networks over the next power of 4 with cycle walking (a bijection of
``0 .. N-1`` computed per element: no N-sized array, whatever N), hashed with splitmix64 in integer arithmetic of
our own, so the order does not change with a numpy version.
"""

from __future__ import annotations

import numpy as np

from .mixture import Mixture

_MASK64 = (1 << 64) - 1
ROUNDS = 6


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _round_keys(key: tuple[int, ...]) -> list[np.uint64]:
    """ROUNDS 64-bit keys from a tuple of non-negative integers."""
    state = np.zeros(1, dtype=np.uint64)
    for part in key:
        state = _mix64(state ^ np.uint64(int(part) & _MASK64))
    keys = []
    for _ in range(ROUNDS):
        state = _mix64(state)
        keys.append(state[0])
    return keys


def permute(positions, n: int, key: tuple[int, ...]) -> np.ndarray:
    """Where a bijection of ``0 .. n-1`` chosen by ``key`` sends ``positions`` (each in ``0 .. n-1``)."""
    positions = np.asarray(positions, dtype=np.uint64)
    if n <= 0 or (positions.size and int(positions.max()) >= n):
        raise ValueError(f"positions must lie in [0, {n})")
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)
    keys = _round_keys(key)

    def encrypt(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for k in keys:
            left, right = right, left ^ (_mix64(right ^ k) & mask)
        return (left << shift) | right

    out = encrypt(positions)
    outside = out >= np.uint64(n)
    while outside.any():  # cycle walking: the domain is up to 4n, so a few rounds on average
        out[outside] = encrypt(out[outside])
        outside = out >= np.uint64(n)
    return out.astype(np.int64)


class GlobalOrder:
    """The instances of every global batch of a mixture of sources with ``sizes[k]`` instances each."""

    def __init__(self, sizes: list[int], mixture: Mixture, seed: int):
        if len(sizes) != len(mixture.units):
            raise ValueError("one size per source of the mixture")
        self.sizes, self.mixture, self.seed = list(sizes), mixture, seed
        self.global_batch = mixture.global_batch

    def _stream(self, source: int, start: int, count: int) -> np.ndarray:
        """Instances ``start .. start + count - 1`` of source ``source``'s stream (its epochs' permutations)."""
        size = self.sizes[source]
        positions = np.arange(start, start + count, dtype=np.int64)
        epochs, within = np.divmod(positions, size)
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs).tolist():
            here = epochs == epoch
            out[here] = permute(within[here], size, (self.seed, source, epoch))
        return out

    def batch(self, b: int) -> np.ndarray:
        """Global batch ``b`` as a (G, 2) int64 array of (source, instance), in its within-batch order."""
        before, counts = self.mixture.consumed(b), self.mixture.counts(b)
        parts = [
            np.stack([np.full(count, k, dtype=np.int64), self._stream(k, before[k], count)], axis=1)
            for k, count in enumerate(counts)
            if count
        ]
        ids = np.concatenate(parts)
        return ids[permute(np.arange(self.global_batch), self.global_batch, (self.seed, 1 << 40, b))]

    def rank_part(self, b: int, rank: int, world: int) -> np.ndarray:
        """Data-parallel rank ``rank`` of ``world``: its contiguous share of global batch ``b``."""
        per_rank = self.global_batch // world
        return self.batch(b)[rank * per_rank : (rank + 1) * per_rank]
