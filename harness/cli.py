"""``bench``: the command-line entry point.

Each subcommand lives in its own module under ``harness/commands/`` with
``add_arguments(parser)``, ``main(args) -> int`` and optionally ``PRESETS``;
modules are imported only when their command runs, so ``bench micro`` does not
pay for aiohttp and ``bench load`` not for torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from harness.wire import parent_watch

COMMANDS: dict[str, tuple[str, str]] = {
    "micro": ("harness.commands.micro", "time each codec on fixed payloads against one memcpy"),
    "serve": ("harness.commands.serve", "start the OpenAI-compatible frontend and the engine"),
    "load": ("harness.commands.load", "replay a workload against an OpenAI-compatible server"),
    "run": ("harness.commands.run", "for each codec: start a server, load it, report side by side with verdicts"),
    "compare": (
        "harness.commands.compare",
        "verdicts over saved results; with --baseline, the CI regression gate",
    ),
    "calibrate": ("harness.commands.calibrate", "what this machine can resolve: an A/A run and injected known costs"),
    "sweep": ("harness.commands.sweep", "codecs over a grid of payload sizes and request rates: crossover curves"),
    "report": ("harness.commands.report", "one self-contained HTML file: tables, verdicts, CDFs, budgets, sweeps"),
}


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, str | None]:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen command's module is imported to add its flags.
        if name == wanted:
            command = importlib.import_module(module)
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
    parent_watch.terminate_as_interrupt()  # `bench serve` installs its own handlers once it runs
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
