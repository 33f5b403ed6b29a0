"""The calibration codec: any codec plus a known cost on chosen message types, nothing else changed."""

from __future__ import annotations

import time

import pytest
import torch

import wirecodecs
from harness.wire.messages import EngineCoreAbort, EngineCoreOutputs, EngineCoreRequest, SamplingParams
from wirecodecs import calibration

from wire_samples import assert_wire_equal, multimodal_request, text_messages


@pytest.fixture
def spins(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every spin the codec asks for, in ns (recorded instead of spent)."""
    calls: list[int] = []
    monkeypatch.setattr(calibration, "spin_ns", calls.append)
    return calls


@pytest.mark.parametrize("base", ["pickle", "msgspec-oob"])
def test_messages_round_trip_unchanged(base: str) -> None:
    codec = wirecodecs.get_codec(f"{base}+delay=1us")
    plain = wirecodecs.get_codec(base)
    for msg in [*text_messages().values(), multimodal_request([{"pixel_values": torch.ones(3, 4, 4)}])]:
        frames = codec.encode(msg)
        assert [bytes(f) for f in frames] == [bytes(f) for f in plain.encode(msg)]  # the same bytes on the wire
        assert_wire_equal(msg, codec.decode(frames, type(msg)))


def test_request_delay_touches_only_requests(spins: list[int]) -> None:
    codec = wirecodecs.get_codec("pickle+request-delay=500us")
    request = EngineCoreRequest("r", None, [1, 2], SamplingParams(), None, 0.0)
    codec.decode(codec.encode(request), EngineCoreRequest)
    codec.decode(codec.encode(EngineCoreOutputs()), EngineCoreOutputs)
    codec.decode(codec.encode(EngineCoreAbort(["r"])), EngineCoreAbort)
    assert [s for s in spins if s] == [500_000, 500_000]  # request encode and decode, nothing else


def test_options_add_up_and_units_parse(spins: list[int]) -> None:
    codec = wirecodecs.get_codec("msgspec+delay=1ms+output-delay=250ns")
    codec.encode(EngineCoreOutputs())
    assert spins == [1_000_250]
    assert calibration.parse_duration_ns("1.5ms") == 1_500_000 and calibration.parse_duration_ns("3s") == 3 * 10**9


def test_facts_come_from_the_wrapped_codec() -> None:
    assert wirecodecs.unpickles_peer_data("pickle+delay=1us")
    assert not wirecodecs.unpickles_peer_data("msgspec-oob+delay=1us")
    assert not wirecodecs.get_codec("msgspec+delay=1us").carries_multimodal
    assert wirecodecs.get_codec("pickle+delay=1us").name == "pickle+delay=1us"


@pytest.mark.parametrize("spec", ["pickle+delay", "pickle+delay=5", "pickle+speed=1us", "nope+delay=1us"])
def test_bad_specs_are_clear_errors(spec: str) -> None:
    with pytest.raises(wirecodecs.UnknownCodecError):
        wirecodecs.get_codec(spec)


def test_the_spin_really_spends_the_time() -> None:
    # A lower bound of what it promises, not a speed measurement.
    start = time.perf_counter_ns()
    calibration.spin_ns(2_000_000)
    assert time.perf_counter_ns() - start >= 2_000_000
