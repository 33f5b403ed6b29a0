"""The codec registry: names, fresh instances, and third-party codecs by entry point.

The entry-point tests install a real (tiny) distribution from outside the
project: a ``*.dist-info`` folder with ``entry_points.txt`` next to a module, in
a temporary folder put on ``sys.path``, so ``importlib.metadata`` finds it
exactly as it would a pip-installed package.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_check_codec import check_codec
from test_check_codec import install_plugin as install_distribution

import wirecodecs
from harness.transports.policy import LinkSettings, transport_refusal, unpickling_codec
from wirecodecs import registry

from serve_process import start_serve
from wire_samples import assert_wire_equal, multimodal_request, output_batch, text_messages

# The built-ins this install has (vllm needs its own setup), in the registry's order.
BUILTINS = [name for name in registry._BUILTIN if name not in wirecodecs.unavailable_codecs()]

PLUGIN_MODULE = "wirebench_test_plugin_codec"
PLUGIN_SOURCE = '''
"""A third party's codecs: each a wirecodecs.Codec subclass that declares its facts."""
import pickle
from typing import Any, ClassVar, Sequence

import msgspec

from wirecodecs import Codec, DecodeError, EncodeError


class JsonCodec(Codec):
    """JSON via msgspec, text only: every fact at its default."""

    name: ClassVar[str] = "plugin-json"

    def encode(self, msg: Any) -> list[bytes]:
        try:
            return [msgspec.json.encode(msg)]
        except (TypeError, ValueError) as exc:
            raise EncodeError(str(exc)) from exc

    def decode(self, frames: Sequence[Any], msg_type: type) -> Any:
        if len(frames) != 1:
            raise DecodeError(f"expected 1 frame, got {len(frames)}")
        try:
            return msgspec.json.decode(frames[0], type=msg_type)
        except msgspec.DecodeError as exc:
            raise DecodeError(str(exc)) from exc


class ArrayPickleCodec(Codec):
    """Pickle protocol 5 with numpy arrays' buffers as frames of their own."""

    name: ClassVar[str] = "plugin-arrays"
    carries_multimodal: ClassVar[bool] = True
    multimodal_kinds: ClassVar[frozenset[str]] = frozenset({"array"})
    out_of_band: ClassVar[bool] = True
    unpickles_peer_data: ClassVar[bool] = True

    def encode(self, msg: Any) -> list[Any]:
        frames: list[Any] = [b""]
        frames[0] = pickle.dumps(msg, protocol=5, buffer_callback=lambda buf: frames.append(buf.raw()))
        return frames

    def decode(self, frames: Sequence[Any], msg_type: type) -> Any:
        try:
            msg = pickle.loads(frames[0], buffers=frames[1:])
        except Exception as exc:
            raise DecodeError(str(exc)) from exc
        if type(msg) is not msg_type:
            raise DecodeError(f"expected {msg_type.__name__}, got {type(msg).__name__}")
        return msg


class DuckCodec:
    """Has everything a codec has except the base class."""

    name = "plugin-duck"
    carries_multimodal = False

    def encode(self, msg: Any) -> list[bytes]:
        return [b""]

    def decode(self, frames: Sequence[Any], msg_type: type) -> Any:
        return msg_type()


class EncodeOnlyCodec(Codec):
    name: ClassVar[str] = "plugin-encode-only"

    def encode(self, msg: Any) -> list[bytes]:
        return [b""]


class MistypedKindsCodec(JsonCodec):
    name: ClassVar[str] = "plugin-mistyped"
    carries_multimodal: ClassVar[bool] = True
    multimodal_kinds: ClassVar[frozenset[str]] = frozenset({"images"})
'''


def _clear_registry() -> None:
    registry._registered.cache_clear()
    registry._load.cache_clear()
    registry.unavailable_codecs.cache_clear()


@pytest.fixture
def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Returns ``install(entry_points_txt)``: the plugin distribution on sys.path; undone afterwards."""

    def install(entry_points: str) -> None:
        (tmp_path / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE)
        dist_info = tmp_path / "wirebench_test_plugin-0.1.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: wirebench-test-plugin\nVersion: 0.1\n")
        (dist_info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
        monkeypatch.syspath_prepend(str(tmp_path))
        _clear_registry()

    yield install
    monkeypatch.undo()  # sys.path first, so the registry cannot find the plugin again
    sys.modules.pop(PLUGIN_MODULE, None)
    _clear_registry()


# --- names -------------------------------------------------------------------------


def test_builtins_are_available_first() -> None:
    names = wirecodecs.available_codecs()
    assert names[: len(BUILTINS)] == BUILTINS
    assert len(set(names)) == len(names)


def test_unknown_codec_lists_available_names() -> None:
    with pytest.raises(wirecodecs.UnknownCodecError) as info:
        wirecodecs.get_codec("protobuf")
    message = str(info.value)
    assert "'protobuf'" in message
    for name in wirecodecs.available_codecs():
        assert name in message
    assert not message.startswith(("'", '"')), "KeyError-style quoting hides the message"
    assert isinstance(info.value, KeyError)  # callers may treat it as a lookup miss


@pytest.mark.parametrize("bad", ["", "PICKLE", " pickle", "pickle-oob "])
def test_names_are_exact(bad: str) -> None:
    with pytest.raises(wirecodecs.UnknownCodecError):
        wirecodecs.get_codec(bad)


@pytest.mark.parametrize("name", wirecodecs.available_codecs())
def test_get_codec_returns_fresh_instances(name: str) -> None:
    first, second = wirecodecs.get_codec(name), wirecodecs.get_codec(name)
    assert first is not second
    assert type(first) is type(second)
    assert first.name == name
    assert isinstance(first, wirecodecs.Codec)


# --- third-party codecs ------------------------------------------------------------


def test_entry_point_codec_is_discovered(install_plugin: Callable[[str], None]) -> None:
    assert "plugin-json" not in wirecodecs.available_codecs()
    install_plugin(f"""
        [wirebench.codecs]
        plugin-json = {PLUGIN_MODULE}:JsonCodec
    """)
    names = wirecodecs.available_codecs()
    assert names[: len(BUILTINS)] == BUILTINS
    assert "plugin-json" in names
    assert "plugin-json" not in wirecodecs.codecs_that_carry_multimodal()

    codec = wirecodecs.get_codec("plugin-json")
    assert type(codec).__module__ == PLUGIN_MODULE
    assert codec is not wirecodecs.get_codec("plugin-json")
    for msg in text_messages().values():
        assert_wire_equal(msg, codec.decode(codec.encode(msg), type(msg)))
    with pytest.raises(wirecodecs.UnknownCodecError, match="plugin-json"):
        wirecodecs.get_codec("nope")
    # The text-only builtin now lists only capable codecs as alternatives.
    with pytest.raises(wirecodecs.UnsupportedPayloadError) as info:
        wirecodecs.get_codec("msgspec").encode(multimodal_request([{"x": torch.zeros(2)}]))
    assert "plugin-json" not in info.value.capable


def test_entry_point_codec_declares_its_facts_and_the_rules_read_them(
    install_plugin: Callable[[str], None],
) -> None:
    install_plugin(f"""
        [wirebench.codecs]
        plugin-arrays = {PLUGIN_MODULE}:ArrayPickleCodec
    """)
    assert "plugin-arrays" in wirecodecs.available_codecs()

    # A request whose array leaves the body as a frame of its own, and a step's outputs, both round-trip.
    codec = wirecodecs.get_codec("plugin-arrays")
    request = multimodal_request([{"pixel_values": np.arange(4096, dtype=np.float32).reshape(64, 64)}])
    frames = codec.encode(request)
    assert len(frames) == 2
    assert_wire_equal(request, wirecodecs.get_codec("plugin-arrays").decode(frames, type(request)))
    outputs = output_batch(8)
    assert_wire_equal(outputs, wirecodecs.get_codec("plugin-arrays").decode(codec.encode(outputs), type(outputs)))

    # What the class declares is what the registry's readers see.
    assert wirecodecs.sends_out_of_band("plugin-arrays")
    assert "plugin-arrays" in wirecodecs.codecs_out_of_band()
    assert transport_refusal("plugin-arrays", "shm") is None
    refusal = transport_refusal("msgspec-b64", "shm")
    assert refusal is not None and "plugin-arrays" in refusal  # named among the codecs that can
    assert wirecodecs.unpickles_peer_data("plugin-arrays")
    assert unpickling_codec(LinkSettings(codec="msgspec", output_codec="plugin-arrays")) == "plugin-arrays"
    assert not wirecodecs.packs_token_ids("plugin-arrays")
    assert "plugin-arrays" in wirecodecs.codecs_that_carry_multimodal()
    assert "plugin-arrays" in wirecodecs.codecs_that_carry_multimodal("array")
    assert "plugin-arrays" not in wirecodecs.codecs_that_carry_multimodal("image")
    # The text-only codec's refusal names it for an array, not for an image.
    text_only = wirecodecs.get_codec("msgspec")
    with pytest.raises(wirecodecs.UnsupportedPayloadError) as info:
        text_only.encode(multimodal_request([{"x": np.zeros(2)}]))
    assert "plugin-arrays" in info.value.capable
    with pytest.raises(wirecodecs.UnsupportedPayloadError) as info:
        text_only.encode(multimodal_request([Image.new("RGB", (2, 2))]))
    assert "plugin-arrays" not in info.value.capable


@pytest.mark.parametrize(
    ("cls", "problem"),
    [
        ("DuckCodec", "DuckCodec'>, not a wirecodecs.Codec subclass"),
        ("EncodeOnlyCodec", "does not define decode"),
        ("MistypedKindsCodec", "unknown multimodal kinds ['images']"),
    ],
)
def test_a_registered_class_that_is_not_a_codec_is_refused(
    install_plugin: Callable[[str], None], cls: str, problem: str
) -> None:
    carried = wirecodecs.codecs_that_carry_multimodal()
    install_plugin(f"""
        [wirebench.codecs]
        plugin-bad = {PLUGIN_MODULE}:{cls}
    """)
    assert "plugin-bad" in wirecodecs.available_codecs()  # listed: a name is all the listing reads
    with pytest.raises(wirecodecs.UnknownCodecError) as info:
        wirecodecs.get_codec("plugin-bad")
    message = str(info.value)
    assert f"entry point 'plugin-bad = {PLUGIN_MODULE}:{cls}' (group 'wirebench.codecs')" in message
    assert problem in message
    with pytest.raises(wirecodecs.UnknownCodecError, match="plugin-bad"):
        wirecodecs.sends_out_of_band("plugin-bad")
    assert wirecodecs.codecs_that_carry_multimodal() == carried


def test_plugin_cannot_shadow_a_builtin(install_plugin: Callable[[str], None]) -> None:
    install_plugin(f"""
        [wirebench.codecs]
        pickle = {PLUGIN_MODULE}:JsonCodec
    """)
    assert wirecodecs.available_codecs().count("pickle") == 1
    assert type(wirecodecs.get_codec("pickle")).__name__ == "PickleCodec"


def test_broken_entry_point_is_a_clear_error(install_plugin: Callable[[str], None]) -> None:
    carried = wirecodecs.codecs_that_carry_multimodal()
    install_plugin(f"""
        [wirebench.codecs]
        plugin-missing-module = wirebench_no_such_module:Codec
        plugin-missing-class = {PLUGIN_MODULE}:NoSuchCodec
    """)
    for name, culprit in [
        ("plugin-missing-module", "wirebench_no_such_module"),
        ("plugin-missing-class", "NoSuchCodec"),
    ]:
        assert name in wirecodecs.available_codecs()
        with pytest.raises(wirecodecs.UnknownCodecError) as info:
            wirecodecs.get_codec(name)
        assert name in str(info.value) and culprit in str(info.value)
    # One broken plugin must not break the capability listing of the others.
    assert wirecodecs.codecs_that_carry_multimodal() == carried


# Plugin modules that fail at import, each its own way (SystemExit included: a plugin may call sys.exit).
BROKEN_AT_IMPORT = {
    "wirebench_broken_raises": "raise RuntimeError('the plugin is broken\\nat import')\n",
    "wirebench_broken_exits": "import sys\nsys.exit(3)\n",
}
BROKEN_ENTRY_POINTS = {
    "plugin-raises": "wirebench_broken_raises:Codec",
    "plugin-exits": "wirebench_broken_exits:Codec",
}


def test_a_plugin_that_fails_at_import_is_its_own_error_only(
    install_plugin: Callable[[str], None], tmp_path: Path
) -> None:
    imports = tmp_path / "imports.log"
    for module, source in BROKEN_AT_IMPORT.items():
        (tmp_path / f"{module}.py").write_text(f"open({str(imports)!r}, 'a').write('{module}\\n')\n{source}")
    carried, out_of_band = wirecodecs.codecs_that_carry_multimodal(), wirecodecs.codecs_out_of_band()
    lines = "".join(f"{name} = {target}\n" for name, target in BROKEN_ENTRY_POINTS.items())
    install_plugin(f"[wirebench.codecs]\n{lines}plugin-json = {PLUGIN_MODULE}:JsonCodec\n")

    # The built-ins and the working plugin carry messages as before; the listings leave the broken ones out.
    for name in ("pickle", "msgspec", "msgspec-oob", "plugin-json"):
        codec = wirecodecs.get_codec(name)
        for msg in text_messages().values():
            assert_wire_equal(msg, wirecodecs.get_codec(name).decode(codec.encode(msg), type(msg)))
    assert wirecodecs.codecs_that_carry_multimodal() == carried
    assert wirecodecs.codecs_out_of_band() == out_of_band
    # Each broken one is an error of its own, on one line, naming its entry point and what it raised.
    for name, culprit in [
        ("plugin-raises", "RuntimeError: the plugin is broken at import"),
        ("plugin-exits", "SystemExit: 3"),
    ]:
        with pytest.raises(wirecodecs.UnknownCodecError) as info:
            wirecodecs.get_codec(name)
        message = str(info.value)
        assert f"entry point '{name} = {BROKEN_ENTRY_POINTS[name]}'" in message and culprit in message
        assert "\n" not in message
    # Tried once each, not again every time a codec walks the registry for its alternatives.
    assert sorted(imports.read_text().splitlines()) == sorted(BROKEN_AT_IMPORT)


@pytest.fixture
def broken_plugins(tmp_path: Path) -> dict[str, str]:
    """The broken plugins and a working one installed as a distribution; the environment that finds them."""
    modules = {**BROKEN_AT_IMPORT, PLUGIN_MODULE: PLUGIN_SOURCE}
    return install_distribution(tmp_path, modules, {**BROKEN_ENTRY_POINTS, "plugin-json": f"{PLUGIN_MODULE}:JsonCodec"})


def test_bench_check_codec_names_a_broken_plugin_in_one_line_and_checks_the_others(
    broken_plugins: dict[str, str],
) -> None:
    done = check_codec("plugin-raises", env=broken_plugins)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("bench check-codec: error: codec 'plugin-raises' is registered as entry point"), line
    assert line.endswith("cannot be loaded: RuntimeError: the plugin is broken at import"), line
    done = check_codec("msgspec", "plugin-json", "--only", "text_messages", env=broken_plugins)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every check passed (msgspec, plugin-json)" in done.stdout


def test_bench_serve_serves_a_builtin_with_a_broken_plugin_installed(
    broken_plugins: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", broken_plugins["PYTHONPATH"])  # the server's processes find them too
    server = start_serve("--executor", "sim", codec="msgspec")
    try:
        body = {"model": "wirebench-tiny", "prompt": "hello", "max_tokens": 3, "ignore_eos": True}
        request = urllib.request.Request(
            f"{server.base_url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            completion = json.load(resp)
    finally:
        assert server.stop() == 0
    assert completion["usage"]["completion_tokens"] == 3, completion


def test_a_codec_whose_package_is_missing_is_listed_with_its_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As `vllm` is on a machine set up without --with-vllm: listed apart, refused with the command."""
    monkeypatch.setitem(registry._NEEDS, "vllm", ("wirebench_no_such_package", "scripts/setup.sh --with-vllm"))
    _clear_registry()
    try:
        assert "vllm" not in wirecodecs.available_codecs()
        assert wirecodecs.unavailable_codecs() == {"vllm": "scripts/setup.sh --with-vllm"}
        assert "vllm (not installed: scripts/setup.sh --with-vllm)" in wirecodecs.codec_listing()
        with pytest.raises(wirecodecs.UnknownCodecError, match=r"'vllm' is not installed: run scripts/setup.sh"):
            wirecodecs.get_codec("vllm")
        assert "vllm" not in wirecodecs.codecs_that_carry_multimodal()
    finally:
        monkeypatch.undo()
        _clear_registry()


def test_the_vllm_codec_is_installed_by_the_test_setup() -> None:
    """scripts/setup.sh --test installs vLLM (--no-deps): CI runs the vllm codec's suites, never skips them."""
    assert "vllm" in wirecodecs.available_codecs(), wirecodecs.unavailable_codecs()


def test_registry_is_restored_after_plugin_tests() -> None:
    assert not any(n.startswith("plugin-") for n in wirecodecs.available_codecs())


def test_listing_codecs_imports_neither_vllm_nor_torch() -> None:
    """Making a msgspec codec fills in the alternatives (every codec's class facts): that must not
    import vLLM (seconds; minutes under callgrind) nor torch (text payloads are counted without it)."""
    script = (
        "import sys, wirecodecs\n"
        "wirecodecs.get_codec('msgspec')\n"
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules, 'imported on get_codec'\n"
        "wirecodecs.codecs_that_carry_multimodal('tensor')\n"
        "assert 'vllm' not in sys.modules, 'imported on listing'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
