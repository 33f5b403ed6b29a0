"""``bench micro``: time each codec on fixed payloads against one memcpy.

Prints one table row per codec x payload cell as it is measured: encode and
decode p50 (and p99 with ``--wide``), wire bytes and frames of one encode, the
memcpy reference, ratio = (enc p50 + dec p50) / memcpy p50, and the adapter's
time where a chosen codec has one. The default view fits 100 columns. What is timed and how is
``harness.micro.timing``'s docstring; the payloads and what counts as their
bytes are ``harness.micro.payloads``'s.

``text-550-path`` is not one message but a prompt's ids along the request path
(``harness.micro.token_path``): its enc column starts from the tokenizer's output and its
dec column ends at the engine's model-input tensor; the output's legend says so in one line.

``--transport zmq,shm`` adds the delivery table (``harness.micro.delivery``):
encode, send to another process, receive, decode, against the same memcpy, over
the transports ``bench serve`` offers, by the same names; ``--in-place``,
``--bell`` and ``--store-miss`` add the variants of those that have them.

``--count instructions`` counts instead of timing: each codec call's instructions under
valgrind's callgrind (``harness.micro.instructions``), repeatable on a shared machine;
with ``--baseline FILE`` the counts are gated against a committed instructions document
(exit 1 when a cell rose by more than ``--threshold-pct``, 2 unusable or incomparable,
3 a baseline cell not counted now).

``--json PATH`` writes the micro document (``harness.analysis.documents.micro_document``):
a JSON list with one object per cell, each carrying the run's metadata so it
stands alone, then one object per delivery cell.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import wirecodecs
from harness import sglang_hook
from harness.analysis import table as text_table
from harness.analysis.table import format_line
from harness.micro import delivery, sglang_cells
from harness.micro.payloads import PAYLOADS
from harness.micro.timing import (
    DEFAULT_MIN_ITERATIONS,
    DEFAULT_MIN_TIME_S,
    DeliveryMeasurement,
    Measurement,
    measure,
    measure_delivery,
    one_torch_thread,
    payload_reference,
    run_metadata,
)
from harness.micro.token_path import PATH_PAYLOADS
from harness.transports import UnknownTransportError, get_transport, transport_names
from harness.transports.base import VARIANTS
from harness.transports.registry import loaded_transports

# --- the tables --------------------------------------------------------------


DESCRIPTION = """\
Time each codec's encode and decode on fixed payloads (a prompt, output
batches, images, tensors) against one memcpy of the same bytes. One row per
codec and payload: encode and decode p50 (and p99 with --wide), the wire bytes
and frames of one encode, the memcpy and the ratio (encode p50 + decode p50) /
memcpy p50.
--transport adds delivery to another process. --count instructions counts each
call's instructions under valgrind instead of timing it (counts stay the same
on a busy machine, times do not), and --baseline gates those counts."""

EPILOG = """\
examples:
  bench micro
  bench micro --codec pickle,msgspec --payload text-550,outputs-64
  bench micro --payload image-1024 --transport zmq,shm --in-place
  bench micro --count instructions --json counts.json

exit codes: 0 measured; 2 bad flags. With --baseline: 1 a count rose by more
than --threshold-pct, 2 the baseline is unusable or not comparable, 3 a
baseline cell was not counted."""


def _us(x: float) -> str:
    return f"{x:,.2f}" if x < 100 else f"{x:,.1f}" if x < 10_000 else f"{x:,.0f}"


def _ratio_text(r: float) -> str:
    return f"{r:,.0f}" if r >= 100 else f"{r:.1f}" if r >= 10 else f"{r:.2f}" if r >= 1 else f"{r:.3f}"


def machine_line(meta: dict[str, Any]) -> str:
    libs = meta["libraries"]
    return (
        f"CPU: {meta['cpu_model']} ({meta['cpu_count']} cores) | "
        f"Python {meta['python']} | torch {libs['torch']} (threads pinned to "
        f"{meta['torch_threads']}) | msgspec {libs['msgspec']} | pyzmq {libs['pyzmq']}"
    )


# Columns are fixed before the first row, so rows print as they are measured. The default view fits
# WIDTH columns (p50s, times in µs said once in the legend); --wide adds the p99s and, for delivery,
# the cold memcpy, the parts and the first send.

WIDTH = text_table.WIDTH


@dataclass(frozen=True)
class Figure:
    """One figure column: its title, its width in each view, and whether only --wide shows it."""

    title: str
    width: int
    wide_width: int
    in_us: bool  # a time: "µs" in its --wide title, in the legend otherwise
    wide_only: bool = False

    def heading(self, wide: bool) -> str:
        return f"{self.title} µs" if wide and self.in_us else self.title


@dataclass(frozen=True)
class Table:
    """Name columns (left-aligned) and figure columns (right-aligned), widths fixed up front."""

    names: list[str]
    figures: list[Figure]
    widths: list[int]
    wide: bool

    def header_lines(self) -> list[str]:
        head = format_line([*self.names, *(f.heading(self.wide) for f in self.figures)], self.widths, len(self.names))
        return [head, "-" * len(head)]

    def row(self, names: Sequence[str], figures: dict[str, str]) -> str:
        return format_line([*names, *(figures[f.title] for f in self.figures)], self.widths, len(self.names))

    def failed_row(self, names: Sequence[str], why: str) -> str:
        """The names, then why the cell has no figures; wrapped under the figures in the default view."""
        line = format_line([*names, why], self.widths, len(self.names))
        if self.wide or len(line) <= WIDTH:
            return line
        return "\n".join(text_table.wrapped([line], WIDTH, hang=sum(w + 2 for w in self.widths[: len(self.names)])))


def make_table(names: dict[str, Sequence[str]], figures: Sequence[Figure], wide: bool) -> Table:
    """A table for these name columns (title: the values they will hold) and the figures the view shows."""
    shown = [f for f in figures if wide or not f.wide_only]
    name_widths = [max(len(title), *map(len, values)) for title, values in names.items()]
    figure_widths = [max(f.wide_width if wide else f.width, len(f.heading(wide))) for f in shown]
    return Table(list(names), shown, name_widths + figure_widths, wide)


def wrapped(text: str, indent: str = "") -> list[str]:
    """A legend in lines of at most WIDTH columns."""
    return text_table.wrapped([indent + text], WIDTH, hang=2)


def has_adapter(codec: str) -> bool:
    """Whether the codec converts our messages to its own (its class says; one that does not load has none)."""
    try:
        return hasattr(wirecodecs.registry.codec_class(codec), "to_native")
    except wirecodecs.UnknownCodecError:
        return False


CELL_FIGURES = [
    Figure("enc p50", 7, 11, in_us=True),
    Figure("enc p99", 7, 11, in_us=True, wide_only=True),
    Figure("dec p50", 7, 11, in_us=True),
    Figure("dec p99", 7, 11, in_us=True, wide_only=True),
    Figure("bytes", 10, 12, in_us=False),
    Figure("frames", 6, 6, in_us=False),
    Figure("memcpy", 7, 10, in_us=True),
    Figure("ratio", 6, 8, in_us=False),
]
ADAPTER = Figure("adapter", 7, 11, in_us=True)  # only where a chosen codec has an adapter: else all "-"


def cell_table(codecs: Sequence[str], payloads: Sequence[str], wide: bool = False) -> Table:
    adapter = [ADAPTER] if any(has_adapter(c) for c in codecs) else []
    return make_table({"codec": codecs, "payload": payloads}, [*CELL_FIGURES, *adapter], wide)


def cell_figures(m: Measurement) -> dict[str, str] | None:
    """Every figure of a measured cell by column title; None where the cell did not run."""
    cell, memcpy, ratio = m.cell, m.memcpy, m.ratio
    if cell.status != "ok" or cell.encode is None or cell.decode is None:
        return None
    return {
        "enc p50": _us(cell.encode.p50_us),
        "enc p99": _us(cell.encode.p99_us),
        "dec p50": _us(cell.decode.p50_us),
        "dec p99": _us(cell.decode.p99_us),
        "bytes": f"{cell.wire_bytes:,}",
        "frames": str(cell.frames),
        "memcpy": _us(memcpy.p50_us) if memcpy else "-",
        "ratio": _ratio_text(ratio) if ratio is not None else "-",
        "adapter": _us(cell.adapt.p50_us) if cell.adapt is not None else "-",
    }


def format_row(table: Table, m: Measurement) -> str:
    figures = cell_figures(m)
    names = [m.cell.codec, m.cell.payload]
    return table.row(names, figures) if figures else table.failed_row(names, f"{m.cell.status}: {m.cell.reason}")


DELIVERY_FIGURES = [
    Figure("p50", 7, 11, in_us=True),
    Figure("p99", 7, 11, in_us=True),
    Figure("memcpy", 7, 10, in_us=True),
    Figure("ratio", 6, 8, in_us=False),
    Figure("cold memcpy", 7, 15, in_us=True, wide_only=True),
    *(Figure(part, 7, 11, in_us=True, wide_only=True) for part in delivery.PARTS),
    Figure("first", 7, 11, in_us=True, wide_only=True),
]


def transport_label(name: str, variant: str) -> str:
    """A transport as the table names it (``delivery.Delivery.label``): ``shm``, ``shm in-place``."""
    return f"{name} {variant}" if variant else name


def delivery_table(
    codecs: Sequence[str], payloads: Sequence[str], transports: Sequence[tuple[str, str]], wide: bool = False
) -> Table:
    labels = [transport_label(*t) for t in transports]
    return make_table({"codec": codecs, "payload": payloads, "transport": labels}, DELIVERY_FIGURES, wide)


def format_delivery_row(table: Table, dm: DeliveryMeasurement) -> str:
    d, memcpy = dm.delivery, dm.memcpy
    names = [d.codec, d.payload, d.label]
    if d.status != "ok":
        return table.failed_row(names, f"{d.status}: {d.reason}")
    figures = {
        "p50": _us(d.p50_us),
        "p99": _us(d.p99_us),
        "memcpy": _us(memcpy.p50_us),
        "ratio": _ratio_text(dm.ratio),
        "cold memcpy": _us(dm.memcpy_cold.p50_us) if dm.memcpy_cold else "-",
        **{part: _us(us) for part, us in d.parts_p50_us.items()},
        "first": _us(d.first_us),
    }
    return table.row(names, figures)


# Every payload name, messages then paths; the default selection. Paths are timed only: delivery
# and instruction counts take messages.
ALL_PAYLOADS = [*PAYLOADS, *PATH_PAYLOADS]
PATH_LEGEND = (
    "text-550-path = a 550-token prompt's ids: enc = the frontend's ids from the tokenizer's output "
    "(list; int32 array for packed codecs) + encode, dec = decode + the engine's model-input tensor"
)


# --- command -----------------------------------------------------------------


def parse_names(value: str | None, known: Sequence[str], kind: str) -> list[str]:
    """A comma-separated selection, validated against ``known``; None selects all."""
    if value is None:
        return list(known)
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--{kind} needs at least one name; available: {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {kind} {', '.join(map(repr, unknown))}; available: {', '.join(known)}")
    return list(dict.fromkeys(names))


def chosen_codecs(selection: str | None, sglang_python: str) -> tuple[list[str], str | None]:
    """--codec's codecs (None: every registered one, and SGLang's where its Python is there), with a note
    for what the default left out; SGLang's named without its Python are refused (ValueError)."""
    sglang = sglang_cells.codec_names()
    codecs = parse_names(selection, [*wirecodecs.available_codecs(), *sglang], "codec")
    if Path(sglang_python).is_file():
        return codecs, None
    if selection is None:
        note = f"SGLang's messages not timed: no Python at {sglang_python} ({sglang_cells.SETUP_HINT})"
        return [c for c in codecs if c not in sglang], note
    if any(c in sglang for c in codecs):
        raise ValueError(
            f"{', '.join(sglang)} need SGLang's Python, none at {sglang_python}: {sglang_cells.SETUP_HINT}"
        )
    return codecs, None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--codec", metavar="A,B", help="codecs to time (default: all registered)")
    parser.add_argument(
        "--payload", metavar="X,Y", help=f"payloads to time (default: all of {', '.join(ALL_PAYLOADS)})"
    )
    parser.add_argument(
        "--min-iterations",
        type=int,
        default=DEFAULT_MIN_ITERATIONS,
        help="timed calls per measurement, at least (default: %(default)s)",
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=DEFAULT_MIN_TIME_S,
        metavar="SECONDS",
        help="seconds per measurement, at least (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write a JSON list, one object per cell")
    parser.add_argument(
        "--sglang-python",
        metavar="PATH",
        default=str(sglang_hook.PYTHON),
        help=f"the Python of a venv with SGLang and wirebench, which times the {', '.join(sglang_cells.codec_names())} "
        "cells: SGLang's own messages in its two IPC modes (default: .venv-sglang's, which the default "
        "--codec includes when it is there)",
    )
    parser.add_argument(
        "--transport",
        metavar="X,Y",
        default=None,
        help=f"also time delivery to another process over these transports ({', '.join(transport_names())})",
    )
    for variant, meaning in VARIANTS.items():
        having = [t.name for t in loaded_transports() if variant in t.variants]
        parser.add_argument(
            f"--{variant}",
            action="store_true",
            help=f"with --transport, also time {' and '.join(having) or 'no transport'} this way: {meaning}",
        )
    parser.add_argument("--delivery-iterations", type=int, default=50, help="sends per delivery cell (default 50)")
    parser.add_argument(
        "--wide",
        action="store_true",
        help=f"every column, lines past {WIDTH} characters: the p99s, and with --transport the cold memcpy, "
        "each part of a send and the first send",
    )
    g = parser.add_argument_group("instruction counts (valgrind's callgrind)")
    g.add_argument(
        "--count",
        choices=("time", "instructions"),
        default="time",
        help="time the calls (default) or count each call's instructions, which repeat whatever else the machine does",
    )
    g.add_argument("--calls", type=int, default=200, help="counted calls per cell (default %(default)s)")
    g.add_argument(
        "--ops",
        default="encode,decode",
        metavar="OP,OP",
        help="what is counted per cell: encode, decode, and path (encode, a ZeroMQ inproc send and receive as "
        "the transport does them, decode: one message's whole trip without the kernel) (default %(default)s)",
    )
    g.add_argument(
        "--layouts",
        type=int,
        default=3,
        metavar="N",
        help="count each cell under the first N of 3 interpreter layouts, the median kept (default %(default)s; "
        "fewer is quicker, and a count may move by their spread, up to ~1%%)",
    )
    g.add_argument("--baseline", type=Path, metavar="FILE", help="gate the counts against this instructions document")
    g.add_argument(
        "--threshold-pct",
        type=float,
        default=1.0,
        help="gate: a cell fails when its count rose by more than this (default %(default)s)",
    )


def main(args: argparse.Namespace) -> int:
    try:
        codecs, note = chosen_codecs(args.codec, args.sglang_python)
        if note:
            print(f"note: {note}")
        payloads = parse_names(args.payload, ALL_PAYLOADS, "payload")
        names = parse_names(args.transport, list(transport_names()), "transport") if args.transport else []
        transports = _with_variants(names, [v for v in VARIANTS if getattr(args, v.replace("-", "_"))])
        if args.min_iterations < 1:
            raise ValueError(f"--min-iterations must be at least 1, got {args.min_iterations}")
        if not args.min_time >= 0:
            raise ValueError(f"--min-time must be >= 0, got {args.min_time}")
    except (ValueError, UnknownTransportError) as exc:
        print(f"bench micro: error: {exc}", file=sys.stderr)
        return 2

    paths = [p for p in payloads if p in PATH_PAYLOADS]
    messages = [p for p in payloads if p not in PATH_PAYLOADS]
    if args.count == "instructions":
        if paths and not messages:
            print(f"bench micro: error: {', '.join(paths)} can only be timed, not counted", file=sys.stderr)
            return 2
        if paths:
            print(f"note: not counted: {', '.join(paths)} (path payloads are timed only)")
        return _count_instructions(codecs, messages, args)
    settings = {"min_iterations": args.min_iterations, "min_time_s": args.min_time}
    with one_torch_thread():
        meta = run_metadata()  # inside: it records the pinned thread count
        cells = _print_cells(codecs, payloads, args, meta)
    if transports and paths:
        print(f"note: no delivery for {', '.join(paths)} (path payloads are timed in one process)")
    foreign = [c for c in codecs if c in sglang_cells.codec_names()]
    if transports and foreign:
        print(f"note: no delivery for {', '.join(foreign)} (SGLang's messages are timed in its own venv)")
        codecs = [c for c in codecs if c not in foreign]
    deliveries = (
        _print_deliveries(codecs, messages, transports, args.delivery_iterations, args.wide) if transports else []
    )
    if args.json is not None:
        # Here, not at the top: documents imports the load generator (aiohttp), which timing never needs.
        from harness.analysis import documents

        documents.write_json(args.json, documents.micro_document(cells, deliveries, settings, meta))
    return 0


def _with_variants(names: list[str], variants: list[str]) -> list[tuple[str, str]]:
    """Each transport as served (variant ""), then each asked variant it has."""
    if variants and not names:
        raise ValueError(f"--{variants[0]} needs --transport")
    cells = []
    for name in names:
        cells.append((name, ""))
        cells += [(name, v) for v in variants if v in get_transport(name).variants]
    for variant in variants:
        if not any(v == variant for _, v in cells):
            having = [t.name for t in loaded_transports() if variant in t.variants]
            raise ValueError(f"--{variant}: no chosen transport has this variant (these do: {', '.join(having)})")
    return cells


SGLANG_LEGEND = (
    "sglang-* = SGLang's own messages, in its venv (SGLang {sglang}): text-550 as the "
    "TokenizedGenerateReqInput its tokenizer sends, outputs-* as the BatchTokenIDOutput its scheduler sends; "
    "sglang-msgspec's enc and dec include the time stats' nested pickle"
)


def _print_cells(
    codecs: list[str], payloads: list[str], args: argparse.Namespace, meta: dict[str, Any]
) -> list[Measurement]:
    """The cell table, printed row by row as measured: wirebench's codecs here, then SGLang's in its venv."""
    min_iterations, min_time_s, wide = args.min_iterations, args.min_time, args.wide
    table = cell_table(codecs, payloads, wide)
    print("\n".join(wrapped(machine_line(meta))))
    p99s = "" if wide else " (--wide adds the p99s)"
    legend = f"min {min_iterations} iterations and {min_time_s:g} s per measurement; times in µs{p99s}; "
    legend += "ratio = (enc p50 + dec p50) / memcpy p50"
    if ADAPTER in table.figures:
        legend += (
            "; adapter = a codec's conversion of our message to its own and back (vllm), outside enc, dec and ratio"
        )
    print("\n".join(wrapped(legend)))
    if any(p in PATH_PAYLOADS for p in payloads):
        print("\n".join(wrapped(PATH_LEGEND)))
    for line in table.header_lines():
        print(line)
    foreign = [c for c in codecs if c in sglang_cells.codec_names()]
    cells = []
    for m in measure([c for c in codecs if c not in foreign], payloads, min_iterations, min_time_s):
        print(format_row(table, m), flush=True)
        cells.append(m)
    if foreign:
        cells += _print_sglang_cells(table, foreign, payloads, args, meta, cells)
    return cells


def _print_sglang_cells(
    table: Table,
    codecs: list[str],
    payloads: list[str],
    args: argparse.Namespace,
    meta: dict[str, Any],
    done: list[Measurement],
) -> list[Measurement]:
    """SGLang's cells, each beside the payload's bytes and memcpy the other rows used (measured here if none did)."""
    references = {m.cell.payload: (m.payload_bytes, m.memcpy) for m in done}
    cells = []
    for item in sglang_cells.measure(args.sglang_python, codecs, payloads, args.min_iterations, args.min_time):
        if isinstance(item, dict):
            meta["sglang"] = {**item, "python_path": args.sglang_python}
            print("\n".join(wrapped(SGLANG_LEGEND.format(sglang=item.get("sglang", "?")))))
            continue
        if item.payload not in references:
            _, nbytes, memcpy, _ = payload_reference(item.payload, args.min_iterations, args.min_time)
            references[item.payload] = (nbytes, memcpy)
        m = Measurement(item, *references[item.payload])
        print(format_row(table, m), flush=True)
        cells.append(m)
    return cells


def _print_deliveries(
    codecs: list[str], payloads: list[str], transports: list[tuple[str, str]], iterations: int, wide: bool
) -> list[DeliveryMeasurement]:
    legend = (
        f"delivery: encode → send → receive in another process → decode, {iterations} one-at-a-time sends "
        f"after {delivery.WARMUP_SENDS} untimed ones; ratio = p50 / memcpy p50"
    )
    if wide:
        legend += (
            "; cold memcpy = the same copy with both arrays out of cache, as a send's copy finds them (the copy "
            "part's floor); first = the first send (one-time costs: the receiver's imports, fresh pages); each part "
            "is its own p50, one send's parts add up to its delivery:"
        )
    else:
        legend += f"; times in µs; --wide adds the cold memcpy, each part ({', '.join(delivery.PARTS)}), the first send"
    print()
    print("\n".join(wrapped(legend)))
    if wide:
        for part, meaning in delivery.PARTS.items():
            print("\n".join(wrapped(f"{part}: {meaning}", indent="  ")))
    table = delivery_table(codecs, payloads, transports, wide)
    for line in table.header_lines():
        print(line)
    deliveries = []
    for dm in measure_delivery(codecs, payloads, transports, iterations):
        print(format_delivery_row(table, dm), flush=True)
        deliveries.append(dm)
    return deliveries


def _count_instructions(codecs: list[str], payloads: list[str], args: argparse.Namespace) -> int:
    """--count instructions: the table, the document, and with --baseline the gate's exit code."""
    from harness.analysis import documents
    from harness.analysis import instruction_counts as ic
    from harness.micro import instructions

    uncountable = {
        **instructions.UNCOUNTABLE,
        **dict.fromkeys(sglang_cells.codec_names(), "timed in SGLang's venv only"),
    }
    named = [c for c in codecs if c in uncountable]
    if named and args.codec is not None:
        why = "; ".join(f"{c}: {uncountable[c]}" for c in named)
        print(f"bench micro: error: cannot count instructions of {why}", file=sys.stderr)
        return 2
    if named:
        print(f"note: not counted: {'; '.join(f'{c} ({uncountable[c]})' for c in named)}")
        codecs = [c for c in codecs if c not in named]

    if instructions.valgrind() is None:
        print(
            "bench micro: error: --count instructions needs valgrind (Debian: apt-get install -y valgrind)",
            file=sys.stderr,
        )
        return 2
    if args.calls < 1:
        print(f"bench micro: error: --calls must be at least 1, got {args.calls}", file=sys.stderr)
        return 2
    try:
        shifts = instructions.layouts(args.layouts)
    except ValueError as exc:
        print(f"bench micro: error: --{exc}", file=sys.stderr)
        return 2
    meta = {**run_metadata(), "valgrind": instructions.valgrind_version()}
    legend = (
        f"instructions per call under callgrind ({args.calls} counted calls per cell, the empty loop's subtracted; "
        f"median over {len(shifts)} interpreter layouts)"
    )
    print("\n".join(wrapped(legend)))
    counts = []
    try:
        ops = [op.strip() for op in args.ops.split(",") if op.strip()]
        for c in instructions.count_cells(codecs, payloads, args.calls, shifts, ops):
            spread = f"{min(c.per_layout):,.0f}..{max(c.per_layout):,.0f}"
            print(f"   {c.codec:<16} {c.payload:<18} {c.op:<7} {c.per_call:>14,.0f}   layouts {spread}", flush=True)
            counts.append(c)
    except (instructions.CountError, ValueError) as exc:
        print(f"bench micro: error: {exc}", file=sys.stderr)
        return 2
    doc = ic.instructions_document(counts, args.calls, meta, shifts)
    if args.json is not None:
        documents.write_json(args.json, doc)
        print(f"Counts saved to {args.json}")
    if args.baseline is None:
        return 0
    try:
        baseline = ic.check_document(documents.read_json(args.baseline), str(args.baseline))
        gate = ic.judge(doc, baseline, args.threshold_pct)
    except documents.ResultsError as exc:
        print(f"bench micro: error: {exc}", file=sys.stderr)
        return ic.EXIT_UNUSABLE
    if baseline.get("layout_shifts") is not None and list(baseline["layout_shifts"]) != list(shifts):
        print(f"note: the baseline was counted under layouts {baseline['layout_shifts']}, now {list(shifts)}")
    print("\n".join(text_table.wrapped(ic.format_gate(gate))))
    return gate.exit_code
