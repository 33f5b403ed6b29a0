"""``bench micro``: statistics helpers, payloads, and a tiny end-to-end run (no timing asserts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

import wirecodecs
from harness import cli
from harness.analysis import documents
from harness.analysis.documents import MICRO_SCHEMA
from harness.commands import micro
from harness.micro import delivery, payloads, timing, token_path
from harness.tokenizers.tokenizer import load_tokenizer
from harness.transports import transport_names
from harness.transports.registry import loaded_transports
from harness.wire.messages import EngineCoreOutputs, EngineCoreRequest

BASELINE = Path(__file__).resolve().parents[1] / "results" / "baselines" / "micro.json"

# --- statistics --------------------------------------------------------------


def test_median_odd_and_even() -> None:
    assert timing.median([3, 1, 2]) == 2
    assert timing.median([4, 1, 3, 2]) == 2.5
    assert timing.median([7]) == 7


def test_p99_interpolates_between_ranks() -> None:
    samples = list(range(1, 101))  # 1..100
    assert timing.p99(samples) == pytest.approx(99.01)
    assert timing.p99([5, 5, 5]) == 5


def test_p99_ignores_input_order() -> None:
    assert timing.p99([10, 1, 1000, 5]) == timing.p99([1, 5, 10, 1000])


def test_timing_from_ns_in_microseconds() -> None:
    t = timing.Timing.from_ns([1000, 2000, 3000])
    assert (t.p50_us, t.min_us, t.iterations) == (2.0, 1.0, 3)


def test_time_calls_meets_min_iterations() -> None:
    calls = []
    t = timing.time_calls(lambda: calls.append(1), min_iterations=7, min_time_s=0.0)
    assert t.iterations >= 7 and len(calls) >= t.iterations


# --- payloads ----------------------------------------------------------------


def test_text_payload_is_sonnet_sized() -> None:
    req = payloads.text_request()
    assert len(req.prompt_token_ids) == 550
    assert 1900 <= len(req.prompt.encode()) <= 2048
    assert req.sampling_params.max_tokens == 150
    assert req.mm_inputs is None and req.mm_hashes is None
    assert req.request_id.startswith("cmpl-") and len(req.request_id) == len("cmpl-") + 32 + 2


def test_payload_bytes_definition() -> None:
    req = payloads.text_request()
    expected = 8 * 550 + len(req.prompt.encode()) + len(req.request_id)
    assert payloads.payload_nbytes(req) == expected
    tensor_req = payloads.PAYLOADS["tensor-fp32-1024"]()
    assert (
        payloads.payload_nbytes(tensor_req)
        == payloads.payload_nbytes(payloads.text_request(extra_tokens=payloads.IMAGE_TOKENS)) + 3 * 1024 * 1024 * 4
    )
    outputs = payloads.outputs_batch()
    assert len(outputs.outputs) == 64
    assert payloads.payload_nbytes(outputs) == 64 * (8 + len(outputs.outputs[0].request_id))


def test_payloads_are_deterministic() -> None:
    a, b = payloads.PAYLOADS["image-336"](), payloads.PAYLOADS["image-336"]()
    assert a.mm_hashes == b.mm_hashes
    assert a.mm_inputs[0].tobytes() == b.mm_inputs[0].tobytes()
    assert a.mm_placeholders[0].length == payloads.IMAGE_TOKENS


def test_payloads_carry_the_bytes_of_the_committed_baseline() -> None:
    # Same payload bytes as when results/baselines/micro.json was measured: new runs compare with it.
    committed = {r["payload"]: r["payload_bytes"] for r in json.loads(BASELINE.read_text()) if "payload_bytes" in r}
    assert committed.keys() == payloads.PAYLOADS.keys()
    for name, build in payloads.PAYLOADS.items():
        assert payloads.payload_nbytes(build()) == committed[name], name


def test_round_trip_check_catches_a_changed_message() -> None:
    sent = payloads.text_request()
    timing.check_round_trip(sent, payloads.text_request())
    changed = payloads.text_request()
    changed.prompt_token_ids[3] += 1
    with pytest.raises(AssertionError):
        timing.check_round_trip(sent, changed)


def test_parse_names() -> None:
    assert micro.parse_names(None, ["a", "b"], "codec") == ["a", "b"]
    assert micro.parse_names(" b, a,b ", ["a", "b"], "codec") == ["b", "a"]
    with pytest.raises(ValueError, match="unknown codec 'x'; available: a, b"):
        micro.parse_names("a,x", ["a", "b"], "codec")


# --- the command -------------------------------------------------------------

FAST = ["--min-iterations", "3", "--min-time", "0"]


def test_micro_command_writes_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "micro.json"
    threads = torch.get_num_threads()
    rc = cli.main(
        ["micro", "--codec", "msgspec,msgspec-oob", "--payload", "text-550,image-336", *FAST, "--json", str(out)]
    )
    assert rc == 0
    assert torch.get_num_threads() == threads  # restored after the run
    assert "msgspec-oob" in capsys.readouterr().out  # the table was printed; the document says what it holds

    records = json.loads(out.read_text())
    assert [(r["codec"], r["payload"]) for r in records] == [
        ("msgspec", "text-550"),
        ("msgspec-oob", "text-550"),
        ("msgspec", "image-336"),
        ("msgspec-oob", "image-336"),
    ]
    by_cell = {(r["codec"], r["payload"]): r for r in records}
    unsupported = by_cell["msgspec", "image-336"]
    assert unsupported["status"] == "unsupported"
    assert "PIL.Image.Image" in unsupported["reason"]
    assert unsupported["encode_p50_us"] is None and unsupported["ratio"] is None
    assert unsupported["memcpy_p50_us"] > 0  # the reference exists even where a codec can't

    ok = by_cell["msgspec-oob", "image-336"]
    assert ok["status"] == "ok" and ok["reason"] is None
    assert ok["frames"] == 2 and ok["wire_bytes"] > 336 * 336 * 3
    for key in ("encode_p50_us", "encode_p99_us", "decode_p50_us", "decode_p99_us", "memcpy_p50_us"):
        assert ok[key] > 0, key
    assert ok["encode_p99_us"] >= ok["encode_p50_us"]
    assert ok["encode_iterations"] >= 3 and ok["decode_iterations"] >= 3
    assert ok["ratio"] == pytest.approx((ok["encode_p50_us"] + ok["decode_p50_us"]) / ok["memcpy_p50_us"])
    assert ok["payload_bytes"] == payloads.payload_nbytes(payloads.PAYLOADS["image-336"]())
    meta = ok["metadata"]
    for key in ("python", "platform", "cpu_model", "cpu_count"):
        assert meta[key], key
    for lib in ("torch", "msgspec", "pyzmq"):
        assert meta["libraries"][lib], lib
    assert "hostname" not in meta
    assert ok["schema_version"] == MICRO_SCHEMA
    assert meta["torch_threads"] == 1
    assert ok["settings"] == {"min_iterations": 3, "min_time_s": 0.0}


def test_micro_document_has_the_committed_keys() -> None:
    # The same keys, in the same order, as the committed micro documents (readers index them by name).
    committed = json.loads(BASELINE.read_text())
    cell_keys = next(list(r) for r in committed if "kind" not in r)
    delivery_keys = next(list(r) for r in committed if r.get("kind") == "delivery")
    t = timing.Timing(1.0, 2.0, 0.5, 10)
    ok = timing.Measurement(timing.MicroCell("pickle", "text-550", "ok", None, t, t, 100, 1), 6487, t)
    missing = timing.Measurement(timing.MicroCell("pickle", "huge", "error", "building payload: no"), None, None)
    sent = delivery.Delivery("pickle", "zmq", "text-550", "unsupported", "no frames")
    doc = documents.micro_document([ok, missing], [timing.DeliveryMeasurement(sent, t)], {}, {})
    # A delivery cell's later keys (the first send, the parts) come after the committed ones.
    later = ["first_us", "encode_p50_us", "copy_p50_us", "notify_p50_us", "decode_p50_us", "memcpy_cold_p50_us"]
    later.append("variant")
    assert [list(r) for r in doc] == [cell_keys, cell_keys, [*delivery_keys, *later]]
    assert doc[0]["ratio"] == 2.0 and doc[1]["ratio"] is None
    assert doc[2]["p50_us"] is None  # NaN is written as null: strict JSON
    assert {r["schema_version"] for r in doc} == {MICRO_SCHEMA}


def test_outputs_payload_runs(tmp_path: Path) -> None:
    out = tmp_path / "micro.json"
    assert cli.main(["micro", "--codec", "pickle", "--payload", "outputs-64", *FAST, "--json", str(out)]) == 0
    (cell,) = json.loads(out.read_text())
    assert (cell["codec"], cell["payload"], cell["status"]) == ("pickle", "outputs-64", "ok")


def test_a_failing_cell_becomes_an_error_row() -> None:
    class Weird:  # not a wire message: every codec should refuse or fail, not crash the run
        pass

    cell = timing.measure_cell("msgspec", "weird", Weird(), 1, 0.0)
    assert cell.status in ("unsupported", "error") and cell.reason
    cell = timing.measure_cell("no-such-codec", "text-550", payloads.text_request(), 1, 0.0)
    assert cell.status == "error" and "no-such-codec" in cell.reason


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--codec", "nope"], "unknown codec 'nope'"),
        (["--payload", "text-550,huge"], "unknown payload 'huge'"),
        (["--min-iterations", "0"], "--min-iterations"),
        (["--count", "instructions", "--payload", "text-550-path"], "can only be timed, not counted"),
    ],
)
def test_bad_flags_are_clear_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["micro", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # a timed cell per codec and payload, vLLM's import included: 15-25 s
def test_messages_types_round_trip_through_every_codec_once() -> None:
    # The payloads are valid wire messages for the codecs that carry them.
    for payload in ("text-550", "outputs-64"):
        msg = payloads.PAYLOADS[payload]()
        assert isinstance(msg, (EngineCoreRequest, EngineCoreOutputs))
        for codec in wirecodecs.available_codecs():
            cell = timing.measure_cell(codec, payload, msg, 1, 0.0)
            assert cell.status == "ok", (codec, payload, cell.reason)


# --- the token path (text-550-path) ------------------------------------------------------


@pytest.fixture(scope="module")
def sonnet_path() -> token_path.TokenPath:
    return token_path.text_path()


def test_the_path_starts_from_the_tokenizers_output_of_its_own_prompt(sonnet_path: token_path.TokenPath) -> None:
    ids = sonnet_path.encoding.ids
    assert len(ids) == payloads.PROMPT_TOKENS
    assert load_tokenizer().encode(sonnet_path.request.prompt) == ids  # the prompt's ids, not drawn ones
    assert sonnet_path.request.prompt_token_ids == ids
    # Everything but the prompt is text-550's request.
    rest: dict[str, object] = {"prompt": None, "prompt_token_ids": []}
    assert msgspec.structs.replace(sonnet_path.request, **rest) == msgspec.structs.replace(
        payloads.text_request(), **rest
    )


@pytest.mark.parametrize("codec", wirecodecs.available_codecs())
def test_every_codec_path_delivers_the_prompt_to_the_model_input(codec: str, sonnet_path: token_path.TokenPath) -> None:
    calls = token_path.PathCalls(codec, sonnet_path)
    frames = [bytes(f) for f in calls.send()]
    sent = calls.native.prompt_token_ids
    if wirecodecs.packs_token_ids(codec):  # the tokenizer's int32 array, no list built by the frontend
        assert isinstance(sent, np.ndarray) and sent.dtype == np.dtype("<i4")
    else:  # a list codec's real path: the tokenizer's list
        assert isinstance(sent, list)
    model_input = calls.receive(frames)
    assert model_input.dtype == torch.int64 and model_input.shape == (payloads.PROMPT_TOKENS,)
    assert model_input.tolist() == sonnet_path.encoding.ids
    cell = timing.measure_path_cell(codec, "text-550-path", sonnet_path, 2, 0.0)
    assert cell.status == "ok", cell.reason
    assert cell.adapt is None and cell.frames == len(frames) and cell.wire_bytes == sum(map(len, frames))


def test_a_path_that_loses_ids_is_an_error_cell(
    sonnet_path: token_path.TokenPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check runs before the clock: a path that drops a token is not fast, it is wrong.
    monkeypatch.setattr(token_path, "frontend_ids", lambda encoding, packed: encoding.ids[1:])
    cell = timing.measure_path_cell("pickle", "text-550-path", sonnet_path, 2, 0.0)
    assert cell.status == "error" and "model input" in cell.reason


def test_the_path_payload_is_in_the_default_set_and_defined_in_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "text-550-path" in micro.ALL_PAYLOADS and "text-550-path" not in payloads.PAYLOADS
    with pytest.raises(SystemExit):
        cli.main(["micro", "--help"])
    assert "text-550-path" in " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    doc = tmp_path / "micro.json"
    argv = ["micro", "--codec", "pickle,msgspec-packed", "--payload", "text-550-path", *FAST, "--json", str(doc)]
    assert cli.main(argv) == 0
    assert micro.PATH_LEGEND in " ".join(capsys.readouterr().out.split())  # wrapped to the default width
    cells = [(c["codec"], c["payload"], c["status"]) for c in json.loads(doc.read_text())]
    assert cells == [("pickle", "text-550-path", "ok"), ("msgspec-packed", "text-550-path", "ok")]


def test_the_default_tables_fit_100_columns_whatever_is_chosen() -> None:
    """The widest selection (every codec, payload, transport and variant) still fits; --wide does not."""
    every_transport = [(t, "") for t in transport_names()] + [
        (t.name, v) for t in loaded_transports() for v in t.variants
    ]
    tables: list[tuple[Callable[..., micro.Table], tuple[Any, ...]]] = [
        (micro.cell_table, (wirecodecs.available_codecs(), micro.ALL_PAYLOADS)),
        (micro.delivery_table, (wirecodecs.available_codecs(), list(payloads.PAYLOADS), every_transport)),
    ]
    for make, selection in tables:
        assert all(len(line) <= micro.WIDTH for line in make(*selection).header_lines())
        assert len(make(*selection, wide=True).header_lines()[0]) > micro.WIDTH


def test_the_adapter_column_shows_only_where_a_chosen_codec_has_an_adapter() -> None:
    assert "adapter" not in micro.cell_table(["pickle", "msgspec"], ["text-550"]).header_lines()[0]
    if "vllm" in wirecodecs.available_codecs():
        assert "adapter" in micro.cell_table(["pickle", "vllm"], ["text-550"]).header_lines()[0]


def test_default_output_lines_fit_100_columns(capsys: pytest.CaptureFixture[str]) -> None:
    """The longest codec and payload names, the legends and an unsupported row, as printed."""
    argv = ["micro", "--codec", "msgspec,msgspec-packed", "--payload", "outputs-64-logprobs5,image-336,text-550-path"]
    assert cli.main([*argv, *FAST]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("msgspec ") and "unsupported" in line for line in lines)
    assert [line for line in lines if len(line) > micro.WIDTH] == []


def test_cold_memcpy_is_timed_with_its_arrays_out_of_cache() -> None:
    assert timing.last_level_cache_bytes() >= 1 << 20
    cold = timing.time_memcpy_cold(1 << 20, iterations=5)
    assert cold.iterations == 5 and 0 < cold.min_us <= cold.p50_us <= cold.p99_us


@pytest.mark.slow  # a receiver process and a cold memcpy of caches' worth of arrays
def test_delivery_table_and_document_carry_the_cold_memcpy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.json"
    argv = ["micro", "--codec", "msgspec-oob", "--payload", "tensor-fp16-336", "--transport", "shm"]
    assert cli.main([*argv, "--delivery-iterations", "3", "--json", str(out), "--wide", *FAST]) == 0
    assert "cold memcpy µs" in capsys.readouterr().out
    (row,) = [r for r in json.loads(out.read_text()) if r.get("kind") == "delivery"]
    assert row["status"] == "ok" and row["memcpy_cold_p50_us"] > 0 and row["memcpy_p50_us"] > 0


def test_copies_after_a_pause_run_the_pause_outside_the_clock_and_warm_up_once() -> None:
    src, dst = timing.copy_arrays(1 << 16)
    calls: list[int] = []
    after = timing.time_copies_after(src, dst, lambda: calls.append(1), iterations=4)
    assert len(calls) == 5 and after.iterations == 4  # one untimed copy first, then the samples
    assert np.array_equal(src, dst) and 0 < after.min_us <= after.p50_us <= after.p99_us
    assert timing.time_copies_after(src, dst, None, iterations=2).iterations == 2


@pytest.mark.slow  # a receiver process per transport
@pytest.mark.parametrize(
    ("transport", "variant"),
    [("torch-shm", ""), ("torch-shm", "in-place"), ("shm-store", ""), ("shm-store", "store-miss")],
)
def test_the_multimodal_transports_deliver_intact_bytes_in_parts(transport: str, variant: str) -> None:
    """The warm-up sends are digested by the receiver: an ok cell got the bytes that were sent."""
    msg = payloads.tensor_request(torch.float16, 336)
    got = delivery.measure("msgspec-oob", transport, "tensor-fp16-336", msg, iterations=3, variant=variant)
    assert got.status == "ok", got.reason
    assert all(v >= 0 for v in got.parts_p50_us.values()) and got.copy_p50_us > 0


def test_a_variant_needs_a_chosen_transport_that_has_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["micro", "--store-miss", "--transport", "zmq,shm"]) == 2
    assert "--store-miss: no chosen transport has this variant (these do: shm-store)" in capsys.readouterr().err
    assert cli.main(["micro", "--in-place"]) == 2
    assert "--in-place needs --transport" in capsys.readouterr().err
