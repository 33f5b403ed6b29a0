"""The conformance checks (``wirecodecs.conformance``) each in a process of their own, under a time limit:
what ``bench check-codec`` runs, so that a codec that hangs, exits or crashes fails the check it was
in, and never takes the command with it."""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection

from .conformance import CHECKS, CheckResult, Subject, run_check
from .registry import error_text

# How long a fresh process may take to import the checks and the codec before the first check's clock starts.
STARTUP_LIMIT_S = 120.0


def run_checks_bounded(
    subjects: Sequence[Subject], timeout_s: float, only: Sequence[str] = ()
) -> Iterator[tuple[Subject, CheckResult]]:
    """``run_checks`` over each codec in turn, each check under ``timeout_s`` seconds, yielded as it finishes.

    The checks run in a child process: one that hangs is stopped and fails
    saying so, code that ends the process (``os._exit``, a crash) fails the
    check it ran in, and the checks after either run in a fresh process.
    Subjects must pickle (those of a registered name always do); nothing a
    codec does in the child can take this process with it.
    """
    pending = [(subject, name) for subject in subjects for name in CHECKS if not only or name in only]
    while pending:
        with _CheckingProcess(pending) as child:
            while pending and child.running:
                subject, check = pending.pop(0)
                yield subject, child.result_of(check, timeout_s)


class _CheckingProcess:
    """A spawned process that runs (codec, check) pairs in order, sending back each result as it finishes.

    Spawned, not forked: a fork of a process whose OpenMP threads have run
    (torch's, after any tensor work) hangs at its first parallel operation.
    """

    def __init__(self, checks: list[tuple[Subject, str]]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._results, sender = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_check_in_child, args=(checks, sender))
        self._process.start()
        sender.close()  # the child holds the only sending end: its exit is our end of file
        self._ready = False
        self.running = True

    def __enter__(self) -> _CheckingProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def result_of(self, check: str, timeout_s: float) -> CheckResult:
        """The next check's result, or its failure when it hangs past ``timeout_s`` or the process ends."""
        if not self._ready:
            if not self._results.poll(STARTUP_LIMIT_S):
                return self._failed(check, f"the process to run it did not start within {STARTUP_LIMIT_S:g} s")
            try:
                self._results.recv()  # the child's "imported: the checks begin"
            except EOFError:
                return self._failed(check, f"the process to run it ended as it started ({self._exit()})")
            self._ready = True
        if not self._results.poll(timeout_s):
            return self._failed(check, f"did not finish within the time limit of {timeout_s:g} s: stopped")
        try:
            result: CheckResult = self._results.recv()
        except EOFError:
            return self._failed(check, f"the process running it ended during the check ({self._exit()})")
        return result

    def _failed(self, check: str, why: str) -> CheckResult:
        """``check`` failed for ``why``; this process is done (the checks left go to a fresh one)."""
        self._stop()
        return CheckResult(check, False, why)

    def _exit(self) -> str:
        """How the process ended, in words."""
        self._process.join(10)
        code = self._process.exitcode
        if code is None:
            return "it closed its connection while still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def _stop(self) -> None:
        self.running = False
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._results.close()


def _check_in_child(checks: list[tuple[Subject, str]], results: Connection) -> None:
    """The child's side: ready once imported, then each check's result as it finishes."""
    results.send(None)
    for subject, check in checks:
        results.send(_contained(check, subject))
    results.close()


def _contained(check: str, subject: Subject) -> CheckResult:
    """``run_check``, with a KeyboardInterrupt the codec raises its failure too (a real Ctrl-C stops the parent)."""
    try:
        return run_check(check, subject)
    except BaseException as exc:
        return CheckResult(check, False, error_text(exc))
