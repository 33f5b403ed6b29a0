"""One engine step's layout in host ints: where each of its token rows lives in the paged KV cache.

A step's rows are first one row per decoding sequence, then the prefill chunks
of any number of sequences, concatenated (varlen). Every sequence brings its
*block table* (``harness.engine.kv_blocks``): token ``p`` of it lives in cache
slot ``table[p // block_size] * block_size + p % block_size``. Everything the
model needs to size a step's work is here, on the host, so a step never reads a
device value back (see ``harness.engine.opcount``);
``harness.engine.model.Transformer.stage`` turns a plan into device tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Chunk:
    """A prefill chunk: ``length`` tokens of the sequence with block table ``blocks`` at
    positions [start, start+length); ``blocks`` covers at least [0, start+length)."""

    blocks: Sequence[int]
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class StepPlan:
    """The layout of a step's rows in host ints: B decode rows, then each chunk's rows.

    Decode row b is the newest token of the sequence with block table
    ``decode_blocks[b]``, at ``decode_positions[b]`` (it attends to positions
    [0, decode_positions[b]]).
    """

    decode_blocks: list[Sequence[int]] = field(default_factory=list)
    decode_positions: list[int] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def n_decode(self) -> int:
        return len(self.decode_blocks)

    @property
    def n_rows(self) -> int:
        return self.n_decode + sum(c.length for c in self.chunks)

    @property
    def max_len(self) -> int:
        """The longest KV length among the decode rows."""
        return max(self.decode_positions) + 1 if self.decode_positions else 0

    @property
    def chunk_width(self) -> int:
        """The longest chunk: every chunk's queries are padded to it, for one attention call."""
        return max((c.length for c in self.chunks), default=0)

    @property
    def chunk_span(self) -> int:
        """The longest KV length among the chunks (the furthest chunk end)."""
        return max((c.end for c in self.chunks), default=0)

    def index_lists(self, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(cache slot of each row, position of each row, decode block tables, chunk block tables,
        padded query row of each chunk row).

        Tables are flat, one row per decode (chunk) padded with block 0 to the longest
        one's blocks: positions past a sequence's own are never visible to its queries.
        Chunk c's rows sit at [c * chunk_width, c * chunk_width + length) of the padded queries.
        """
        bs = block_size
        slots, positions = [], []
        nb_d = _ceil_div(self.max_len, bs)
        decode_tables = np.zeros((self.n_decode, nb_d), dtype=np.int64)
        for b, (blocks, p) in enumerate(zip(self.decode_blocks, self.decode_positions, strict=True)):
            slots.append(blocks[p // bs] * bs + p % bs)
            positions.append(p)
            n = min(len(blocks), nb_d)
            decode_tables[b, :n] = blocks[:n]
        head = [np.asarray(slots, dtype=np.int64)], [np.asarray(positions, dtype=np.int64)]
        nb_c = _ceil_div(self.chunk_span, bs)
        width = self.chunk_width
        chunk_tables = np.zeros((len(self.chunks), nb_c), dtype=np.int64)
        dst = []
        for i, c in enumerate(self.chunks):
            table = np.asarray(c.blocks[:nb_c], dtype=np.int64)
            chunk_tables[i, : len(table)] = table
            pos = np.arange(c.start, c.end, dtype=np.int64)
            head[0].append(table[pos // bs] * bs + pos % bs)
            head[1].append(pos)
            dst.append(np.arange(i * width, i * width + c.length, dtype=np.int64))
        cat = np.concatenate
        return (
            cat(head[0]),
            cat(head[1]),
            decode_tables.reshape(-1),
            chunk_tables.reshape(-1),
            cat(dst) if dst else np.zeros(0, dtype=np.int64),
        )

    def last_rows(self) -> list[int]:
        """The row of each chunk's last token."""
        rows, at = [], self.n_decode
        for c in self.chunks:
            at += c.length
            rows.append(at - 1)
        return rows

    def check(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        if len(self.decode_blocks) != len(self.decode_positions):
            raise ValueError(f"{len(self.decode_blocks)} decode tables but {len(self.decode_positions)} positions")
        for c in self.chunks:
            if c.length <= 0 or c.start < 0 or c.end > max_model_len:
                raise ValueError(f"prefill chunk [{c.start}, {c.end}) outside [0, {max_model_len})")
        for p in self.decode_positions:
            if not 0 <= p < max_model_len:
                raise ValueError(f"decode position {p} outside [0, {max_model_len})")
        spans = [(t, p + 1) for t, p in zip(self.decode_blocks, self.decode_positions, strict=True)]
        spans += [(c.blocks, c.end) for c in self.chunks]
        for table, end in spans:
            if len(table) * block_size < end:
                raise ValueError(f"a block table of {len(table)} blocks does not cover {end} positions")
            if len(table) and not (min(table) >= 0 and max(table) < num_blocks):
                raise ValueError(f"a block id outside [0, {num_blocks})")
        # The block each sequence writes first: two sequences writing one block is a scheduler bug
        # (shared prefix blocks are full and only read).
        written = [t[p // block_size] for t, p in zip(self.decode_blocks, self.decode_positions, strict=True)]
        written += [c.blocks[c.start // block_size] for c in self.chunks]
        if len(set(written)) != len(written):
            raise ValueError("two sequences of one step write the same KV block")
