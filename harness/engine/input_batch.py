"""The torch executor's persistent batch: one row per request, kept while the request lives.

A request takes a row when it first appears in ``SchedulerOutput.new_requests`` and gives it
back when its id is in ``finished_req_ids`` (a preempted request keeps its row: it comes back
to recompute). Each row holds the request's sampling parameters as numpy columns and its KV
block table, so a step gathers its sampler inputs
and decode tables with one fancy index over its rows instead of one Python object per sequence;
a table takes only the blocks the scheduler added since the last step. Rows are reused; the
columns grow (doubling) only when more requests are alive at once than ever before.

``SampledIds`` is the one column the device side writes: each row's newest sampled id, on the
device (the next step's input, gathered there without a host read) and on the host.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from harness.engine.sampler import SampleColumns, is_greedy
from harness.wire.messages import SamplingParams


class InputBatch:
    """Per-request rows of sampling parameters and decode state, added and removed by request id."""

    generators: list[torch.Generator | None]  # a seeded request's own generator, per row

    def __init__(self, capacity: int = 64, table_width: int = 16) -> None:
        self.row_of: dict[str, int] = {}
        self._free: list[int] = []
        self._size = 0  # rows ever handed out: [0, _size) are used or free
        # Each row's KV block table, padded with block 0, and how many blocks it holds; the
        # scheduler's list it copies (a request's list only grows, and is a new one after preemption).
        self.block_table = np.zeros((0, max(table_width, 1)), dtype=np.int64)
        self._num_blocks: list[int] = []
        self._table_src: list[Sequence[int] | None] = []
        self._alloc(max(capacity, 1))

    def _alloc(self, n: int) -> None:
        """Columns of ``n`` rows, the used ones [0, _size) copied over."""
        old = self._size

        def grow(name: str, dtype: type, fill: float = 0) -> np.ndarray:
            out: np.ndarray = np.full(n, fill, dtype=dtype)
            if old:
                out[:old] = getattr(self, name)[:old]
            return out

        # float64, as the params are: the sampler's comparisons (top_p < 1.0) see the same values
        self.temperature = grow("temperature", np.float64)
        self.top_p = grow("top_p", np.float64, 1.0)
        self.top_k = grow("top_k", np.int64)
        self.min_p = grow("min_p", np.float64)
        self.greedy = grow("greedy", np.bool_)
        gens: list[torch.Generator | None] = [None] * n
        gens[:old] = self.generators[:old] if old else []
        self.generators = gens
        table = np.zeros((n, self.block_table.shape[1]), dtype=np.int64)
        table[:old] = self.block_table[:old]
        self.block_table = table
        self._num_blocks += [0] * (n - len(self._num_blocks))
        self._table_src += [None] * (n - len(self._table_src))
        self.capacity = n

    def __len__(self) -> int:
        return len(self.row_of)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.row_of

    def add(self, request_id: str, params: SamplingParams, generator: torch.Generator | None) -> int:
        """Give ``request_id`` a row holding ``params``; returns the row."""
        if self._free:
            row = self._free.pop()
        else:
            if self._size == self.capacity:
                self._alloc(2 * self.capacity)
            row = self._size
            self._size += 1
        self.temperature[row] = params.temperature
        self.top_p[row] = params.top_p
        self.top_k[row] = params.top_k
        self.min_p[row] = params.min_p
        self.greedy[row] = is_greedy(params)
        self.generators[row] = generator
        self.row_of[request_id] = row
        return row

    def remove(self, request_id: str) -> None:
        """Free the request's row (no-op for an unknown id)."""
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.generators[row] = None
            self.block_table[row, : self._num_blocks[row]] = 0
            self._num_blocks[row], self._table_src[row] = 0, None
            self._free.append(row)

    def tables(
        self, rows: np.ndarray, tables: Sequence[Sequence[int]], width: int, num_blocks: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The block tables of ``rows`` (the scheduler's ``tables``, in order) as [len(rows), width]
        padded with block 0, and their lengths.

        Only blocks a row does not hold yet are copied (a decode step adds at most one per
        request); those are checked to lie in [0, num_blocks).
        """
        held, src = self._num_blocks, self._table_src
        for r, t in zip(rows.tolist(), tables, strict=True):
            n = len(t)
            if src[r] is t and held[r] == n:
                continue
            have = held[r] if src[r] is t else 0
            if n > self.block_table.shape[1]:
                wider = np.zeros((self.capacity, max(n, 2 * self.block_table.shape[1])), dtype=np.int64)
                wider[:, : self.block_table.shape[1]] = self.block_table
                self.block_table = wider
            new = np.asarray(t[have:n], dtype=np.int64)
            if new.size and not (new.min() >= 0 and new.max() < num_blocks):
                raise ValueError(f"a block id outside [0, {num_blocks})")
            self.block_table[r, have:n] = new
            self.block_table[r, n : held[r]] = 0  # a shorter new list: no stale blocks past its end
            held[r], src[r] = n, t
        lens = np.fromiter((held[r] for r in rows.tolist()), dtype=np.int64, count=len(rows))
        if width > self.block_table.shape[1]:
            out = np.zeros((len(rows), width), dtype=np.int64)
            out[:, : self.block_table.shape[1]] = self.block_table[rows]
            return out, lens
        return self.block_table[:, :width][rows], lens

    def rows(self, request_ids: Sequence[str]) -> np.ndarray:
        """The rows of ``request_ids``, in their order, as an int64 array."""
        row_of = self.row_of
        return np.fromiter((row_of[r] for r in request_ids), dtype=np.int64, count=len(request_ids))

    def columns(self, rows: np.ndarray, suppress: list[tuple[int, list[int]]]) -> SampleColumns:
        """The sampler's inputs for a step whose logits row i belongs to batch row ``rows[i]``."""
        greedy = self.greedy[rows]
        gens = self.generators
        generators = {}
        for i in np.flatnonzero(~greedy).tolist():  # only non-greedy rows can hold a generator
            g = gens[rows[i]]
            if g is not None:
                generators[i] = g
        return SampleColumns(
            self.temperature[rows],
            self.top_p[rows],
            self.top_k[rows],
            self.min_p[rows],
            greedy,
            generators,
            suppress,
        )


class SampledIds:
    """Each persistent-batch row's newest sampled id, written by the step that sampled it.

    Only the device part of a step reads and writes the device column (steps run there one at a
    time); the host copy is written when a step's ids reach the host, on whichever thread waits
    for them first, so it is locked. The host part of a step refers to rows, never to values.
    """

    def __init__(self, device: torch.device, capacity: int = 64) -> None:
        self.device_ids = torch.full((capacity,), -1, dtype=torch.int64, device=device)
        self.host_ids = np.full(capacity, -1, dtype=np.int64)
        self._lock = threading.Lock()

    def keep(self, rows: np.ndarray, rows_on_device: Tensor, tokens: Tensor) -> None:
        """Keep ``tokens`` [len(rows)] (on the device) as the ``rows``' newest ids (``rows_on_device``:
        the same rows, staged with the step)."""
        if rows.size and int(rows.max()) >= self.host_ids.size:  # more live rows than ever: double
            n = max(int(rows.max()) + 1, 2 * self.host_ids.size)
            grown = torch.full((n,), -1, dtype=torch.int64, device=self.device_ids.device)
            grown[: self.device_ids.numel()] = self.device_ids
            self.device_ids = grown
            with self._lock:
                extra = np.full(n - self.host_ids.size, -1, dtype=np.int64)
                self.host_ids = np.concatenate([self.host_ids, extra])
        self.device_ids.index_copy_(0, rows_on_device, tokens)

    def note(self, rows: np.ndarray, picked: np.ndarray) -> np.ndarray:
        """The same ids, read back to the host; returns ``picked``."""
        with self._lock:
            self.host_ids[rows] = picked
        return picked
