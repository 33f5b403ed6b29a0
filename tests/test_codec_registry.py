"""The codec registry: names, fresh instances, and third-party codecs by entry point.

The entry-point test installs a real (tiny) distribution: a ``*.dist-info``
folder with ``entry_points.txt`` next to a module, on ``sys.path``, so
``importlib.metadata`` finds it exactly as it would a pip-installed package.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import wirecodecs
from wirecodecs import registry

from wire_samples import assert_wire_equal, multimodal_request, text_messages

BUILTINS = ["pickle", "pickle-oob", "msgspec", "msgspec-b64", "msgspec-oob", "msgspec-packed"]

PLUGIN_MODULE = "wirebench_test_plugin_codec"
PLUGIN_SOURCE = '''
"""A third-party codec: JSON via msgspec, text only."""
from typing import Any, ClassVar, Sequence

import msgspec

from wirecodecs import DecodeError, EncodeError


class JsonCodec:
    name: ClassVar[str] = "plugin-json"
    carries_multimodal: ClassVar[bool] = False

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
'''


def _clear_registry() -> None:
    registry._registered.cache_clear()
    registry.codec_class.cache_clear()
    registry.unavailable_codecs.cache_clear()


@pytest.fixture
def install_plugin(tmp_path: Path) -> Iterator[Callable[[str], None]]:
    """Returns ``install(entry_points_txt)``; everything is undone afterwards."""

    def install(entry_points: str) -> None:
        (tmp_path / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE)
        dist_info = tmp_path / "wirebench_test_plugin-0.1.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: wirebench-test-plugin\nVersion: 0.1\n")
        (dist_info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
        sys.path.insert(0, str(tmp_path))
        _clear_registry()

    try:
        yield install
    finally:
        if str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))
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


@pytest.mark.parametrize("name", BUILTINS)
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


def test_plugin_cannot_shadow_a_builtin(install_plugin: Callable[[str], None]) -> None:
    install_plugin(f"""
        [wirebench.codecs]
        pickle = {PLUGIN_MODULE}:JsonCodec
    """)
    assert wirecodecs.available_codecs().count("pickle") == 1
    assert type(wirecodecs.get_codec("pickle")).__name__ == "PickleCodec"


def test_broken_entry_point_is_a_clear_error(install_plugin: Callable[[str], None]) -> None:
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
    assert wirecodecs.codecs_that_carry_multimodal() == [
        "pickle",
        "pickle-oob",
        "msgspec-b64",
        "msgspec-oob",
        "msgspec-packed",
        *(["vllm"] if "vllm" in wirecodecs.available_codecs() else []),
    ]


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
