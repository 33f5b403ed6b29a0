"""One step of overlap: the host schedules step N+1 while the device runs step N.

The scheduler knows a running request's next input only once step N's token is back. So when
step N is launched, each request it samples gets a placeholder token in its outputs
(``PLACEHOLDER``): step N+1 is scheduled against it as if the token were known, its decode row
feeding "the token step N samples", which only the device has (vLLM's async scheduling does the
same). When N's outputs come back, each placeholder is taken out again and the scheduler's own
update appends the real token and checks the stop conditions, so the token stream is the one the
loop in series gives.

A request that finishes in N (a stop token, EOS) has already been given a row in N+1; that row's
token finds no request when N+1 is updated and is dropped, never sent. A request whose token in N is
its ``max_tokens``-th gets no placeholder: it cannot go on, so N+1 gives it no row. A request
aborted while a step that holds it runs, and a new one that takes its id, are told apart by the
scheduler's request object, so a late token never lands in the wrong request.

This reads and edits the scheduler's request records (``Scheduler.requests``, a request's
``outputs``), and only between its calls, on the engine's one loop thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from harness.engine.device_thread import StepHandle
from harness.engine.scheduler import Scheduler
from harness.engine.step import ModelRunnerOutput, SchedulerOutput
from harness.wire.messages import EngineCoreOutput

# Stands for a token the device has sampled and the host has not read yet; never a real id.
PLACEHOLDER = -1

Launch = Callable[[SchedulerOutput, bool], StepHandle[ModelRunnerOutput]]


@dataclass
class InFlight:
    """A launched step the host has not updated from yet."""

    sched: SchedulerOutput
    handle: StepHandle[ModelRunnerOutput]
    # The scheduler's record of each request in the step, as it was at launch.
    owners: dict[str, Any]
    # Records that carry this step's placeholder at the end of their outputs.
    placeholders: list[Any] = field(default_factory=list)


def launch(scheduler: Scheduler, sched: SchedulerOutput, run: Launch, continuous: bool) -> InFlight:
    owners = {c.request_id: scheduler.requests.get(c.request_id) for c in sched.chunks}
    return InFlight(sched, run(sched, continuous), owners)


def add_placeholders(scheduler: Scheduler, step: InFlight) -> None:
    """Give each request the step samples for a placeholder token, so the next step feeds it."""
    for c in step.sched.chunks:
        if not c.sample:
            continue
        r = scheduler.requests.get(c.request_id)
        if r is None or r is not step.owners.get(c.request_id):  # finished or aborted meanwhile
            continue
        assert r is not None
        if r.num_output_tokens + 1 >= r.max_tokens:
            continue  # this step's token is its last: nothing to feed
        r.outputs.append(PLACEHOLDER)
        step.placeholders.append(r)


def finish(scheduler: Scheduler, step: InFlight) -> list[EngineCoreOutput]:
    """Wait for the step, take its placeholders out, and update the scheduler from its real tokens."""
    result = step.handle.wait()
    for r in step.placeholders:
        if r.outputs and r.outputs[-1] == PLACEHOLDER:
            r.outputs.pop()
    sched = step.sched
    stale = {rid for rid, r in step.owners.items() if scheduler.requests.get(rid) is not r}
    if stale:  # aborted while the step ran (and its id perhaps taken by a new request): drop their results
        sched = replace(
            sched,
            decodes=[c for c in sched.decodes if c.request_id not in stale],
            prefills=[c for c in sched.prefills if c.request_id not in stale],
        )
        result = replace(result, errors={k: v for k, v in result.errors.items() if k not in stale})
    return scheduler.update_from_output(sched, result)
