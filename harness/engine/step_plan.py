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
from itertools import chain

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


def blocks_for(tokens: int, block_size: int) -> int:
    """How many blocks of ``block_size`` tokens hold ``tokens`` tokens (the last one maybe part full)."""
    return -(-tokens // block_size)


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
    # The decode rows' tables already as one array [B, width] padded with block 0, and their
    # lengths (a persistent batch's, whose block ids were checked as they arrived): when given,
    # ``decode_blocks`` is not converted again.
    decode_table: np.ndarray | None = None
    decode_table_lens: np.ndarray | None = None
    # (block size, decode tables, the block each decode row writes): gathered once, by whichever of
    # check() and index_lists() runs first; a plan is not changed between the two.
    _decode_gather: tuple[int, np.ndarray, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False
    )

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
        Built with whole-array numpy ops: no Python loop over rows or tokens.
        """
        bs = block_size
        dpos = np.asarray(self.decode_positions, dtype=np.int64)
        decode_tables, written = self._decode_written(bs)
        d_slots = written * bs + dpos % bs
        if not self.chunks:  # a pure decode step, the commonest: no chunk arrays to build
            none = np.zeros(0, dtype=np.int64)
            return d_slots, dpos, decode_tables.reshape(-1), none, none
        width = self.chunk_width
        chunk_tables = _padded([c.blocks for c in self.chunks], blocks_for(self.chunk_span, bs))
        starts = np.fromiter((c.start for c in self.chunks), np.int64, len(self.chunks))
        lengths = np.fromiter((c.length for c in self.chunks), np.int64, len(self.chunks))
        which, offset = _ragged_index(lengths)  # each chunk row's chunk, and its place in it
        c_pos = starts[which] + offset
        c_slots = chunk_tables[which, c_pos // bs] * bs + c_pos % bs
        return (
            np.concatenate([d_slots, c_slots]),
            np.concatenate([dpos, c_pos]),
            decode_tables.reshape(-1),
            chunk_tables.reshape(-1),
            which * width + offset,
        )

    def _decode_written(self, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The decode rows' tables [B, blocks of the longest], padded with block 0, and the block each
        row writes (its newest token's). Every table must cover its position (check() sees to it)."""
        if self._decode_gather is None or self._decode_gather[0] != block_size:
            dpos = np.asarray(self.decode_positions, dtype=np.int64)
            nb_d = blocks_for(self.max_len, block_size)
            if self.decode_table is None:
                tables = _padded(self.decode_blocks, nb_d)
            else:
                tables = np.ascontiguousarray(self.decode_table[:, :nb_d])
            self._decode_gather = (block_size, tables, tables[np.arange(len(dpos)), dpos // block_size])
        return self._decode_gather[1], self._decode_gather[2]

    def varlen_lists(self, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The step in FlashAttention's varlen convention, Q sequences: one per decode row (one
        query), then one per chunk, in row order: (cu_seqlens_q [Q+1], keys each sequence sees [Q]
        (its start plus its rows), cu_seqlens_k [Q+1] (those keys laid end to end), block tables
        [Q, blocks of the longest] flat, padded with block 0). Whole-array numpy ops, as
        ``index_lists``.
        """
        b, bs = self.n_decode, block_size
        starts = np.fromiter((c.start for c in self.chunks), np.int64, len(self.chunks))
        lengths = np.fromiter((c.length for c in self.chunks), np.int64, len(self.chunks))
        q_lens = np.concatenate([np.ones(b, dtype=np.int64), lengths])
        k_lens = np.concatenate([np.asarray(self.decode_positions, dtype=np.int64) + 1, starts + lengths])
        width = blocks_for(int(k_lens.max(initial=0)), bs)
        table = np.zeros((len(k_lens), width), dtype=np.int64)
        if b:  # the decode tables index_lists gathers, padded; past a row's keys nothing is read
            decode_tables = self._decode_written(bs)[0]
            table[:b, : decode_tables.shape[1]] = decode_tables
        if self.chunks:
            table[b:] = _padded([c.blocks for c in self.chunks], width)
        return _cumsum0(q_lens), k_lens, _cumsum0(k_lens), table.reshape(-1)

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
        dpos = np.asarray(self.decode_positions, dtype=np.int64)
        if dpos.size and (dpos.min() < 0 or dpos.max() >= max_model_len):
            bad = dpos[(dpos < 0) | (dpos >= max_model_len)][0]
            raise ValueError(f"decode position {bad} outside [0, {max_model_len})")
        bs = block_size
        spans = [(c.blocks, c.end) for c in self.chunks]
        given = self.decode_table is not None and self.decode_table_lens is not None
        if given:
            assert self.decode_table is not None and self.decode_table_lens is not None
            # The decode rows' tables as arrays (their ids were checked as they arrived): whole-array checks.
            lens = np.asarray(self.decode_table_lens, dtype=np.int64)
            short = lens * bs <= dpos
            if short.any():
                i = int(short.argmax())
                raise ValueError(f"a block table of {lens[i]} blocks does not cover {dpos[i] + 1} positions")
        else:
            spans = [(t, p + 1) for t, p in zip(self.decode_blocks, self.decode_positions, strict=True)] + spans
        # Tables given as lists: few in an engine step (its prefill chunks), so a loop is cheapest.
        for table, end in spans:
            if len(table) * bs < end:
                raise ValueError(f"a block table of {len(table)} blocks does not cover {end} positions")
            if len(table) and not (min(table) >= 0 and max(table) < num_blocks):
                raise ValueError(f"a block id outside [0, {num_blocks})")
        # The block each sequence writes first: two sequences writing one block is a scheduler bug
        # (shared prefix blocks are full and only read). The decode rows' is index_lists' gather too.
        written = self._decode_written(bs)[1].tolist() + [c.blocks[c.start // bs] for c in self.chunks]
        if len(set(written)) != len(written):
            raise ValueError("two sequences of one step write the same KV block")


def _padded(tables: Sequence[Sequence[int]], width: int) -> np.ndarray:
    """Block tables as one [len(tables), width] int64 array: each cut to ``width``, padded with block 0."""
    n = len(tables)
    out = np.zeros((n, width), dtype=np.int64)
    if not n or not width:
        return out
    lengths = np.fromiter(map(len, tables), np.int64, n)
    flat = np.fromiter(chain.from_iterable(tables), np.int64, int(lengths.sum()))
    row, col = _ragged_index(lengths)
    keep = col < width
    out[row[keep], col[keep]] = flat[keep]
    return out


def _ragged_index(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For parts of ``lengths`` laid end to end: each element's part, and its index within the part."""
    part = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    first = np.cumsum(lengths) - lengths
    return part, np.arange(part.size, dtype=np.int64) - first[part]


def _cumsum0(lengths: np.ndarray) -> np.ndarray:
    """Offsets of parts of ``lengths`` laid end to end, and their total: [0, l0, l0 + l1, ...]."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out
