"""The executor's persistent batch: rows kept per request, columns gathered per step."""

from __future__ import annotations

import numpy as np
import torch

from harness.engine.input_batch import InputBatch
from harness.engine.sampler import SampleColumns, SampleRow
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
    batch.record(rows, np.array([11, 12]), np.array([5, 9]))
    assert batch.last_token[c] == 11 and batch.position[a] == 9


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
