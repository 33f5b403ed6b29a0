"""``bench check-codec``: the codec contract's checks (``wirecodecs.conformance``) run on named codecs.

For a plugin's author: the suite wirebench's own tests run over the built-in
codecs, against a codec registered by entry point, without wirebench's tests.
"""

from __future__ import annotations

import argparse
import sys

from wirecodecs import UnknownCodecError, codec_listing, conformance
from wirecodecs.conformance import CHECKS, CheckResult

DESCRIPTION = """\
Check that codecs keep the codec contract (docs/architecture.md, "The codec
contract"): every wire message round-trips bit for bit, the multimodal kinds
the codec declares travel and the others are refused with
UnsupportedPayloadError, frames decode from bytes, bytearray, memoryview and
zmq.Frame, instances can be reused, and the frame rules of its declared
out-of-band buffers hold. A codec is a built-in or one a package registers in
the wirebench.codecs entry-point group. One line per check, then a summary."""

EPILOG = """\
examples:
  bench check-codec my-codec
  bench check-codec pickle msgspec --only text_messages

exit codes: 0 every check passed; 1 a check failed (the summary names it);
2 an unknown codec name (the known ones are listed) or bad flags."""


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
    for name, subject in subjects.items():
        if subject.leeway.describe():
            print(f"NOTE {name}: speaks another project's messages; allowed: {subject.leeway.describe()}")
        results = conformance.run_checks(subject, only=args.only)
        for result in results:
            print(result_line(name, result), flush=True)
        print(summary_line(name, results), flush=True)
        failed = [r.name for r in results if not r.passed]
        if failed:
            failures[name] = failed
    if failures:
        named = "; ".join(f"{name}: {', '.join(checks)}" for name, checks in failures.items())
        print(f"bench check-codec: FAILED {named}", file=sys.stderr)
        return 1
    print(f"bench check-codec: every check passed ({', '.join(subjects)})")
    return 0
