"""The engine's core step: schedule → execute → update, and errors as outputs.

No sockets here (``harness.engine.process`` has those), so the step can be driven directly
in tests. With ``async_scheduling``, one step of overlap: ``step()`` schedules and launches step
N+1 onto the executor's device thread (``sim``'s modelled GPU, or where ``torch`` runs its
forward and sampling), then waits for step N and returns N's outputs (``harness.engine.overlap``).
"""

from __future__ import annotations

import contextlib

from harness.engine import overlap
from harness.engine.config import EngineConfig
from harness.engine.device_thread import DeviceStats
from harness.engine.executor import Executor, TorchExecutor
from harness.engine.scheduler import Scheduler
from harness.engine.sim_executor import SimExecutor
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


def make_executor(config: EngineConfig) -> Executor:
    if config.executor == "torch":
        return TorchExecutor(config)
    if config.executor == "sim":
        return SimExecutor(config)
    raise ValueError(f"unknown executor {config.executor!r}; choose 'torch' or 'sim'")


class EngineCore:
    """Scheduler + executor + the step that ties them."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.scheduler = Scheduler(config)
        self.executor = make_executor(config)
        self.step_index = 0
        # What the last step() scheduled (None before the first, or when it scheduled nothing).
        self.last_step: SchedulerOutput | None = None
        # Executors with a device thread launch a step and return a handle; each says whether the
        # overlap pays on its device, and whether its steps go through the thread even in series.
        launch: overlap.Launch | None = getattr(self.executor, "launch", None)
        self.overlapped = (
            config.async_scheduling and launch is not None and getattr(self.executor, "overlap_pays", False)
        )
        self._launch = launch if self.overlapped or getattr(self.executor, "launches_in_series", False) else None
        self._inflight: overlap.InFlight | None = None
        # The engine had work since the last step ended: the device's gap before the next one is idle time.
        self._continuous = False
        # The device thread's start and end (monotonic ns) of the step whose outputs step() returned last.
        self.device_span: tuple[int, int] | None = None

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
        return self._inflight is not None or self.scheduler.has_unfinished_requests()

    def device_stats(self) -> DeviceStats | None:
        """The device thread's busy and idle time so far; None for an executor without one."""
        stats = getattr(self.executor, "device_stats", None)
        return stats() if stats is not None else None

    def step_counts(self) -> dict[str, int]:
        """The heartbeat's counters: the scheduler's, and the executor's where it keeps any (graphs)."""
        counts = getattr(self.executor, "step_counts", None)
        return {**self.scheduler.step_counts(), **(counts() if counts is not None else {})}

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
        self.device_span = None
        if self.overlapped:
            return self._step_overlapped()
        scheduled = self.scheduler.schedule()
        self.last_step = scheduled if scheduled.total_num_tokens else None
        if not scheduled.total_num_tokens:
            return []
        if self._launch is not None:
            handle = self._launch(scheduled, self._continuous)
            result = handle.wait()
            self.device_span = (handle.start_ns, handle.end_ns)
        else:
            result = self.executor.execute(scheduled)
        self.step_index += 1
        self._drop_images(scheduled)
        outputs = self.scheduler.update_from_output(scheduled, result)
        self._continuous = self.has_work()
        return outputs

    def _step_overlapped(self) -> list[EngineCoreOutput]:
        """Schedule and launch step N+1, then wait for step N and return its outputs."""
        previous = self._inflight
        scheduled = self.scheduler.schedule()  # against step N's placeholders
        self.last_step = scheduled if scheduled.total_num_tokens else None
        self._inflight = None
        if scheduled.total_num_tokens:
            assert self._launch is not None
            try:
                self._inflight = overlap.launch(
                    self.scheduler, scheduled, self._launch, previous is not None or self._continuous
                )
            except BaseException:
                if previous is not None:  # let it end first: the next launch stages into its buffers
                    with contextlib.suppress(BaseException):
                        previous.handle.wait()
                raise
            self.step_index += 1
            self._drop_images(scheduled)
        outputs: list[EngineCoreOutput] = []
        if previous is not None:
            outputs = overlap.finish(self.scheduler, previous)
            self.device_span = (previous.handle.start_ns, previous.handle.end_ns)
        if self._inflight is not None:
            overlap.add_placeholders(self.scheduler, self._inflight)
        self._continuous = self.has_work()
        return outputs

    @staticmethod
    def _drop_images(scheduled: SchedulerOutput) -> None:
        for new in scheduled.new_requests:
            # The executor has encoded its images: drop the payload now, not when the request ends,
            # so its memory (shared memory included, harness.transports.shm) is given back early.
            new.request.mm_inputs = None

    def fail_all(self, message: str) -> list[EngineCoreOutput]:
        """After a step raised: end every request with an error, keep serving."""
        self._inflight = None  # its results, if any come, belong to requests that end here
        ids = list(self.scheduler.requests)
        self.scheduler.abort_requests(ids)
        return [error_output(rid, message, rejected=False) for rid in ids]
