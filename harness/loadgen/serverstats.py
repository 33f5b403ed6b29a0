"""What the server says about itself: model id, /metrics, codec figures.

The codec figures of a run are the difference of two /metrics scrapes, one
just before the load and one just after, so warmup and earlier runs are not
counted. A server without wirebench's codec counters (any other
OpenAI-compatible server) simply has no figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import aiohttp

from harness.server_metrics import prometheus

_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=10)


class ServerUnreachable(Exception):
    """The server did not answer at all (refused, DNS, timeout)."""


async def fetch_model_ids(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    """Model ids from GET /v1/models; [] when the endpoint is missing or odd.

    Raises ServerUnreachable when nothing answers.
    """
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with session.get(url, timeout=_PROBE_TIMEOUT) as resp:
            if resp.status != 200:
                return []
            body = await resp.json(content_type=None)
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        raise ServerUnreachable(f"cannot reach the server at {base_url}: {exc or type(exc).__name__}") from exc
    except (aiohttp.ClientError, ValueError):
        return []
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return []
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]


async def scrape_metrics(session: aiohttp.ClientSession, base_url: str) -> str | None:
    """The /metrics text, or None when the server has none or does not answer."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        async with session.get(url, timeout=_PROBE_TIMEOUT) as resp:
            if resp.status != 200:
                return None
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


@dataclass(frozen=True)
class DirectionFigures:
    """One direction's codec cost per message, over the run."""

    messages: float  # messages encoded in this direction during the run
    encode_us: float  # µs per message
    decode_us: float  # µs per message
    bytes_per_message: float  # as encoded (all frames)
    frames_per_message: float
    # Thread CPU µs per message in the same calls (NaN from a server without the counter):
    # wall minus CPU is time the codec's thread waited (the GIL, a busy core).
    encode_cpu_us: float = math.nan
    decode_cpu_us: float = math.nan


@dataclass(frozen=True)
class CodecFigures:
    """Codec costs over the run from the server's counters.

    request: the frontend encodes EngineCoreRequest, the engine decodes it.
    output:  the engine encodes EngineCoreOutputs (one message per engine
             step, shared by every request in the batch), the frontend
             decodes it.
    """

    codec: str | None
    request: DirectionFigures
    output: DirectionFigures
    cells: dict[tuple[str, str], prometheus.CodecCell]
    # --transport shm-store: the run's hits, misses, evictions and fallbacks; None for other transports.
    mm_store: dict[str, float] | None = None

    @property
    def mm_store_hit_pct(self) -> float:
        """Of the frames looked up in the store during the run, the share found there (NaN without a store)."""
        s = self.mm_store or {}
        looked_up = s.get("hit", 0.0) + s.get("miss", 0.0)
        return 100.0 * s.get("hit", 0.0) / looked_up if looked_up > 0 else math.nan

    @property
    def first_token_path_us(self) -> float:
        """Serialization on one request's path to its first token, in µs.

        = request encode + request decode + output encode + output decode,
        each the mean per message over the run. The first token cannot reach
        the client before the request has been encoded by the frontend and
        decoded by the engine, and the step output carrying the token has
        been encoded by the engine and decoded by the frontend: all four are
        serial on that path. Output messages are per engine step and shared
        by a batch, so their cost per message is the honest per-request
        cost on the path, not divided by the batch size.
        """
        return self.request.encode_us + self.request.decode_us + self.output.encode_us + self.output.decode_us

    def ttft_share(self, mean_ttft_ms: float) -> float:
        """first_token_path_us as a fraction of the mean TTFT (NaN when unknown)."""
        if not mean_ttft_ms or math.isnan(mean_ttft_ms):
            return math.nan
        return self.first_token_path_us / (mean_ttft_ms * 1000.0)


def codec_name(text: str | None) -> str | None:
    """The codec label of wirebench_codec_info, if the server exposes it."""
    if not text:
        return None
    for (name, labels), value in prometheus.parse(text).items():
        if name == prometheus.CODEC_INFO and value:
            codec = dict(labels).get("codec")
            if codec:
                return codec
    return None


def _has_codec_counters(values: dict) -> bool:
    names = {prometheus.CODEC_MESSAGES, prometheus.CODEC_SECONDS, prometheus.CODEC_BYTES, prometheus.CODEC_FRAMES}
    return any(name in names for name, _ in values)


def outputs_behind_share(before: str | None, after: str | None) -> float | None:
    """Of the outputs the server relayed between two scrapes, the share it took while the request's next
    one already waited (written back to back); None when it does not count them or relayed none."""
    if before is None or after is None:
        return None
    counts = []
    for text in (before, after):
        values = prometheus.parse(text)
        relayed, behind = (
            values.get((prometheus.OUTPUTS_RELAYED, frozenset())),
            values.get((prometheus.OUTPUTS_BEHIND, frozenset())),
        )
        if relayed is None or behind is None:
            return None
        counts.append((relayed, behind))
    (relayed0, behind0), (relayed1, behind1) = counts
    relayed, behind = relayed1 - relayed0, behind1 - behind0
    # A restarted server (counters reset) or another one between the scrapes: no share to read.
    return behind / relayed if relayed > 0 and 0 <= behind <= relayed else None


def codec_figures(before: str | None, after: str | None) -> CodecFigures | None:
    """Figures from two scrapes, or None when either is missing or has no codec counters."""
    if before is None or after is None:
        return None
    v_before, v_after = prometheus.parse(before), prometheus.parse(after)
    if not _has_codec_counters(v_after):
        return None
    c_before, c_after = prometheus.codec_cells(v_before), prometheus.codec_cells(v_after)
    cells = {key: c_after[key].minus(c_before[key]) for key in c_after}
    return figures_of(codec_name(after), cells, mm_store_counts(v_before, v_after))


def figures_of(
    codec: str | None, cells: dict[tuple[str, str], prometheus.CodecCell], mm_store: dict[str, float] | None = None
) -> CodecFigures:
    """The figures of a run's counters, one cell per direction × operation (from /metrics, or from the
    timings a real vLLM's plugin wrote)."""

    def direction(name: str) -> DirectionFigures:
        enc, dec = cells[(name, "encode")], cells[(name, "decode")]
        return DirectionFigures(
            messages=enc.messages,
            encode_us=enc.us_per_message,
            decode_us=dec.us_per_message,
            bytes_per_message=enc.bytes_per_message,
            frames_per_message=enc.frames_per_message,
            encode_cpu_us=enc.cpu_us_per_message,
            decode_cpu_us=dec.cpu_us_per_message,
        )

    return CodecFigures(codec, direction("request"), direction("output"), cells, mm_store)


def mm_store_counts(before: dict, after: dict) -> dict[str, float] | None:
    """The store's events between two parsed scrapes; None when the server has no store."""
    events = {dict(labels).get("event"): v for (name, labels), v in after.items() if name == prometheus.MM_STORE}
    if not events:
        return None
    start = {dict(labels).get("event"): v for (name, labels), v in before.items() if name == prometheus.MM_STORE}
    return {str(k): v - start.get(k, 0.0) for k, v in events.items()}
