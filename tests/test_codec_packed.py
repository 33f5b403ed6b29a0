"""msgspec-packed: prompt token ids as one int32 buffer, read back as a view; everything else as msgspec-oob."""

from __future__ import annotations

import numpy as np
import pytest

import wirecodecs
from harness.wire.messages import EngineCoreRequest, SamplingParams
from wirecodecs import DecodeError

from wire_samples import assert_wire_equal, text_messages


def packed_request(ids: list[int]) -> EngineCoreRequest:
    return EngineCoreRequest("r-1", "a prompt", np.asarray(ids, dtype="<i4"), SamplingParams(max_tokens=5), 2, 1.5)


def test_packed_ids_travel_as_one_buffer_and_decode_as_an_int32_view() -> None:
    codec = wirecodecs.get_codec("msgspec-packed")
    ids = list(range(4000, 4550))
    frames = codec.encode(packed_request(ids))
    assert len(frames) == 1  # the 2.2 KB buffer rides in the body
    assert len(bytes(frames[0])) < 550 * 4 + 200  # 4 bytes a token (a list of ints takes ~3 each, plus types)
    got = codec.decode([bytes(frames[0])], EngineCoreRequest)
    assert isinstance(got.prompt_token_ids, np.ndarray) and got.prompt_token_ids.dtype == np.dtype("<i4")
    assert got.prompt_token_ids.tolist() == ids and not got.prompt_token_ids.flags.writeable
    assert got.sampling_params.max_tokens == 5 and got.request_id == "r-1"


def test_lists_and_every_other_message_still_round_trip() -> None:
    codec = wirecodecs.get_codec("msgspec-packed")
    for msg in text_messages().values():
        assert_wire_equal(msg, codec.decode(codec.encode(msg), type(msg)))
    assert wirecodecs.packs_token_ids("msgspec-packed") and not wirecodecs.packs_token_ids("msgspec-oob")


def test_a_torn_buffer_is_a_decode_error() -> None:
    codec = wirecodecs.get_codec("msgspec-packed")
    body = bytearray(codec.encode(packed_request([1, 2, 3]))[0])
    # The ext's length byte says 12 bytes of ids; make it 11 (not a whole number of int32).
    at = body.find(bytes([0xC7, 12, 4 + 16]))
    assert at >= 0
    body[at + 1] = 11
    del body[at + 3]
    with pytest.raises(DecodeError):
        codec.decode([bytes(body)], EngineCoreRequest)


# --- the engine consumes packed ids without a Python int per token --------------------------


def test_the_scheduler_slices_a_packed_prompt_and_the_model_sees_the_same_tokens() -> None:
    from harness.engine.executor import TorchExecutor
    from harness.engine.scheduler import Scheduler
    from harness.wire.messages import pack_token_ids

    from test_executor import make_config, request, serve, tokens

    config = make_config()
    plain = request("plain", n=60, seed_tokens=3, max_tokens=6, temperature=0.0, ignore_eos=True)
    packed = request("packed", n=60, seed_tokens=3, max_tokens=6, temperature=0.0, ignore_eos=True)
    packed.prompt_token_ids = pack_token_ids(packed.prompt_token_ids)

    s = Scheduler(config)
    s.add_request(packed)
    (chunk,) = s.schedule().prefills
    assert isinstance(chunk.token_ids, np.ndarray) and np.shares_memory(chunk.token_ids, packed.prompt_token_ids)

    executor = TorchExecutor(config)
    assert tokens(serve(config, executor, [plain])["plain"]) == tokens(serve(config, executor, [packed])["packed"])


CARRY_ARRAYS = [n for n in wirecodecs.available_codecs() if wirecodecs.registry.codec_class(n).carries_multimodal]


@pytest.mark.parametrize("name", CARRY_ARRAYS)
def test_every_codec_that_carries_arrays_round_trips_packed_ids(name: str) -> None:
    # Only msgspec-packed is handed packed ids by the frontend, but `bench micro` hands every codec
    # the packed payload, and an array in any field must come back an array (msgspec-b64 once
    # returned its base64 map).
    codec = wirecodecs.get_codec(name)
    ids = list(range(4000, 4550))
    got = codec.decode([bytes(f) for f in codec.encode(packed_request(ids))], EngineCoreRequest)
    assert np.asarray(got.prompt_token_ids).tolist() == ids


def test_a_decoded_packed_prompt_becomes_the_model_input_unchanged() -> None:
    # The executor's step array and the staged tensor from a view of the received frame: the same
    # tokens as from a list, as int64.
    import torch

    from harness.engine.staging import Stager, step_token_ids

    codec = wirecodecs.get_codec("msgspec-packed")
    ids = list(range(4000, 4550))
    got = codec.decode([bytes(f) for f in codec.encode(packed_request(ids))], EngineCoreRequest).prompt_token_ids
    chunk = got[100:400]  # the scheduler's slice: a view, no copy
    assert np.shares_memory(chunk, got)
    rows = step_token_ids([7, 8], [chunk, got[:5]])
    assert isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.tolist() == [7, 8, *ids[100:400], *ids[:5]]
    assert rows.tolist() == np.asarray(step_token_ids([7, 8], [ids[100:400], ids[:5]])).tolist()  # the list route
    (model_input,) = Stager(torch.device("cpu")).ints(rows)
    assert model_input.dtype == torch.int64 and model_input.tolist() == rows.tolist()
    # A lone prefill chunk goes to the stager as it is, which casts it into its int64 buffer.
    (model_input,) = Stager(torch.device("cpu")).ints(step_token_ids([], [chunk]))
    assert model_input.dtype == torch.int64 and model_input.tolist() == ids[100:400]
