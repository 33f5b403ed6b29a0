"""What ``bench serve`` refuses at start, in process: each check runs, then the start stops short."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from harness.cli import build_parser
from harness.commands import serve as serve_command
from harness.wire import curve


class Started(Exception):
    """Raised by the first step past the start's refusals."""


def _serve(argv: list[str]) -> int:
    parser, _ = build_parser(argv)
    return asyncio.run(serve_command.serve(parser.parse_args(argv)))


def test_a_frontend_only_host_leaves_the_cuda_graphs_refusal_to_the_engines_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CPU-only frontend host given --cuda-graphs (passed to both sides) starts: it runs no engine."""

    def started(name: str) -> None:  # the first step past the refusals: the transport's sender
        raise Started

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(serve_command, "get_transport", started)
    curve.create_or_load(tmp_path / "keys")  # as the engine's host would have made them
    frontend_only = ["serve", "--cuda-graphs", "--frontend-only", "--engine-port", "5555"]
    with pytest.raises(Started):
        _serve([*frontend_only, "--curve-dir", str(tmp_path / "keys")])
    assert _serve(["serve", "--cuda-graphs"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "bench serve: --cuda-graphs needs a CUDA device; this machine has none"
    ]
