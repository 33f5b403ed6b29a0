"""Arms: what differs between the sides of a comparison, and their order.

An arm is a label, a codec (with calibration options if any) and a transport,
and optionally a *build*: the Python whose ``bench serve`` it runs (another
checkout's venv: base against head in one job), or any server command. The
same codec twice is an A/A arm labelled ``NAME#2``. Rounds run the arms in
``round_order``, the rows of a Williams design: every arm takes every position
and follows every other arm equally often, so the slow drift of a shared
machine and what one arm leaves behind for the next land on all arms alike.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from harness.experiment.sglang_server import MODES as SGLANG_MODES
from harness.transports import transport_names
from harness.transports.policy import transport_refusal
from harness.vllm_plugin import OWN_CODEC
from wirecodecs import UnknownCodecError, available_codecs, check_codec_spec
from wirecodecs import registry as codec_registry

T = TypeVar("T")
# Whose server an arm runs: wirebench's own (bench serve), or a real server under test, kept up across rounds
# in blocks (a start takes a minute) with wirebench's timing inside it.
SERVERS = ("wirebench", "vllm", "sglang")
REAL_SERVERS = SERVERS[1:]


@dataclass(frozen=True)
class ArmSpec:
    """One arm of a run: the label in tables and file names, the codec and the transport its server uses."""

    label: str
    codec: str
    transport: str = "zmq"
    # The interpreter that runs `-m harness.cli serve` (default: this one), or a vLLM arm's own vLLM venv.
    python: str | None = None
    command: str | None = None  # any server command instead, {port} replaced; ready when /health answers
    # Or "vllm": a real vLLM with wirebench's plugin (harness.experiment.vllm_server), "sglang": a real SGLang
    # with wirebench's hook (harness.experiment.sglang_server).
    server: str = "wirebench"

    def unsupported(self) -> str | None:
        """Why this arm cannot run at all (said in the table instead of starting a server), or None."""
        if self.server in REAL_SERVERS:
            name = {"vllm": "vLLM", "sglang": "SGLang"}[self.server]
            return None if self.transport == "zmq" else f"a real {name} moves its messages its own way: --transport zmq"
        return transport_refusal(self.codec, self.transport)


def parse_arms(codec_spec: str, transport_spec: str = "zmq", server: str = "wirebench") -> list[ArmSpec]:
    """Every codec × transport (codec-major); labels carry the transport when several are compared."""
    transports = [t.strip() for t in transport_spec.split(",") if t.strip()]
    bad = [t for t in transports if t not in transport_names()]
    if bad or not transports:
        raise ValueError(
            f"unknown transport(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(transport_names())}"
        )
    transports = list(dict.fromkeys(transports))
    arms = []
    for codec_arm in parse_codecs(codec_spec, server):
        for t in transports:
            label = codec_arm.label if len(transports) == 1 else f"{codec_arm.label}/{t}"
            arms.append(ArmSpec(label, codec_arm.codec, t))
    return arms


def arm_codecs(server: str = "wirebench") -> list[str]:
    """The codec names an arm of ``server`` accepts: wirebench's installed codecs and, in a real vLLM,
    vLLM's own serializer, which lives inside the server, not in this venv; in a real SGLang, its own two
    IPC modes alone."""
    if server == "sglang":
        return list(SGLANG_MODES)
    known = available_codecs()
    return [*known, OWN_CODEC] if server == "vllm" and OWN_CODEC not in known else known


def codec_refusal(name: str, server: str = "wirebench") -> str | None:
    """Why an arm of ``server`` cannot use codec ``name`` (one line), or None. A codec whose package is
    missing here is named with the flag that installs it."""
    if server == "vllm" and name == OWN_CODEC:
        return None  # the plugin keeps vLLM's serializer inside vLLM: nothing to load here
    if server == "sglang":
        if name in SGLANG_MODES:
            return None  # SGLang's own serializer, switched inside SGLang
        return (
            f"codec {name!r}: with --server sglang an arm is one of SGLang's own IPC modes, "
            f"{' or '.join(SGLANG_MODES)} (wirebench's codecs do not know SGLang's message types)"
        )
    try:
        check_codec_spec(name)
    except UnknownCodecError as exc:
        why = str(exc)
        if name == OWN_CODEC and server != "vllm":
            why += (
                f"; with --server vllm, '{OWN_CODEC}' is vLLM's own serializer inside the server and needs none of it"
            )
        return why
    return None


def parse_codecs(spec: str, server: str = "wirebench") -> list[ArmSpec]:
    """``--codec``: names (with calibration options), comma-separated, or 'all'. A repeated codec gets NAME#2.
    ``server``: whose server the arms run (a real vLLM also accepts its own serializer, ``vllm``)."""
    known = arm_codecs(server)
    names = known if spec.strip() == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ValueError(f"no codec given; available: {', '.join(known)}, or all")
    registered = {*available_codecs(), *codec_registry.unavailable_codecs()}
    unknown, problems = [], []
    for name in dict.fromkeys(names):
        why = codec_refusal(name, server)
        if why is None:
            continue
        if server == "sglang" or codec_registry.split_spec(name)[0] in registered:
            problems.append(why)  # not installed here, unusable, or bad options: the codec's own reason
        else:
            unknown.append(name)
    if unknown:
        problems.insert(0, f"unknown codec(s) {', '.join(unknown)}; available: {', '.join(known)}, or all")
    if problems:
        raise ValueError("; ".join(problems))
    arms: list[ArmSpec] = []
    for name in names:
        seen = sum(1 for a in arms if a.codec == name)
        arms.append(ArmSpec(name if not seen else f"{name}#{seen + 1}", name))
    return arms


def parse_arm_flags(specs: Sequence[str], arms: Sequence[ArmSpec]) -> dict[str, tuple[str, ...]]:
    """``--arm-flags LABEL='--flag value'`` (repeatable): extra server flags for one arm, led by its
    environment's ``NAME=value`` words from every spec (``split_arm_env``)."""
    labels = {a.label for a in arms}
    out: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        label, sep, flags = spec.partition("=")
        if not sep or label not in labels:
            raise ValueError(
                f"--arm-flags {spec!r}: expected LABEL=FLAGS with LABEL one of {', '.join(sorted(labels))}"
            )
        # Leading NAME=value words are an environment (--server vllm): they stay ahead of every flag.
        env, words = split_arm_env(tuple(shlex.split(flags)))
        kept_env, kept = split_arm_env(out.get(label, ()))
        out[label] = (*(f"{k}={v}" for k, v in {**kept_env, **env}.items()), *kept, *words)
    return out


_ENV_WORD = re.compile(r"[A-Z_][A-Z0-9_]*=")


def split_arm_env(words: tuple[str, ...]) -> tuple[dict[str, str], tuple[str, ...]]:
    """An arm's --arm-flags words as a shell reads a command: leading ``NAME=value`` words are environment
    variables of its vLLM (``VLLM_MSGPACK_ZERO_COPY_THRESHOLD=1024 --async-scheduling``), the rest flags."""
    env: dict[str, str] = {}
    i = 0
    while i < len(words) and _ENV_WORD.match(words[i]):
        name, value = words[i].split("=", 1)
        env[name] = value
        i += 1
    return env, words[i:]


ARM_HELP = (
    "an arm by name (repeatable; replaces --codec's arms, the first is the reference): "
    "NAME='[--python PY] [--codec C] [--transport T] [bench serve flags...]' runs PY -m harness.cli serve "
    "(PY: another checkout's venv, e.g. base against head; with --server vllm, PY is the arm's own vLLM venv "
    "and the flags are vLLM's), or NAME='--command \"CMD ... {port} ...\"' "
    "runs any server on a free port, ready when GET /health answers 200"
)


def parse_build_arms(
    specs: Sequence[str], default_codec: str, default_transport: str = "zmq", server: str = "wirebench"
) -> tuple[list[ArmSpec], dict[str, tuple[str, ...]]]:
    """``--arm NAME=SPEC`` (repeatable): the arms and their extra bench serve flags; ``server`` as in
    ``parse_codecs``."""
    arms: list[ArmSpec] = []
    flags: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        label, sep, rest = spec.partition("=")
        label = label.strip()
        if not sep or not label or "/" in label:
            raise ValueError(
                f"--arm {spec!r}: expected NAME=SPEC (NAME without '/'), e.g. base='--python ../base/.venv/bin/python'"
            )
        if any(a.label == label for a in arms):
            raise ValueError(f"--arm {label!r} given twice")
        words = shlex.split(rest)
        options: dict[str, str] = {}
        extra: list[str] = []
        i = 0
        while i < len(words):
            word = words[i]
            key, eq, value = word.partition("=")
            if key in ("--python", "--codec", "--transport", "--command"):
                if not eq:
                    if i + 1 >= len(words):
                        raise ValueError(f"--arm {label}: {key} needs a value")
                    value, i = words[i + 1], i + 1
                options[key[2:]] = value
            else:
                extra.append(word)
            i += 1
        codec = options.get("codec", default_codec)
        if "," in codec:
            raise ValueError(f"--arm {label}: one codec per arm, got {codec!r} (give --codec in the arm's spec)")
        if "command" in options and (extra or "python" in options):
            raise ValueError(f"--arm {label}: --command runs a server of its own: no --python or serve flags with it")
        transport = options.get("transport", default_transport)
        if "command" not in options:
            why = codec_refusal(codec, server)
            if why is not None:
                raise ValueError(f"--arm {label}: {why}")
            if transport not in transport_names():
                raise ValueError(
                    f"--arm {label}: unknown transport {transport!r}; choose from {', '.join(transport_names())}"
                )
        arms.append(ArmSpec(label, codec, transport, options.get("python"), options.get("command")))
        if extra:
            flags[label] = tuple(extra)
    return arms, flags


def williams_rows(k: int) -> list[list[int]]:
    """A Williams design for k arms: k rows (2k when k is odd), each a permutation, in which every arm
    takes every position equally often and directly follows every other arm equally often."""
    if k <= 1:
        return [list(range(k))]
    first = [0]
    lo, hi = 1, k - 1
    while len(first) < k:
        first.append(lo)
        lo += 1
        if len(first) < k:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % k for x in first] for i in range(k)]
    return rows if k % 2 == 0 else rows + [row[::-1] for row in rows]


def round_order(arms: list[T], rnd: int) -> list[T]:
    """The arms in round (or block) ``rnd``: row rnd of the Williams design, cycling (2 arms: A B, B A)."""
    rows = williams_rows(len(arms))
    return [arms[i] for i in rows[rnd % len(rows)]]
