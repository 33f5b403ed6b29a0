"""The engine's core step: schedule → execute → update, and errors as outputs.

No sockets and no threads here (``harness.engine.process`` has those), so the
step can be driven directly in tests.
"""

from __future__ import annotations

from harness.engine.config import EngineConfig
from harness.engine.executor import make_executor
from harness.engine.scheduler import Scheduler
from harness.engine.step import SchedulerOutput
from harness.wire.messages import EngineCoreOutput, EngineCoreRequest, FinishReason, SchedulerStats


def error_output(request_id: str, message: str, rejected: bool = True) -> EngineCoreOutput:
    """The last output of a request the engine refused (rejected) or failed to serve."""
    return EngineCoreOutput(
        request_id=request_id,
        new_token_ids=[],
        finished=True,
        finish_reason=FinishReason.REJECTED if rejected else FinishReason.ERROR,
        error=message,
    )


class EngineCore:
    """Scheduler + executor + the step that ties them."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.scheduler = Scheduler(config)
        self.executor = make_executor(config)
        self.step_index = 0
        # What the last step() scheduled (None before the first, or when it scheduled nothing).
        self.last_step: SchedulerOutput | None = None

    def add_request(self, request: EngineCoreRequest) -> EngineCoreOutput | None:
        """Queue a request; an error output if it is invalid."""
        try:
            self.scheduler.add_request(request)
        except ValueError as exc:
            return error_output(request.request_id, str(exc))
        return None

    def abort(self, request_ids: list[str]) -> None:
        self.scheduler.abort_requests(request_ids)

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def scheduler_stats(self) -> SchedulerStats:
        """The scheduler's state after the last step (``--output-stats``)."""
        sched = self.scheduler
        return SchedulerStats(
            num_running_reqs=sched.num_running,
            num_waiting_reqs=sched.num_waiting,
            kv_cache_usage=sched.kv_tokens_used / max(1, sched.kv_capacity),
            num_scheduled_tokens=self.last_step.total_num_tokens if self.last_step is not None else 0,
        )

    def step(self) -> list[EngineCoreOutput]:
        scheduled = self.scheduler.schedule()
        self.last_step = scheduled if scheduled.total_num_tokens else None
        if not scheduled.total_num_tokens:
            return []
        result = self.executor.execute(scheduled)
        self.step_index += 1
        for new in scheduled.new_requests:
            # The executor has encoded its images: drop the payload now, not when the request ends,
            # so its memory (shared memory included, harness.wire.shm) is given back early.
            new.request.mm_inputs = None
        return self.scheduler.update_from_output(scheduled, result)

    def fail_all(self, message: str) -> list[EngineCoreOutput]:
        """After a step raised: end every request with an error, keep serving."""
        ids = list(self.scheduler.requests)
        self.scheduler.abort_requests(ids)
        return [error_output(rid, message, rejected=False) for rid in ids]
