"""A per-server prefix cache in the manner of vLLM's: full token blocks, hashed cumulatively.

Block i's hash covers block i's ids and the hash of block i-1, so a block hits only when its
whole prefix matches. A lookup returns the tokens of the longest run of cached leading blocks,
never the whole prompt: as in vLLM, the last prompt token is always computed again, for its
logits. Bounded to `capacity` blocks, least recently used evicted first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """LRU set of cumulative block hashes; counts in tokens, as vLLM's metrics do."""

    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, ids: Sequence[int]) -> int:
        """Return how many leading tokens of `ids` are cached, and mark those blocks used."""
        usable = (len(ids) - 1) // self.block_size  # the last token is always recomputed
        hits: list[int] = []
        for block in self._hashes(ids)[:usable]:
            if block not in self._blocks:
                break
            hits.append(block)
        self._touch(hits)
        return len(hits) * self.block_size

    def insert(self, ids: Sequence[int]) -> None:
        """Cache the full blocks of `ids` (computed tokens), evicting the least recently used."""
        if self.capacity <= 0:
            return
        self._touch(self._hashes(ids))
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def _touch(self, blocks: list[int]) -> None:
        # Last block first, so that a prefix outlives its extensions, as vLLM frees a
        # request's blocks in reverse order.
        for block in reversed(blocks):
            self._blocks[block] = None
            self._blocks.move_to_end(block)

    def _hashes(self, ids: Sequence[int]) -> list[int]:
        size, parent, out = self.block_size, 0, []
        for start in range(0, len(ids) - size + 1, size):
            parent = hash((parent, tuple(ids[start : start + size])))
            out.append(parent)
        return out
