"""An in-process stand-in for the engine client, to test the HTTP layer alone.

Never used outside tests: the product talks to the real engine through
``harness.frontend.engine_client.ZmqEngineClient``. This fake has the same surface
(``harness.frontend.engine_client.EngineClient``) and records what the frontend did to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from harness.frontend.errors import EngineDeadError, RequestRejectedError
from harness.frontend.timeline import Timelines
from harness.wire.messages import CodecStats, EngineCoreOutput, EngineCoreRequest, FinishReason
from harness.wire.spans import FrontPoints


class FakeEngine:
    """Yields ``script`` token ids (cycled) one per output, with a small sleep between.

    - ``refuse_mm(item) -> bool``: requests with such an mm input raise
      RequestRejectedError, as a codec that cannot carry it would.
    - ``die(reason)``: from then on every generator raises EngineDeadError;
      ``die_after=k`` kills it by itself after k outputs in total.
    - ``requests`` (accepted), ``aborted`` (aborts: engine.abort calls and early closes) and ``closed_early``
      (generators closed before their last output) record what happened.
    """

    codec_name = "fake"
    output_codec_name = "fake"
    # No engine process, so no engine half of the request timelines.
    timelines = Timelines(enabled=False)

    def __init__(
        self,
        script: list[int] | None = None,
        delay_s: float = 0.002,
        refuse_mm: Callable[[Any], bool] | None = None,
        die_after: int | None = None,
    ) -> None:
        self.script = list(script or [5, 6, 7, 8])
        self.delay_s = delay_s
        self.refuse_mm = refuse_mm
        self.die_after = die_after
        self.requests: list[EngineCoreRequest] = []
        self.aborted: list[str] = []
        self.closed_early: list[str] = []
        self.finished: list[str] = []
        self._dead_reason: str | None = None
        self._unavailable_callbacks: list[Callable[[str], None]] = []
        self._outputs_sent = 0
        self._front = CodecStats()
        self._engine = CodecStats()

    # --- EngineClient --------------------------------------------------------
    @property
    def is_healthy(self) -> bool:
        return self._dead_reason is None

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    @property
    def state(self) -> str:
        return "ok" if self._dead_reason is None else "dead"

    def frontend_codec_stats(self) -> CodecStats:
        return self._front

    def engine_codec_stats(self) -> CodecStats:
        return self._engine

    def die(self, reason: str = "the fake engine was killed") -> None:
        self._dead_reason = reason
        for callback in self._unavailable_callbacks:
            callback(reason)

    def on_unavailable(self, callback: Callable[[str], None]) -> None:
        self._unavailable_callbacks.append(callback)

    async def abort(self, request_ids: list[str]) -> None:
        self.aborted.extend(request_ids)

    async def generate(
        self, request: EngineCoreRequest, points: FrontPoints | None = None
    ) -> AsyncIterator[EngineCoreOutput]:
        if self._dead_reason is not None:
            raise EngineDeadError(self._dead_reason)
        if self.refuse_mm is not None and any(self.refuse_mm(x) for x in request.mm_inputs or []):
            raise RequestRejectedError(f"codec {self.codec_name!r} cannot carry this multimodal input")
        self.requests.append(request)
        self._count(self._front, "encode", 1000)
        self._count(self._engine, "decode", 1000)
        params = request.sampling_params
        limit = params.max_tokens or 16
        stops = set(params.stop_token_ids)
        finished = False
        try:
            for i in range(limit):
                await asyncio.sleep(self.delay_s)
                if self.die_after is not None and self._outputs_sent >= self.die_after:
                    self.die()
                if self._dead_reason is not None:
                    finished = True  # nothing left in a dead engine to abort
                    raise EngineDeadError(self._dead_reason)
                token = self.script[i % len(self.script)]
                reason: FinishReason | None = None
                stop_reason: int | None = None
                if token in stops or (token == request.eos_token_id and not params.ignore_eos):
                    reason, stop_reason = FinishReason.STOP, (token if token in stops else None)
                elif i == limit - 1:
                    reason = FinishReason.LENGTH
                finished = reason is not None
                self._outputs_sent += 1
                self._count(self._engine, "encode", 50)
                self._count(self._front, "decode", 50)
                yield EngineCoreOutput(
                    request.request_id, [token], finished=finished, finish_reason=reason, stop_reason=stop_reason
                )
                if finished:
                    self.finished.append(request.request_id)
                    return
        finally:
            if not finished:
                # As the real client does: closing the generator early aborts the request.
                self.closed_early.append(request.request_id)
                self.aborted.append(request.request_id)

    @staticmethod
    def _count(stats: CodecStats, op: str, nbytes: int) -> None:
        setattr(stats, f"{op}_count", getattr(stats, f"{op}_count") + 1)
        setattr(stats, f"{op}_ns", getattr(stats, f"{op}_ns") + 1000)
        setattr(stats, f"{op}_bytes", getattr(stats, f"{op}_bytes") + nbytes)
        setattr(stats, f"{op}_frames", getattr(stats, f"{op}_frames") + 1)
