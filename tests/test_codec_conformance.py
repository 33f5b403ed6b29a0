"""Every registered codec keeps the codec contract: the checks of ``wirecodecs.conformance``, run by pytest.

The checks are the ones ``bench check-codec`` runs for a plugin's author; here
they run over ``available_codecs()``, so a newly registered codec is covered
automatically. What is tests' own is the expectations table
(``wire_samples.EXPECTATIONS``): ``test_every_codec_has_expectations`` makes a
codec's author say what it promises (multimodal or not, out-of-band frames or
not), and the table's promises must match what the class declares, which in
turn decides the checks that apply.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

import wirecodecs
from wirecodecs import conformance
from wirecodecs.conformance import CHECKS, Leeway
from wirecodecs.conformance_samples import (
    SPECIAL_FLOATS,
    assert_wire_equal,
    sample_images,
    sample_logprobs,
    special_float_messages,
    special_sampling_requests,
    text_messages,
    text_request,
)

from wire_samples import EXPECTATIONS, CodecExpectation

CODECS = wirecodecs.available_codecs()
KINDS = ("tensor", "array", "image")


def expectation(name: str) -> CodecExpectation:
    """The table's entry, or (for an unlisted codec) what its class claims."""
    if name in EXPECTATIONS:
        return EXPECTATIONS[name]
    cls = wirecodecs.registry.codec_class(name)
    return CodecExpectation(
        cls.carries_multimodal, out_of_band=cls.out_of_band, family=name, kinds=cls.multimodal_kinds
    )


def leeway(name: str) -> Leeway:
    """The table's allowances for a codec, as the checks take them."""
    exp = expectation(name)
    return Leeway(
        not_carried=exp.not_carried,
        restamped=exp.restamped,
        refused_tensors=exp.refused_tensors,
        prepare=exp.prepare,
        validates_sampling_floats=exp.validates_sampling_floats,
    )


# --- the checks, over every codec ------------------------------------------------------

# (codec, check) for every check that applies to the codec by what its class declares.
CASES = [(name, check) for name in CODECS for check in CHECKS if conformance.applies(check, name)]


@pytest.mark.parametrize(("name", "check"), CASES)
def test_codec_keeps_the_contract(name: str, check: str) -> None:
    result = conformance.run_check(check, conformance.Subject(name, leeway(name)))
    assert result.passed and not result.skipped, f"{name}: {check}: {result.message}"


def expected_checks(name: str) -> set[str]:
    """The checks the table says apply to a codec: everything but the frame rules of the other side."""
    exp = expectation(name)
    kinds = exp.kinds if exp.carries_multimodal else frozenset()
    oob = {"oob_big_values_are_frames", "oob_small_values_stay_inline"} if kinds else set()
    if kinds & {"tensor", "array"}:
        oob |= {"oob_decode_views_zmq_frames", "oob_decode_views_bytes_frames"}
    inband = {"inband_is_one_frame"} if kinds else set()
    others = set(CHECKS) - {c for c in CHECKS if c.startswith("oob_")} - {"inband_is_one_frame"}
    return others | (oob if exp.out_of_band else inband)


@pytest.mark.parametrize("name", CODECS)
def test_the_checks_that_apply_follow_the_table(name: str) -> None:
    assert {check for n, check in CASES if n == name} == expected_checks(name)


def test_no_check_is_left_out_everywhere() -> None:
    assert {check for _, check in CASES} == set(CHECKS)


# --- the expectations table ------------------------------------------------------


def test_every_codec_has_expectations() -> None:
    missing = sorted(set(CODECS) - set(EXPECTATIONS))
    assert not missing, f"add these codecs to wire_samples.EXPECTATIONS: {missing}"


def test_builtin_codecs_are_registered() -> None:
    assert set(EXPECTATIONS) <= set(CODECS)


@pytest.mark.parametrize("name", CODECS)
def test_codec_matches_expectations(name: str) -> None:
    codec = wirecodecs.get_codec(name)
    assert isinstance(codec, wirecodecs.Codec)
    assert codec.name == name
    assert codec.carries_multimodal is expectation(name).carries_multimodal
    # The facts its class declares, as the registry reads them, are the ones the table promises.
    assert wirecodecs.sends_out_of_band(name) is expectation(name).out_of_band
    carried = expectation(name).kinds if expectation(name).carries_multimodal else frozenset()
    assert wirecodecs.registry.multimodal_kinds(name) == carried


def test_capable_codecs_listed() -> None:
    expected = [n for n in CODECS if expectation(n).carries_multimodal]
    assert wirecodecs.codecs_that_carry_multimodal() == expected


@pytest.mark.parametrize("kind", KINDS)
def test_capable_codecs_of_each_kind_listed(kind: str) -> None:
    """What a refusal names (the checks compare it with this listing) is what the table says carries the kind."""
    capable = wirecodecs.codecs_that_carry_multimodal(kind)
    assert capable, f"no registered codec carries a {kind}"
    assert capable == [n for n in CODECS if expectation(n).carries(kind)]


@pytest.mark.parametrize("name", sorted(set(EXPECTATIONS) | set(conformance.BUILTIN_LEEWAY)))
def test_bench_check_codec_allows_what_the_table_allows(name: str) -> None:
    """``bench check-codec`` (no table) gives a built-in the same leeway as these tests."""
    ours, table = conformance.BUILTIN_LEEWAY.get(name, conformance.STRICT), leeway(name)
    assert (ours.not_carried, ours.restamped, ours.refused_tensors) == (
        table.not_carried,
        table.restamped,
        table.refused_tensors,
    )
    assert ours.prepare(text_request()) == table.prepare(text_request())


def test_sample_images_cover_required_modes() -> None:
    modes = {img.mode for img in sample_images().values()}
    assert {"RGB", "RGBA", "L", "P", "I;16"} <= modes
    assert sample_images()["P"].palette is not None


def test_every_check_says_what_it_checks() -> None:
    for check in CHECKS.values():
        assert check.summary and check.summary != check.name, check.name


# --- special floats ------------------------------------------------------------------------


def float_paths(value: Any, path: str) -> Iterator[tuple[str, float]]:
    """Every float inside a message, with its field path (list and dict positions as ``[]``)."""
    if isinstance(value, float):
        yield path, value
    elif isinstance(value, msgspec.Struct):
        for field in value.__struct_fields__:
            yield from float_paths(getattr(value, field), f"{path}.{field}")
    elif isinstance(value, (list, tuple, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from float_paths(item, f"{path}[]")


def special_label(value: float) -> str | None:
    """Which special float ``value`` is, by its bits (None for an ordinary one)."""
    return next((label for label, v in SPECIAL_FLOATS.items() if same_bits(v, value)), None)


def same_bits(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)


def test_every_float_field_meets_every_special_float() -> None:
    """Each float field the text samples fill gets NaN, +inf, -inf and -0.0 in the special-float checks."""
    fields = {path for msg in text_messages().values() for path, _ in float_paths(msg, type(msg).__name__)}
    assert "EngineCoreOutputs.outputs[].new_logprobs.logprobs[][]" in fields
    seen: dict[str, set[str]] = {path: set() for path in fields}
    specials = {**special_float_messages(), **special_sampling_requests()}
    for msg in specials.values():
        for path, value in float_paths(msg, type(msg).__name__):
            label = special_label(value)
            if label is not None:
                seen.setdefault(path, set()).add(label)
    missing = {
        path: sorted(set(SPECIAL_FLOATS) - labels) for path, labels in seen.items() if labels != set(SPECIAL_FLOATS)
    }
    assert not missing


def test_wire_equality_is_bit_for_bit_on_floats() -> None:
    """NaN equals NaN, -0.0 differs from 0.0, wherever the float sits in a message."""
    logprobs = sample_logprobs(5, 3)
    logprobs.logprobs = [[math.nan, -math.inf, -0.0, math.inf]]
    assert_wire_equal(logprobs, msgspec.structs.replace(logprobs, logprobs=[[math.nan, -math.inf, -0.0, math.inf]]))
    for decoded, difference in [
        ([[math.nan, -math.inf, 0.0, math.inf]], "logprobs[0][2]: -0.0 != 0.0"),
        ([[math.nan, math.inf, -0.0, math.inf]], "logprobs[0][1]: -inf != inf"),
        ([[0.0, -math.inf, -0.0, math.inf]], "logprobs[0][0]: nan != 0.0"),
    ]:
        with pytest.raises(AssertionError, match=re.escape(difference)):
            assert_wire_equal(logprobs, msgspec.structs.replace(logprobs, logprobs=decoded))
