"""The KV cache: the keys and values each attention layer has already computed, so that generating one more
token costs one position of work instead of the whole prefix.

It holds, for every layer, k and v of H_kv heads (H_kv = H for plain multi-head attention, fewer with grouped-query
attention): 2 x layers x positions x H_kv x D values per sequence, `kv_cache_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .config import GPTConfig


def kv_cache_bytes(config: GPTConfig, positions: int, batch: int = 1, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of keys and values cached for `positions` tokens of `batch` sequences:
    2 (k and v) x layers x positions x H_kv x D x bytes per value."""
    if positions < 0 or batch < 1:
        raise ValueError(f"expected positions >= 0 and batch >= 1, got positions={positions}, batch={batch}")
    per_value = torch.empty((), dtype=dtype).element_size()
    return 2 * config.n_layers * batch * positions * config.kv_heads * config.d_head * per_value


class LayerCache:
    """The keys and values one attention layer has seen so far: `k` and `v`, each (B, H_kv, T_past, D).

    They live in buffers of `capacity` positions (the model's context length), allocated at the first append,
    and each append writes only the new positions. Growing them with torch.cat instead would copy the whole cache
    at every generated token: 16% of the time of a 256-token generation on the benchmark's model.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.length = 0
        self._k: torch.Tensor | None = None  # (B, H, capacity, D)
        self._v: torch.Tensor | None = None

    @property
    def k(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[:, :, : self.length]  # (B, H, T_past, D)

    @property
    def v(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H, T, D) after the cached positions; return all keys and values (B, H, T_past + T, D)."""
        end = self.length + k.size(-2)
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; {end} would not fit")
        if self._k is None:
            b, h, _, d = k.shape
            self._k, self._v = k.new_empty(b, h, self.capacity, d), v.new_empty(b, h, self.capacity, d)
        self._k[:, :, self.length : end] = k
        self._v[:, :, self.length : end] = v
        self.length = end
        return self.k, self.v

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (indices into B) of the cached keys and values."""
        if self._k is not None and self._v is not None:
            self._k, self._v = self._k[rows], self._v[rows]  # (B', H, capacity, D)

    @property
    def nbytes(self) -> int:
        """Bytes held by the k and v buffers (all `capacity` positions, as allocated)."""
        return 0 if self._k is None else self._k.nbytes + self._v.nbytes


@dataclass
class KVCache:
    """One `LayerCache` per block; `length` is how many positions are cached."""

    layers: list[LayerCache] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int, capacity: int) -> KVCache:
        return cls([LayerCache(capacity) for _ in range(n_layers)])

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` in every layer, as when some sequences of a batch stop generating."""
        for layer in self.layers:
            layer.keep_rows(rows)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)
