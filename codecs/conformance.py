"""The codec contract as checks anyone can run against a codec: ``run_checks(name)`` or ``bench check-codec NAME``.

Each check is a plain function over a codec (a registered name, a Codec
subclass or an instance) that returns nothing when the codec keeps that part
of the contract and raises AssertionError saying what broke when it does not.
Which checks apply follows what the codec declares: the multimodal kinds it
carries get round trips, the others must be refused with
UnsupportedPayloadError; a codec with out-of-band buffers gets the frame rules
of out-of-band codecs, any other the one-frame rule.

A name is checked as the rest of wirebench would use it: instances from
``get_codec`` (a fresh one per side, as two processes), facts as the registry
reads them from the class. An instance is used as it is, for both sides.

Whatever a codec's code raises is the failure of the check it ran in, its
message cut to a readable length. ``run_checks_bounded`` (what ``bench
check-codec`` runs) also puts each check under a time limit, in a process of
its own, so a codec that hangs or ends its process fails a check, not the run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import torch
import zmq
from PIL import Image

from . import registry
from .base import ALL_MULTIMODAL_KINDS, Codec, EncodeError, UnsupportedPayloadError
from .conformance_samples import (
    assert_wire_equal,
    expect,
    frames_as,
    mixed_mm_inputs,
    mm_inputs_of,
    multimodal_request,
    opened_png,
    output_batch,
    sample_arrays,
    sample_images,
    sample_tensors,
    sparse_messages,
    special_float_messages,
    special_sampling_requests,
    text_messages,
    text_request,
    unicode_messages,
)
from .registry import error_text, message_of, shortened

CodecLike = str | Codec | type[Codec]

# The type names an UnsupportedPayloadError gives for each kind's sample values.
TYPE_NAMES = {"tensor": "torch.Tensor", "array": "numpy.ndarray", "image": "PIL.Image.Image"}


def _unchanged(msg: Any) -> Any:
    return msg


@dataclass(frozen=True)
class Leeway:
    """Where a codec may deliver something other than the message it was given, and why it is allowed to.

    Only a codec that speaks another project's messages needs any: the strict
    default is what every other codec must do.
    """

    # "Type.field" its schema has no place for: they come back at their default.
    not_carried: frozenset[str] = frozenset()
    # "Type.field" its message type stamps itself when left at 0.0.
    restamped: frozenset[str] = frozenset()
    # Keys of sample_tensors() its encoder refuses with an EncodeError naming the codec.
    refused_tensors: frozenset[str] = frozenset()
    # Makes a sample message valid by the codec's own rules before it is sent.
    prepare: Callable[[Any], Any] = _unchanged
    # Its own SamplingParams validation refuses a special float (NaN, ±inf, -0.0 where its ranges stop at
    # 0) with an EncodeError naming the codec: each such sample must then round-trip or be so refused.
    validates_sampling_floats: bool = False

    def delivered(self, msg: Any, decoded: Any) -> Any:
        """What ``msg`` should come back as: fields not carried at their default, re-stamped ones as decoded."""
        name = type(msg).__name__
        changes = {}
        for key in msg.__struct_fields__:
            if f"{name}.{key}" in self.not_carried:
                changes[key] = _default_of(msg, key)
            if f"{name}.{key}" in self.restamped and getattr(msg, key) == 0.0:
                changes[key] = getattr(decoded, key)
        return msgspec.structs.replace(msg, **changes) if changes else msg

    def describe(self) -> str:
        """What the leeway allows, in words (empty for none)."""
        parts = []
        if self.not_carried:
            parts.append(f"back at their default: {', '.join(sorted(self.not_carried))}")
        if self.restamped:
            parts.append(f"stamped by its own messages when 0.0: {', '.join(sorted(self.restamped))}")
        if self.refused_tensors:
            parts.append(f"sample tensors refused with an EncodeError: {', '.join(sorted(self.refused_tensors))}")
        if self.prepare is not _unchanged:
            parts.append(f"samples made valid by its rules first ({self.prepare.__name__})")
        if self.validates_sampling_floats:
            parts.append("special sampling floats its own validation refuses, with an EncodeError")
        return "; ".join(parts)


def _default_of(msg: Any, key: str) -> Any:
    found = {f.name: f for f in msgspec.structs.fields(type(msg))}[key]
    if found.default is not msgspec.NODEFAULT:
        return found.default
    if found.default_factory is not msgspec.NODEFAULT:
        return found.default_factory()
    return None  # a required field the codec's schema lacks (EngineCoreRequest.prompt: str | None)


def valid_for_vllm(msg: Any) -> Any:
    """vLLM refuses stop strings without detokenize (its SamplingParams validation): the sample keeps them."""
    sampling = getattr(msg, "sampling_params", None)
    if sampling is not None and sampling.stop:
        sampling.detokenize = True
    return msg


STRICT = Leeway()
# Built-ins whose messages are not ours (codecs/vllm_messages.py says how they map).
BUILTIN_LEEWAY: dict[str, Leeway] = {
    "vllm": Leeway(
        not_carried=frozenset({"EngineCoreRequest.prompt", "EngineCoreOutputs.step_start_time"}),
        restamped=frozenset({"EngineCoreOutputs.timestamp"}),
        # vLLM's encoder views a tensor's bytes as uint8, which torch refuses for a conjugate view.
        refused_tensors=frozenset({"complex64_conj"}),
        prepare=valid_for_vllm,
        # vLLM's SamplingParams refuses NaN and ±inf in every float field, -0.0 in top_p and
        # repetition_penalty, and a -0.0 temperature with n > 1 (greedy); wirebench's own validation
        # refuses them before any codec too (harness/wire/messages.py).
        validates_sampling_floats=True,
    ),
}


class Subject:
    """The codec under check: fresh instances of it, the facts it declares, and its leeway."""

    def __init__(self, codec: CodecLike, leeway: Leeway | None = None) -> None:
        self._make: Callable[[], Codec]
        if isinstance(codec, str):
            # The registry's reading of the class: what the transport and the frontend go by.
            self.name = codec
            self.kinds = registry.multimodal_kinds(codec)
            self.out_of_band = registry.sends_out_of_band(codec)
            self._make = functools.partial(registry.get_codec, codec)
        else:
            self.name = codec.name
            self.kinds = frozenset(codec.multimodal_kinds) if codec.carries_multimodal else frozenset()
            self.out_of_band = bool(codec.out_of_band)
            if isinstance(codec, type):
                self._make = functools.partial(_instance, codec)
            else:
                self._make = functools.partial(_with_alternatives, codec)
        self.leeway = leeway if leeway is not None else BUILTIN_LEEWAY.get(self.name, STRICT)

    def new(self) -> Codec:
        return self._make()

    def carries(self, kind: str) -> bool:
        return kind in self.kinds


def _instance(cls: type[Codec]) -> Codec:
    return _with_alternatives(cls())


def _with_alternatives(codec: Codec) -> Codec:
    """As ``get_codec`` does: a codec that refuses some kinds is told which registered codecs carry them."""
    kinds = frozenset(codec.multimodal_kinds) if codec.carries_multimodal else frozenset()
    if kinds != ALL_MULTIMODAL_KINDS and not codec.alternatives:
        codec.alternatives = {
            kind: registry.codecs_that_carry_multimodal(kind) for kind in sorted(ALL_MULTIMODAL_KINDS)
        }
    return codec


def as_subject(codec: CodecLike | Subject, leeway: Leeway | None = None) -> Subject:
    return codec if isinstance(codec, Subject) else Subject(codec, leeway)


# --- the checks' registry --------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Subject], None]
    # Why the check does not apply to a codec (empty when it does).
    skip_reason: Callable[[Subject], str]
    summary: str


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    # What failed; for a pass, what was checked; for a skip, why it does not apply.
    message: str
    skipped: bool = False


CHECKS: dict[str, Check] = {}


def _always(subject: Subject) -> str:
    return ""


def _check(
    skip_reason: Callable[[Subject], str] = _always,
) -> Callable[[Callable[[Subject], None]], Callable[[CodecLike | Subject], None]]:
    """Registers a check (its name: the function's without ``check_``) and lets it take a name or instance too."""

    def register(fn: Callable[[Subject], None]) -> Callable[[CodecLike | Subject], None]:
        name = fn.__name__.removeprefix("check_")
        summary = (fn.__doc__ or name).strip().splitlines()[0]
        CHECKS[name] = Check(name, fn, skip_reason, summary)

        @functools.wraps(fn)
        def run(codec: CodecLike | Subject) -> None:
            fn(as_subject(codec))

        return run

    return register


def applies(check: str, codec: CodecLike | Subject) -> bool:
    return not CHECKS[check].skip_reason(as_subject(codec))


def run_check(check: str, codec: CodecLike | Subject) -> CheckResult:
    """One check's result; whatever the codec raises (SystemExit too, but not KeyboardInterrupt: a Ctrl-C
    still stops the caller) is a failure that names it, in at most ``registry.MAX_ERROR_CHARS`` characters."""
    found, subject = CHECKS[check], as_subject(codec)
    reason = found.skip_reason(subject)
    if reason:
        return CheckResult(check, True, reason, skipped=True)
    try:
        found.run(subject)
    except AssertionError as exc:
        return CheckResult(check, False, shortened(message_of(exc)) or "an assertion failed")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return CheckResult(check, False, error_text(exc))
    return CheckResult(check, True, found.summary)


def run_checks(codec: CodecLike | Subject, leeway: Leeway | None = None, only: Sequence[str] = ()) -> list[CheckResult]:
    """Every check (or those named in ``only``) on one codec, in order.

    UnknownCodecError for a name the registry does not know or cannot load.
    """
    subject = as_subject(codec, leeway)
    return [run_check(name, subject) for name in CHECKS if not only or name in only]


# --- helpers the checks share ------------------------------------------------------


@contextmanager
def _about(what: str) -> Iterator[None]:
    """Failures inside say which message they were about; a codec's own exception (SystemExit too) becomes one."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{what}: {message_of(exc)}") from exc
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise AssertionError(f"{what}: {error_text(exc, None)}") from exc


def _encode(codec: Codec, msg: Any) -> list[Any]:
    frames = codec.encode(msg)
    expect(
        isinstance(frames, list) and len(frames) > 0, f"encode returned {type(frames).__name__}, not a list of frames"
    )
    kinds = [type(f).__name__ for f in frames]
    expect(
        all(isinstance(f, (bytes, memoryview)) for f in frames), f"encode's frames must be bytes or memoryview: {kinds}"
    )
    return frames


def _assert_delivered(subject: Subject, msg: Any, decoded: Any) -> None:
    assert_wire_equal(subject.leeway.delivered(msg, decoded), decoded)


def _roundtrip(subject: Subject, msg: Any) -> Any:
    """``msg`` encoded by one instance and decoded by another, as two processes would; checked and returned."""
    msg = subject.leeway.prepare(msg)
    decoded = subject.new().decode(_encode(subject.new(), msg), type(msg))
    _assert_delivered(subject, msg, decoded)
    return decoded


def _assert_refused(subject: Subject, msg: Any, kind: str) -> None:
    """Encoding ``msg`` (holding a value of ``kind``) raises an UnsupportedPayloadError that helps."""
    try:
        subject.new().encode(subject.leeway.prepare(msg))
    except UnsupportedPayloadError as exc:
        err = exc
    except Exception as exc:
        raise AssertionError(
            f"a {kind} the codec declares it cannot carry raised {error_text(exc, None)}, not UnsupportedPayloadError"
        ) from exc
    else:
        raise AssertionError(f"encode accepted a {kind} the codec declares it cannot carry")
    text, type_name = str(err), TYPE_NAMES[kind]
    capable = registry.codecs_that_carry_multimodal(kind)
    expect(bool(capable), f"no registered codec carries a {kind}")
    expect(repr(subject.name) in text, f"the refusal does not name the codec {subject.name!r}: {text}")
    expect(type_name in text, f"the refusal does not name the type {type_name}: {text}")
    missing = [other for other in capable if other not in text]
    expect(not missing, f"the refusal does not name the codecs that carry a {kind} {missing}: {text}")
    expect(err.codec == subject.name, f"the refusal's codec is {err.codec!r}, not {subject.name!r}")
    expect(err.type_name == type_name, f"the refusal's type_name is {err.type_name!r}, not {type_name!r}")
    expect(err.capable == capable, f"the refusal's capable codecs are {err.capable}, not {capable}")


def _carried_or_refused(subject: Subject, kind: str, items: dict[str, Any]) -> None:
    """Each sample value of ``kind`` round-trips when the codec carries the kind, else each is refused."""
    for key, value in items.items():
        msg = multimodal_request([value if kind == "image" else {"pixel_values": value}])
        with _about(f"{kind} {key!r}"):
            if kind == "tensor" and key in subject.leeway.refused_tensors:
                try:
                    subject.new().encode(subject.leeway.prepare(msg))
                except EncodeError as exc:
                    expect(repr(subject.name) in str(exc), f"the EncodeError does not name the codec: {exc}")
                else:
                    raise AssertionError("encode accepted a tensor its leeway says it refuses")
            elif subject.carries(kind):
                _roundtrip(subject, msg)
            else:
                _assert_refused(subject, msg, kind)


def _messages(subject: Subject) -> dict[str, Any]:
    """One of each message the codec carries, made valid by its own rules: the text ones and a multimodal one."""
    msgs = dict(text_messages())
    if subject.kinds:
        msgs["multimodal request"] = multimodal_request(mm_inputs_of(subject.kinds))
    return {what: subject.leeway.prepare(msg) for what, msg in msgs.items()}


def _big_value(subject: Subject) -> Any:
    """A value of a carried kind above zmq's copy threshold, so recv(copy=False) really hands over a buffer."""
    if subject.carries("tensor"):
        return {"pixel_values": torch.randn(3, 224, 224)}
    if subject.carries("array"):
        return {"pixel_values": np.random.default_rng(1).standard_normal((3, 224, 224)).astype(np.float32)}
    return Image.frombytes("RGB", (224, 224), bytes(range(256)) * 588)


@contextmanager
def _zmq_pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A connected (sender, receiver) PAIR over inproc on a private context; a lost message fails, never hangs."""
    ctx: zmq.Context = zmq.Context()
    address = f"inproc://wirebench-conformance-{id(ctx)}"
    receiver, sender = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        for sock in (receiver, sender):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 5000)
            sock.setsockopt(zmq.SNDTIMEO, 5000)
        receiver.bind(address)
        sender.connect(address)
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()
        ctx.term()


def _shares(value: Any, frame: Any) -> bool:
    return bool(np.shares_memory(np.asarray(value), np.frombuffer(frame, dtype=np.uint8)))


def _data_ptr(frame: Any) -> int:
    return int(np.frombuffer(frame, dtype=np.uint8).ctypes.data)


def _nbytes(frame: Any) -> int:
    return memoryview(frame).nbytes


# --- what applies to whom --------------------------------------------------------


def _needs_oob(*kinds: str) -> Callable[[Subject], str]:
    """Applies to out-of-band codecs that carry at least one of ``kinds``."""

    def reason(subject: Subject) -> str:
        if not subject.out_of_band:
            return "the codec declares no out-of-band buffers"
        if not any(subject.carries(k) for k in kinds):
            return f"the codec carries none of: {', '.join(kinds)}"
        return ""

    return reason


def _needs_inband_multimodal(subject: Subject) -> str:
    if subject.out_of_band:
        return "the codec declares out-of-band buffers"
    return "" if subject.kinds else "the codec carries no multimodal values"


# --- the checks ------------------------------------------------------------------


@_check()
def check_declared_facts(subject: Subject) -> None:
    """The codec is a wirecodecs.Codec whose name and declared facts are usable and agree with its instances."""
    codec = subject.new()
    expect(isinstance(codec, Codec), f"{type(codec).__qualname__} is not a wirecodecs.Codec subclass")
    expect(isinstance(codec.name, str) and codec.name != "", f"its name is {codec.name!r}, not a non-empty str")
    expect(codec.name == subject.name, f"an instance's name is {codec.name!r}, registered as {subject.name!r}")
    for fact in ("carries_multimodal", "out_of_band", "packed_token_ids", "unpickles_peer_data"):
        value = getattr(codec, fact)
        expect(isinstance(value, bool), f"{fact} is {value!r}, not a bool")
    unknown = set(codec.multimodal_kinds) - ALL_MULTIMODAL_KINDS
    expect(
        not unknown, f"multimodal_kinds names unknown kinds {sorted(unknown)}; known: {sorted(ALL_MULTIMODAL_KINDS)}"
    )
    kinds = frozenset(codec.multimodal_kinds) if codec.carries_multimodal else frozenset()
    expect(kinds == subject.kinds, f"an instance carries {sorted(kinds)}, its class declares {sorted(subject.kinds)}")
    expect(codec.out_of_band is subject.out_of_band, "an instance's out_of_band differs from its class's")


def _roundtrip_each(subject: Subject, tag: str, messages: dict[str, Any]) -> None:
    """Every message round-trips; a failure names ``tag`` and the message."""
    for what, msg in messages.items():
        with _about(f"{tag} {what}"):
            _roundtrip(subject, msg)


@_check()
def check_text_messages(subject: Subject) -> None:
    """A text request, an output batch and an abort round-trip, every field bit for bit."""
    _roundtrip_each(subject, "text", text_messages())


@_check()
def check_defaults_and_nones(subject: Subject) -> None:
    """Each message type with its optional fields None and its lists empty round-trips."""
    _roundtrip_each(subject, "sparse", sparse_messages())


@_check()
def check_output_batch_of_64(subject: Subject) -> None:
    """One step's outputs for 64 requests plus an error output round-trip."""
    msg = output_batch(64)
    expect(len(msg.outputs) == 65, "the sample batch should hold 64 outputs and an error")
    with _about("output batch of 64"):
        _roundtrip(subject, msg)


@_check()
def check_unicode(subject: Subject) -> None:
    """Non-ASCII ids, prompts and stop reasons (astral and combining characters) round-trip."""
    _roundtrip_each(subject, "unicode", unicode_messages())


@_check()
def check_special_floats(subject: Subject) -> None:
    """NaN, +inf, -inf and -0.0 round-trip bit for bit in times, logit bias, logprobs and scheduler stats."""
    _roundtrip_each(subject, "special floats:", special_float_messages())


@_check()
def check_special_sampling_floats(subject: Subject) -> None:
    """NaN, +inf, -inf and -0.0 round-trip bit for bit in each float field of SamplingParams (a codec
    that validates SamplingParams by its own rules may refuse one instead, with an EncodeError)."""
    if not subject.leeway.validates_sampling_floats:
        _roundtrip_each(subject, "special floats:", special_sampling_requests())
        return
    for what, msg in special_sampling_requests().items():
        with _about(f"special floats: {what}"):
            try:
                _roundtrip(subject, msg)
            except EncodeError as exc:
                expect(subject.name in str(exc), f"the EncodeError should name the codec: {exc}")


@_check()
def check_prompt_of_100k_tokens(subject: Subject) -> None:
    """A request with a 600 kB prompt and 100,000 token ids round-trips."""
    msg = text_request(prompt="lorem ipsum " * 50_000, num_tokens=100_000)
    expect(len(msg.prompt_token_ids) == 100_000, "the sample should hold 100,000 token ids")
    with _about("request of 100k tokens"):
        _roundtrip(subject, msg)


@_check()
def check_tensors(subject: Subject) -> None:
    """Every sample tensor (dtypes, layouts, edge shapes) round-trips, or is refused when tensors are not carried."""
    _carried_or_refused(subject, "tensor", sample_tensors())


@_check()
def check_arrays(subject: Subject) -> None:
    """Every sample numpy array (byte orders, layouts) round-trips, or is refused when arrays are not carried."""
    _carried_or_refused(subject, "array", sample_arrays())


@_check()
def check_images(subject: Subject) -> None:
    """Every sample PIL image (modes, palette, empty) round-trips, or is refused when images are not carried."""
    _carried_or_refused(subject, "image", sample_images())


@_check()
def check_lazily_loaded_image(subject: Subject) -> None:
    """An image straight from Image.open (a subclass, pixels pending) round-trips, or its refusal names it."""
    msg = multimodal_request([opened_png(sample_images()["P"])])
    with _about("PNG from Image.open"):
        if subject.carries("image"):
            decoded = _roundtrip(subject, msg)
            assert_wire_equal(sample_images()["P"], decoded.mm_inputs[0], "msg.mm_inputs[0]")
            return
        try:
            subject.new().encode(subject.leeway.prepare(msg))
        except UnsupportedPayloadError as exc:
            expect("PngImageFile" in str(exc), f"the refusal does not name PngImageFile: {exc}")
        else:
            raise AssertionError("encode accepted an image the codec declares it cannot carry")


@_check()
def check_mixed_multimodal(subject: Subject) -> None:
    """A request mixing images, tensors and arrays round-trips, unchanged by encode; refused unless all are carried."""
    msg = subject.leeway.prepare(multimodal_request(mixed_mm_inputs()))
    if subject.kinds != ALL_MULTIMODAL_KINDS:
        with _about("mixed request"):
            try:
                subject.new().encode(msg)
            except UnsupportedPayloadError:
                return
            except Exception as exc:
                raise AssertionError(f"raised {error_text(exc, None)}, not UnsupportedPayloadError") from exc
            raise AssertionError(f"encode accepted it though the codec carries only {sorted(subject.kinds)}")
    with _about("mixed request"):
        frames = _encode(subject.new(), msg)
        assert_wire_equal(subject.leeway.prepare(multimodal_request(mixed_mm_inputs())), msg, "encoded msg (changed)")
        _assert_delivered(subject, msg, subject.new().decode(frames, type(msg)))


@_check()
def check_decode_from_buffers(subject: Subject) -> None:
    """Frames decode when they arrive as bytes, bytearray or memoryview copies."""
    encoder, decoder = subject.new(), subject.new()
    for kind in ("bytes", "bytearray", "memoryview"):
        for what, msg in _messages(subject).items():
            with _about(f"{what} from {kind} frames"):
                frames = frames_as(_encode(encoder, msg), kind)
                _assert_delivered(subject, msg, decoder.decode(frames, type(msg)))


@_check()
def check_decode_from_zmq_frames(subject: Subject) -> None:
    """Frames sent by send_multipart(copy=False) decode from the zmq.Frames recv_multipart(copy=False) returns."""
    encoder, decoder = subject.new(), subject.new()
    msgs = _messages(subject)
    if subject.kinds:
        msgs["request with a 600 kB value"] = subject.leeway.prepare(multimodal_request([_big_value(subject)]))
    with _zmq_pair() as (sender, receiver):
        for what, msg in msgs.items():
            with _about(f"{what} over zmq"):
                sender.send_multipart(_encode(encoder, msg), copy=False)
                received = receiver.recv_multipart(copy=False)
                expect(all(isinstance(f, zmq.Frame) for f in received), "zmq did not hand over zmq.Frame objects")
                _assert_delivered(subject, msg, decoder.decode(received, type(msg)))


@_check()
def check_instance_reuse(subject: Subject) -> None:
    """One encoder and one decoder instance carry every message twice: no state leaks from call to call."""
    encoder, decoder = subject.new(), subject.new()
    for attempt in ("first", "second"):
        for what, msg in _messages(subject).items():
            with _about(f"{what}, {attempt} time"):
                _assert_delivered(subject, msg, decoder.decode(_encode(encoder, msg), type(msg)))


@_check()
def check_text_is_one_frame(subject: Subject) -> None:
    """A message without multimodal values is one frame."""
    for what, msg in text_messages().items():
        frames = _encode(subject.new(), subject.leeway.prepare(msg))
        expect(len(frames) == 1, f"text {what}: {len(frames)} frames, not 1")


@_check(_needs_inband_multimodal)
def check_inband_is_one_frame(subject: Subject) -> None:
    """A codec without out-of-band buffers sends a multimodal request as one frame."""
    msg = subject.leeway.prepare(multimodal_request(mm_inputs_of(subject.kinds)))
    frames = _encode(subject.new(), msg)
    expect(len(frames) == 1, f"multimodal request: {len(frames)} frames from a codec that declares none out of band")


def _assert_own_frame(subject: Subject, value: Any, nbytes: int, what: str) -> list[Any]:
    """A request holding one big ``value`` is the body plus one frame of ``nbytes``; the frames are returned."""
    frames = _encode(subject.new(), subject.leeway.prepare(multimodal_request([value])))
    expect(len(frames) == 2, f"{what}: {len(frames)} frames, not the body and one buffer")
    expect(_nbytes(frames[1]) == nbytes, f"{what}: its frame holds {_nbytes(frames[1])} bytes, not {nbytes}")
    expect(_nbytes(frames[0]) < 2048, f"{what}: the body is {_nbytes(frames[0])} bytes: the value leaked into it")
    return frames


@_check(_needs_oob("tensor", "array", "image"))
def check_oob_big_values_are_frames(subject: Subject) -> None:
    """Each big tensor, array and image leaves the body as a frame of its own; tensors and arrays are not copied."""
    if subject.carries("tensor"):
        for dtype in (torch.float32, torch.bfloat16):
            tensor = torch.randn(256, 256).to(dtype)
            frames = _assert_own_frame(subject, {"pixel_values": tensor}, tensor.nbytes, f"{dtype} tensor")
            expect(_data_ptr(frames[1]) == tensor.data_ptr(), f"{dtype} tensor: encode copied it")
    array = np.random.default_rng(0).standard_normal((128, 128)).astype(">f4")
    image = sample_images()["RGB"]
    if subject.carries("array"):
        frames = _assert_own_frame(subject, {"a": array}, array.nbytes, "big-endian array")
        expect(_shares(array.view(np.uint8), frames[1]), "big-endian array: encode copied it")
    if subject.carries("image"):
        _assert_own_frame(subject, image, len(image.tobytes()), "RGB image")
    if subject.carries("array") and subject.carries("image"):
        frames = _encode(subject.new(), subject.leeway.prepare(multimodal_request([{"a": array}, image])))
        expect(len(frames) == 3, f"an array and an image: {len(frames)} frames, not the body and two buffers")
        sizes = sorted(_nbytes(f) for f in frames[1:])
        expect(sizes == sorted([array.nbytes, len(image.tobytes())]), f"an array and an image: frames of {sizes} bytes")
        array_frame = next(f for f in frames[1:] if _nbytes(f) == array.nbytes)
        expect(_shares(array.view(np.uint8), array_frame), "an array beside an image: encode copied it")


@_check(_needs_oob("tensor", "array", "image"))
def check_oob_small_values_stay_inline(subject: Subject) -> None:
    """Values under the inline threshold (256 bytes) stay in the body: one frame, and it round-trips."""
    items: list[Any] = []
    if subject.carries("tensor"):
        items.append({"t": torch.arange(8)})
    if subject.carries("array"):
        items.append({"a": np.arange(8, dtype=np.int32)})
    if subject.carries("image"):
        items.append(sample_images()["RGB_tiny"])
    msg = subject.leeway.prepare(multimodal_request(items))
    with _about("small values"):
        frames = _encode(subject.new(), msg)
        expect(len(frames) == 1, f"{len(frames)} frames, not 1")
        _assert_delivered(subject, msg, subject.new().decode(frames, type(msg)))


def _view_values(subject: Subject) -> dict[str, Any]:
    """Big values decode should hand back as views: a tensor, and an array (as a tensor when arrays are not carried)."""
    values: dict[str, Any] = {}
    if subject.carries("tensor"):
        values["t"] = torch.randn(256, 256)
    array: Any = np.arange(40_000, dtype=np.int64)
    if subject.carries("array"):
        values["a"] = array
    elif subject.carries("tensor"):
        values["a"] = torch.from_numpy(array)
    return values


def _assert_views(decoded: Any, values: dict[str, Any], buffers: list[Any]) -> None:
    out = decoded.mm_inputs[0]
    for key, value in values.items():
        kind = "tensor" if isinstance(value, torch.Tensor) else "array"
        got = out[key].numpy() if isinstance(out[key], torch.Tensor) else np.asarray(out[key])
        expect(any(_shares(got, b) for b in buffers), f"{kind} {key!r} was copied on decode, not a view on its frame")


@_check(_needs_oob("tensor", "array"))
def check_oob_decode_views_zmq_frames(subject: Subject) -> None:
    """Decode builds big tensors and arrays as views on the zmq.Frames received, not copies."""
    values = _view_values(subject)
    msg = subject.leeway.prepare(multimodal_request([values]))
    with _zmq_pair() as (sender, receiver), _about("big values over zmq"):
        sender.send_multipart(_encode(subject.new(), msg), copy=False)
        received = receiver.recv_multipart(copy=False)
        expect(len(received) == 1 + len(values), f"{len(received)} frames, not the body and {len(values)} buffers")
        decoded = subject.new().decode(received, type(msg))
        _assert_delivered(subject, msg, decoded)
        _assert_views(decoded, values, [f.buffer for f in received[1:]])


@_check(_needs_oob("tensor", "array"))
def check_oob_decode_views_bytes_frames(subject: Subject) -> None:
    """Decode builds big tensors and arrays as views on bytes frames too, not copies."""
    values: dict[str, Any] = {}
    if subject.carries("tensor"):
        values["t"] = torch.randn(128, 128)
    if subject.carries("array"):
        values["a"] = np.random.default_rng(2).standard_normal((128, 128))
    msg = subject.leeway.prepare(multimodal_request([values]))
    with _about("big values from bytes frames"):
        frames = frames_as(_encode(subject.new(), msg), "bytes")
        decoded = subject.new().decode(frames, type(msg))
        _assert_delivered(subject, msg, decoded)
        _assert_views(decoded, values, frames[1:])


__all__ = [
    "BUILTIN_LEEWAY",
    "CHECKS",
    "STRICT",
    "Check",
    "CheckResult",
    "CodecLike",
    "Leeway",
    "Subject",
    "applies",
    "as_subject",
    "run_check",
    "run_checks",
    "valid_for_vllm",
]
