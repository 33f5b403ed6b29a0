"""The bench command: one subcommand per module under harness/commands/.

A command module has ``add_arguments(parser)`` and ``main(args) -> int``, and
may have ``DESCRIPTION`` and ``EPILOG`` (what its --help says above and below
the flags; plain text, wrapped as it should print) and ``PRESETS`` /
``NAMED_PRESETS``. Modules are imported only when their command runs, so
``bench micro`` does not pay for aiohttp and ``bench load`` not for torch. A flag a command does
not take is that command's error: its usage, then the closest of its flags (exit 2).

Ctrl-C and SIGTERM stop every command the same way (``stop_on_signals``): an
interrupted command exits 130, or 143 when SIGTERM stopped it, with one line
and no traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from harness.processes import parent_watch

DESCRIPTION = """\
Measure what it costs an LLM server to pass messages between its API process
and its engine process: how each codec serializes them and each transport
moves them, from single calls timed against a memcpy to a served model under
load, with arms compared in interleaved rounds and judged statistically."""

EPILOG = """\
Start with 'bench micro' (the codecs alone, no server) or 'bench run --codec
pickle,msgspec --repeat 7' (a served comparison with verdicts). Every command
has its own --help."""

# Each command's module and the one sentence the command list shows for it.
COMMANDS: dict[str, tuple[str, str]] = {
    "micro": ("harness.commands.micro", "Time each codec on fixed payloads against a memcpy."),
    "serve": ("harness.commands.serve", "Start the OpenAI-compatible API server and its engine."),
    "load": ("harness.commands.load", "Replay a workload against an OpenAI-compatible server."),
    "run": ("harness.commands.run", "Serve and load each codec in rounds; judge them side by side."),
    "compare": ("harness.commands.compare", "Judge saved results; with --gate, the CI regression gate."),
    "calibrate": ("harness.commands.calibrate", "Find the smallest cost this machine can detect."),
    "sweep": ("harness.commands.sweep", "Find where codecs cross over payload sizes and rates."),
    "report": ("harness.commands.report", "Write saved results as one self-contained HTML page."),
    "check-codec": ("harness.commands.check_codec", "Check that codecs keep the codec contract (plugins too)."),
}


EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM: an interrupted command that SIGTERM stopped
_terminated: list[int] = []  # the SIGTERMs received, so the exit code can say which signal stopped the command


FLAG = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")  # in a usage line: its flags, not their metavars


class CommandParser(argparse.ArgumentParser):
    """A command's parser: an argument the command does not take is its error (its usage, exit 2), with
    the closest of its flags, not the top-level parser's, which knows none of them."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # argparse's overloads, as one
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized(extras, self.flags()))
        return parsed, extras

    def flags(self) -> list[str]:
        """Every flag the command takes, as its usage names them (argparse keeps its actions private)."""
        return list(dict.fromkeys(FLAG.findall(self.format_usage())))


def unrecognized(extras: Sequence[str], flags: Sequence[str]) -> str:
    """``unrecognized argument --num-promts (did you mean --num-prompts?)``: each unknown flag (or, when no
    flag is among them, each stray argument) with the closest flag the command has."""
    unknown = [a for a in extras if a.startswith("-")] or list(extras)
    named = []
    for arg in unknown:
        close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1) if arg.startswith("-") else []
        named.append(f"{arg} (did you mean {close[0]}?)" if close else arg)
    return f"unrecognized argument{'s' if len(named) > 1 else ''} {', '.join(named)}"


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, str | None]:
    raw = argparse.RawDescriptionHelpFormatter  # descriptions and epilogs print as written
    parser = argparse.ArgumentParser(prog="bench", description=DESCRIPTION, epilog=EPILOG, formatter_class=raw)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", parser_class=CommandParser)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, summary) in COMMANDS.items():
        cmd = sub.add_parser(name, help=summary, description=summary, formatter_class=raw)
        # Only the chosen command's module is imported to add its flags and its help text.
        if name == wanted:
            command = importlib.import_module(module)
            cmd.description = getattr(command, "DESCRIPTION", summary)
            cmd.epilog = getattr(command, "EPILOG", None)
            command.add_arguments(cmd)
            # A preset flag (sweep's --quick, run's --preset NAME) changes defaults before parsing, so
            # flags given still win.
            for flag, defaults in getattr(command, "PRESETS", {}).items():
                if flag in argv:
                    cmd.set_defaults(**defaults)
            for flag, named in getattr(command, "NAMED_PRESETS", {}).items():
                value = flag_value(argv, flag)
                if value in named:
                    cmd.set_defaults(**named[value], applied_preset=value)
    return parser, wanted


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--flag V`` or ``--flag=V``), the last one wins; None if absent."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, wanted = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    stop_on_signals()  # `bench serve` installs its own handlers once it runs
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        code = int(module.main(args) or 0)
    except KeyboardInterrupt:  # a command that did not say where it stopped: still one line, no traceback
        print(f"bench {args.command}: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    return EXIT_TERMINATED if code == EXIT_INTERRUPTED and _terminated else code


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C's KeyboardInterrupt would be: every path that
    stops cleanly on Ctrl-C (servers stopped, what was measured saved) stops the same way on SIGTERM."""


def stop_on_signals() -> None:
    """Ctrl-C and SIGTERM stop a command the same way, SIGTERM with its own exit code."""
    parent_watch.terminate_as_interrupt()  # SIGINT back where a shell left it ignored
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _terminated.append(signum)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        raise Terminated()
    # Inside asyncio.run its own SIGINT handler is current: it cancels the running load, which then keeps
    # what it measured; raising here instead would tear the event loop down mid-callback.
    signal.raise_signal(signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
