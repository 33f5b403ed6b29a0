"""Per-request bounds, defined once and checked by both processes.

The frontend checks them while parsing a request's JSON (a 400 naming the ``bench serve`` flag);
the engine checks the same values again on every request it decodes, because its peer may be a
frontend it does not know (another build, or a process holding valid keys that ignores the
bounds): an oversize request becomes an error output for that request alone. Each bound is a
length, checked before any element is walked, so a 2 M-entry list costs a ``len()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.wire.messages import SamplingParams, SamplingParamsError


@dataclass(frozen=True)
class RequestLimits:
    """Per-request bounds; `bench serve` sets each by the flag ``over_limit`` names."""

    max_prompt_tokens: int = 2_048  # token-id prompts: the context length
    max_messages: int = 1_024
    max_stop_strings: int = 16
    max_stop_chars: int = 4_096
    max_stop_token_ids: int = 64
    max_logit_bias: int = 1_024


DEFAULT_LIMITS = RequestLimits()


def over_limit(n: int, limit: int, what: str, flag: str) -> str | None:
    """The refusal's message when ``n`` is over ``limit``, else None (one wording for both processes)."""
    if n > limit:
        return f"{what}: {n} is over the limit of {limit} (bench serve {flag})"
    return None


def check_sampling_bounds(sp: SamplingParams, limits: RequestLimits) -> None:
    """Raise SamplingParamsError for a list or map in ``sp`` longer than ``limits`` allow.

    Lengths first, then the stop strings' characters (at most ``max_stop_strings`` of them
    are summed), so the cost is bounded whatever the peer sent.
    """
    stop = sp.stop if isinstance(sp.stop, list) else []
    checks = (
        (len(stop), limits.max_stop_strings, "stop strings", "--max-stop-strings", "stop"),
        (
            len(sp.stop_token_ids),
            limits.max_stop_token_ids,
            "'stop_token_ids' entries",
            "--max-stop-token-ids",
            "stop_token_ids",
        ),
        (len(sp.logit_bias or ()), limits.max_logit_bias, "'logit_bias' entries", "--max-logit-bias", "logit_bias"),
    )
    for n, limit, what, flag, param in checks:
        if (message := over_limit(n, limit, what, flag)) is not None:
            raise SamplingParamsError(param, message)
    chars = sum(len(s) if isinstance(s, str) else 0 for s in stop)
    if message := over_limit(chars, limits.max_stop_chars, "characters in all stop strings", "--max-stop-chars"):
        raise SamplingParamsError("stop", message)
