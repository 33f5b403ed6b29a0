"""``bench check-codec``: the codec contract's checks (``wirecodecs.conformance``) run on named codecs.

For a plugin's author: the suite wirebench's own tests run over the built-in
codecs, against a codec registered by entry point, without wirebench's tests.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Iterable

from harness.loadgen.arrivals import positive_float
from wirecodecs import UnknownCodecError, codec_listing, conformance, conformance_runner
from wirecodecs.conformance import CHECKS, CheckResult

DEFAULT_TIMEOUT_S = 30.0

DESCRIPTION = """\
Check that codecs keep the codec contract (docs/architecture.md, "The codec
contract"): every wire message round-trips bit for bit, the multimodal kinds
the codec declares travel and the others are refused with
UnsupportedPayloadError, frames decode from bytes, bytearray, memoryview and
zmq.Frame, instances can be reused, and the frame rules of its declared
out-of-band buffers hold. A codec is a built-in or one a package registers in
the wirebench.codecs entry-point group. One line per check, then a summary.

The checks run in a process of their own, each under --timeout: a check that
hangs, or whose codec raises SystemExit or ends the process, fails saying so,
and the others still run. Messages from the codec's own code are cut at 2,000
characters."""

EPILOG = """\
examples:
  bench check-codec my-codec
  bench check-codec pickle msgspec --only text_messages

exit codes: 0 every check passed; 1 a check failed (the summary names it);
2 an unknown codec name (the known ones are listed), a codec that cannot be
loaded (a plugin whose module fails to import, say) or bad flags."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "codecs",
        nargs="+",
        metavar="NAME",
        help=f"codecs to check, built-in or registered by a package's entry point: {codec_listing()}",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=list(CHECKS),
        default=[],
        metavar="CHECK",
        help=f"run only this check (repeat for more; default: all of them): {', '.join(CHECKS)}",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"time limit of each check: one that runs longer is stopped and fails (default: {DEFAULT_TIMEOUT_S:g})",
    )


def result_line(codec: str, result: CheckResult) -> str:
    """``PASS pickle text_messages: ...``; a multi-line message indented under its check."""
    mark = "SKIP" if result.skipped else "PASS" if result.passed else "FAIL"
    message = result.message.replace("\n", "\n    ")
    return f"{mark} {codec} {result.name}: {message}"


def summary_line(codec: str, results: list[CheckResult]) -> str:
    failed = [r.name for r in results if not r.passed]
    skipped = sum(r.skipped for r in results)
    passed = len(results) - len(failed) - skipped
    counts = f"{passed} passed, {len(failed)} failed, {skipped} not applicable"
    return f"{codec}: {counts}" + (f" (failed: {', '.join(failed)})" if failed else "")


def report_codec(subject: conformance.Subject, results: Iterable[CheckResult]) -> list[str]:
    """Prints a codec's note, its results as they come and its summary; returns the checks it failed."""
    allowed = subject.leeway.describe()
    if allowed:
        print(f"NOTE {subject.name}: speaks another project's messages; allowed: {allowed}", flush=True)
    done = []
    for result in results:
        print(result_line(subject.name, result), flush=True)
        done.append(result)
    print(summary_line(subject.name, done), flush=True)
    return [r.name for r in done if not r.passed]


def main(args: argparse.Namespace) -> int:
    # Every name is looked up before any check runs: a typo costs nothing.
    subjects = {}
    for name in dict.fromkeys(args.codecs):
        try:
            subjects[name] = conformance.Subject(name)
        except UnknownCodecError as exc:
            print(f"bench check-codec: error: {exc}", file=sys.stderr)  # it names the known codecs
            return 2
    failures: dict[str, list[str]] = {}
    bounded = conformance_runner.run_checks_bounded(list(subjects.values()), args.timeout, only=args.only)
    for subject, pairs in itertools.groupby(bounded, key=lambda pair: pair[0]):
        failed = report_codec(subject, (result for _, result in pairs))
        if failed:
            failures[subject.name] = failed
    if failures:
        named = "; ".join(f"{name}: {', '.join(checks)}" for name, checks in failures.items())
        print(f"bench check-codec: FAILED {named}", file=sys.stderr)
        return 1
    print(f"bench check-codec: every check passed ({', '.join(subjects)})")
    return 0
