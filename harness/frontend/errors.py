"""What can go wrong with a request between the frontend and the engine, as the frontend's handlers see it."""

from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine process died or stopped answering; in-flight requests fail with this."""


class RequestRejectedError(ValueError):
    """The request could not be sent or was refused (codec cannot carry it, engine validation).

    ``code`` is a machine-readable kind when one is known (a codec error's
    ``code``, e.g. ``unsupported_payload``).
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class EngineRequestError(RuntimeError):
    """The engine failed while serving the request (a server-side error, not the client's)."""


class OverloadedError(RuntimeError):
    """No room for the request now (a full shared-memory arena): the client may retry."""


class RequestTimeoutError(EngineRequestError):
    """No output came back for the request within the request timeout (its outputs went elsewhere,
    or the engine lost it while its heartbeats still arrive)."""
