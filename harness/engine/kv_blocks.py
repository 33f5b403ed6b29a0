"""The paged KV cache's bookkeeping: a pool of fixed-size blocks, and prefix caching by block hash.

The cache holds ``num_blocks`` blocks of ``block_size`` tokens (the model's tensors,
``harness.engine.model``); a request owns a *block table*, the list of its blocks in
position order, so token ``p`` lives in block ``table[p // block_size]`` at offset
``p % block_size``. Nothing here touches a tensor: the scheduler decides, the model reads
the tables.

Prefix caching: a block whose every token has been computed gets a digest of its token
ids chained with its parent block's digest (and of any image its positions hold, so a
multimodal prompt never matches a text one with the same placeholder ids). Equal digests
mean equal KV, so a later request whose prompt starts with the same tokens reuses those
blocks instead of computing them. A block nobody uses any more stays in the free queue
with its digest: it is reused when hit again, and evicted (its digest dropped)
least-recently-freed first when a new block is needed.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.engine.vision import raw_pixels

BlockHash = bytes


@dataclass(frozen=True)
class ImageSpan:
    """An image's placeholder range in a prompt and a digest of its pixels."""

    offset: int
    length: int
    digest: bytes


def image_digest(item: Any) -> bytes:
    """A digest of an image's pixels as they arrived (the same bytes give the same embeddings)."""
    raw = raw_pixels(item)
    data = raw.data.contiguous()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{raw.kind}:{data.dtype}:{tuple(data.shape)}".encode())
    h.update(data.view(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


def block_hash(
    parent: BlockHash | None, tokens: Sequence[int] | np.ndarray, start: int, images: Sequence[ImageSpan]
) -> BlockHash:
    """The digest of the block holding ``tokens`` at positions [start, start+len) after ``parent``.

    Images overlapping the block add their digest and where they start relative to it.
    """
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    end = start + len(tokens)
    for im in images:
        if im.offset < end and im.offset + im.length > start:
            h.update(im.digest)
            h.update((im.offset - start).to_bytes(8, "little", signed=True))
    return h.digest()


class BlockPool:
    """Blocks with reference counts, a free queue in eviction order, and the digest -> block map."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"the KV cache needs a block of a token at least, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.digest: list[BlockHash | None] = [None] * num_blocks
        # Blocks with no user, oldest-freed first; cached ones among them are evicted in that order.
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[BlockHash, int] = {}
        self.evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks a request could take now (unused, cached or not)."""
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks from the free queue's head, their old digests dropped; ValueError if too few."""
        if n > len(self.free):
            raise ValueError(f"{n} blocks asked, {len(self.free)} free")
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            d = self.digest[b]
            if d is not None:
                self.digest[b] = None
                if self.cached.get(d) == b:
                    del self.cached[d]
                self.evictions += 1
            self.ref[b] = 1
            out.append(b)
        return out

    def lookup(self, digest: BlockHash) -> int | None:
        return self.cached.get(digest)

    def take(self, b: int) -> None:
        """One more user of cached block ``b`` (out of the free queue if it was idle)."""
        if self.ref[b] == 0:
            del self.free[b]
        self.ref[b] += 1

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one user of each block; idle blocks join the free queue's tail, the last block first,
        so a prompt's tail is evicted before its (more shared) head."""
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def cache(self, b: int, digest: BlockHash) -> None:
        """Record that block ``b`` holds the KV ``digest`` names (a full, computed block)."""
        if self.digest[b] is not None:
            return
        if digest in self.cached:  # the same tokens computed twice at once: keep the first
            return
        self.digest[b] = digest
        self.cached[digest] = b
