"""vLLM's engine queues, timed: when the busy loop adds a request to the scheduler, and when a step's
output batches go onto the output queue.

Inside vLLM's EngineCore process a request goes from the input thread (its decode, then vLLM's own
``preprocess_add_request``) through ``input_queue`` to the busy loop, which hands it to the scheduler
(``add_request``). A step's outputs go the other way: ``step`` (``step_with_batch_queue`` with a batch
queue) returns them, ``_process_engine_step`` puts each client's batch on ``output_queue`` at once, and
the output thread takes it off and encodes it. The serializer sees neither queue, so the plugin wraps
those three methods on ``EngineCoreProc`` (the class: every engine process and its data-parallel
subclass has them, and an in-process EngineCore is left alone) and records:

- a request's time as ``add_request`` returns: the point wirebench's engine calls ``added``;
- each batch's time as the step returns it, before vLLM puts it on the queue (so never after the output
  thread's encode start): wirebench's engine ends a request's step at the same point (``first_sampled``).

``harness.loadgen.vllm_spans`` joins them with the decode and encode records into the same queue spans
wirebench's own server has (``harness.wire.spans``). A hooked call adds one wall-clock read and a deque
append per request or batch; the message rides along and is read on the recorder's thread. Nothing a
hook records may break vLLM's loop: a step that returns something else than vLLM 0.32 and 0.33 do
(outputs by client, and whether the model ran) is passed on untimed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from harness.vllm_plugin.records import OUTPUT_QUEUED, REQUEST_ADDED, Recorder

_wall = time.monotonic_ns

# The methods of vLLM's EngineCoreProc the hooks wrap (checked at start: harness.vllm_plugin.layout).
ADD_METHOD = "add_request"
STEP_METHODS = ("step", "step_with_batch_queue")

RecorderOf = Callable[[], Recorder | None]


def hook_engine_queues(engine_class: type, recorder: RecorderOf) -> None:
    """Wrap ``engine_class``'s methods in place (the plugin calls this once a process)."""
    setattr(engine_class, ADD_METHOD, timed_add_request(getattr(engine_class, ADD_METHOD), recorder))
    for name in STEP_METHODS:
        setattr(engine_class, name, timed_step(getattr(engine_class, name), recorder))


def _cached(recorder: RecorderOf) -> RecorderOf:
    """The engine's recorder, looked up at the first message and then kept (it never changes)."""
    found: list[Recorder | None] = []

    def get() -> Recorder | None:
        if not found:
            found.append(recorder())
        return found[0]

    return get


def timed_add_request(add_request: Callable[..., Any], recorder: RecorderOf) -> Callable[..., Any]:
    """``add_request`` that records when the scheduler has the request (a request it refuses, by raising,
    is not recorded)."""
    engine_recorder = _cached(recorder)

    @functools.wraps(add_request)
    def add_request_timed(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = add_request(self, request, *args, **kwargs)
        added = _wall()
        rec = engine_recorder()
        if rec is not None:
            rec.add((REQUEST_ADDED, request, added))
        return result

    return add_request_timed


def timed_step(step: Callable[..., Any], recorder: RecorderOf) -> Callable[..., Any]:
    """A step method that records when it returned each client's output batch."""
    engine_recorder = _cached(recorder)

    @functools.wraps(step)
    def step_timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = step(self, *args, **kwargs)
        outputs = result[0] if type(result) is tuple and result else None
        if outputs and type(outputs) is dict:
            queued = _wall()
            rec = engine_recorder()
            if rec is not None:
                for batch in outputs.values():
                    rec.add((OUTPUT_QUEUED, batch, queued))
        return result

    return step_timed
