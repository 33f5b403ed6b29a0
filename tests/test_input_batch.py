"""The executor's persistent inputs: batch rows kept per request, step buffers reused, plans vectorised."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from harness.engine.input_batch import InputBatch, SampledIds
from harness.engine.sampler import SampleColumns, SampleRow
from harness.engine.staging import Stager, StepBuffers
from harness.engine.step_plan import Chunk, StepPlan
from harness.wire.messages import SamplingParams


def test_rows_are_kept_reused_and_grown() -> None:
    batch = InputBatch(capacity=2)
    a = batch.add("a", SamplingParams(temperature=0.5, top_k=3), None)
    b = batch.add("b", SamplingParams(temperature=0.0), None)
    gen = torch.Generator().manual_seed(1)
    c = batch.add("c", SamplingParams(temperature=1.0, top_p=0.9, seed=1), gen)  # grows past 2
    assert batch.capacity >= 3 and len({a, b, c}) == 3
    assert batch.top_k[a] == 3 and batch.greedy[b] and not batch.greedy[c]
    batch.remove("b")
    assert "b" not in batch and batch.add("d", SamplingParams(), None) == b  # the freed row
    rows = batch.rows(["c", "a"])
    assert rows.tolist() == [c, a]
    cols = batch.columns(rows, [(1, [7])])
    assert cols.temperature.tolist() == [1.0, 0.5] and cols.top_p[0] == 0.9
    assert cols.generators == {0: gen} and cols.suppress == [(1, [7])]


def test_sampled_ids_are_kept_by_row_on_both_sides_and_grow() -> None:
    ids = SampledIds(torch.device("cpu"), capacity=2)
    rows = np.array([1, 5])  # row 5 is past the capacity: both columns grow
    tokens = torch.tensor([11, 12])
    ids.keep(rows, torch.from_numpy(rows), tokens)
    picked = ids.note(rows, Stager(torch.device("cpu")).fetch_array(tokens))
    assert picked.tolist() == [11, 12]
    assert ids.host_ids[[1, 5]].tolist() == [11, 12] and ids.device_ids[[1, 5]].tolist() == [11, 12]
    assert ids.host_ids[0] == -1 and ids.device_ids.numel() == ids.host_ids.size >= 6


def test_columns_of_rows_match_the_rows() -> None:
    gen = torch.Generator().manual_seed(3)
    rows = [
        SampleRow(SamplingParams(temperature=0.0), suppress_token_ids=[2]),
        SampleRow(SamplingParams(temperature=0.7, seed=3), gen),
        SampleRow(SamplingParams(temperature=0.0, seed=4), torch.Generator()),  # greedy: no generator
        SampleRow(SamplingParams(temperature=1.0, logit_bias={1: 1.0}, repetition_penalty=1.2)),
    ]
    cols = SampleColumns.of_rows(rows)
    assert len(cols) == 4 and cols.greedy.tolist() == [True, False, True, False]
    assert cols.generators == {1: gen} and cols.suppress == [(0, [2])]
    assert list(cols.biased) == [3] and list(cols.penalized) == [3]


def test_step_buffers_reuse_one_buffer_and_grow() -> None:
    bufs = StepBuffers(torch.device("cpu"), capacity=4)
    a, b = bufs.ints([1, 2], np.array([3], dtype=np.int32))
    assert a.tolist() == [1, 2] and b.tolist() == [3] and bufs.capacity == 4
    (c,) = bufs.ints(list(range(9)))  # past the capacity: one larger buffer from now on
    assert c.tolist() == list(range(9)) and bufs.capacity >= 9
    host = bufs.host
    bufs.ints([7])
    assert bufs.host is host  # no allocation per step


def test_index_lists_match_a_per_token_walk() -> None:
    bs = 4
    decode_blocks: list[Sequence[int]] = [[5, 9], [2], [11, 12, 13]]
    decode_positions = [6, 0, 8]
    chunks = [Chunk([20, 21, 22], 3, 7), Chunk([30], 0, 2)]
    plan = StepPlan(decode_blocks, decode_positions, chunks)
    plan.check(64, bs, 64)
    slots, pos, d_tables, c_tables, dst = plan.index_lists(bs)
    want = [(t[p // bs] * bs + p % bs, p) for t, p in zip(decode_blocks, decode_positions, strict=True)]
    want += [(c.blocks[p // bs] * bs + p % bs, p) for c in chunks for p in range(c.start, c.end)]
    assert slots.tolist() == [w[0] for w in want] and pos.tolist() == [w[1] for w in want]
    assert d_tables.reshape(3, -1).tolist() == [[5, 9, 0], [2, 0, 0], [11, 12, 13]]
    assert c_tables.reshape(2, -1).tolist() == [[20, 21, 22], [30, 0, 0]]
    assert dst.tolist() == [*range(7), 7, 8]


def test_block_tables_copy_only_new_blocks() -> None:
    batch = InputBatch(capacity=2, table_width=2)
    rows = np.array([batch.add("a", SamplingParams(), None), batch.add("b", SamplingParams(), None)])
    a, b = [3, 4], [7]
    table, lens = batch.tables(rows, [a, b], 2, 64)
    assert table.tolist() == [[3, 4], [7, 0]] and lens.tolist() == [2, 1]
    a.extend([5, 6])  # the scheduler's list grew: the row takes the new blocks (and widens)
    table, lens = batch.tables(rows, [a, b], 4, 64)
    assert table.tolist() == [[3, 4, 5, 6], [7, 0, 0, 0]] and lens.tolist() == [4, 1]
    table, _ = batch.tables(rows[:1], [[9]], 4, 64)  # a new list (after preemption): no stale blocks
    assert table.tolist() == [[9, 0, 0, 0]]
    with pytest.raises(ValueError, match="outside"):
        batch.tables(rows[1:], [[7, 64]], 2, 64)
    batch.remove("b")
    c = batch.add("c", SamplingParams(), None)
    assert batch.block_table[c].tolist() == [0, 0, 0, 0]


def test_a_plan_checks_decode_tables_given_as_arrays() -> None:
    table, lens = np.array([[3, 4], [3, 0]]), np.array([2, 1])
    with pytest.raises(ValueError, match="same KV block"):
        StepPlan([[3, 4], [3]], [1, 2], decode_table=table, decode_table_lens=lens).check(64, 4, 64)
    with pytest.raises(ValueError, match="does not cover 5"):
        StepPlan([[3, 4], [3]], [1, 4], decode_table=table, decode_table_lens=lens).check(64, 4, 64)
    StepPlan([[3, 4], [5]], [5, 2], decode_table=np.array([[3, 4], [5, 0]]), decode_table_lens=lens).check(64, 4, 64)
