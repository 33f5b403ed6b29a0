"""What the frontend needs from the engine side: the EngineClient interface.

The real implementation (``harness.engine_client.ZmqEngineClient``) talks to
the engine process over ZeroMQ through the selected codec; tests of the
frontend alone may use an in-process fake with the same surface.
"""

from __future__ import annotations

from typing import AsyncIterator, Protocol

from .messages import CodecStats, EngineCoreOutput, EngineCoreRequest


class EngineDeadError(RuntimeError):
    """The engine process died or stopped answering; in-flight requests fail with this."""


class RequestRejectedError(ValueError):
    """The request could not be sent or was refused (codec cannot carry it, engine validation)."""


class EngineRequestError(RuntimeError):
    """The engine failed while serving the request (a server-side error, not the client's)."""


class EngineClient(Protocol):
    codec_name: str

    def generate(self, request: EngineCoreRequest) -> AsyncIterator[EngineCoreOutput]:
        """Send the request; yield its outputs as they arrive, the last with finished=True.

        Raises RequestRejectedError (nothing was queued, or the engine sent back an
        error output) or EngineDeadError. Closing the iterator early (client
        disconnect) aborts the request in the engine.
        """
        ...

    async def abort(self, request_ids: list[str]) -> None: ...

    @property
    def is_healthy(self) -> bool: ...

    @property
    def dead_reason(self) -> str | None: ...

    # Cumulative codec counters: this process's (request encode, output decode)
    # and the engine's latest report (request decode, output encode).
    def frontend_codec_stats(self) -> CodecStats: ...

    def engine_codec_stats(self) -> CodecStats: ...
