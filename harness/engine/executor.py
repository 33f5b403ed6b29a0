"""Executors: run one scheduled step and return the sampled tokens.

``TorchExecutor`` runs the model of ``harness.engine.model`` (plus the vision encoder
and sampler): each step is one forward over its decode rows and every prefill
chunk, fed by one non-blocking host-to-device copy and read back by one
device-to-host copy of the sampled ids. ``SimExecutor`` runs no model and only
spends the time a step is modelled to take. Both take a ``SchedulerOutput`` and return a
``ModelRunnerOutput``, so the engine loop does not know which it has.

Per-request state (sampling params, seeded generator, image embeddings and,
only for requests with penalties, their token history) is created the first
time a request appears in ``new_requests`` and dropped when its id shows up
in ``finished_req_ids``; so is its row of the persistent batch
(``harness.engine.input_batch``), whose columns feed the sampler. A request
whose inputs can't be processed (say, an image that fails to decode) is
reported in ``ModelRunnerOutput.errors`` instead of failing the step for everyone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from harness.engine.config import EngineConfig, limits_info
from harness.engine.cuda_graphs import GraphStep, decode_graphs, scratch_blocks
from harness.engine.device import (
    MemoryPlan,
    check_fits,
    count_params,
    device_warning,
    kv_bytes_per_token,
    resolve_device,
    resolve_dtype,
    synchronize,
    workspace_bytes,
)
from harness.engine.device_thread import DeviceStats, DeviceThread, Pending, StepHandle
from harness.engine.input_batch import InputBatch, SampledIds
from harness.engine.logprobs import top_logprobs
from harness.engine.model import StepBatch, build_model, get_model_config
from harness.engine.overlap import PLACEHOLDER
from harness.engine.read_back import ReadBack, StepMarks
from harness.engine.sampler import SampleColumns, Sampler, SampleRow, uses_penalties
from harness.engine.staging import Stager, StepBuffers, step_token_ids
from harness.engine.step import ModelRunnerOutput, NewRequest, ScheduledChunk, SchedulerOutput
from harness.engine.step_plan import Chunk, StepPlan, blocks_for
from harness.engine.vision import build_vision_encoder, splice_images
from harness.wire.messages import Logprobs, SamplingParams

log = logging.getLogger("wirebench.engine")


class Executor(Protocol):
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput: ...

    def info(self) -> dict[str, Any]:
        """What ran the steps, for result metadata."""
        ...


def error_text(exc: BaseException) -> str:
    return f"could not process the request's inputs: {type(exc).__name__}: {exc}"


@dataclass
class _TorchState:
    params: SamplingParams
    generator: torch.Generator | None
    # (placeholder offset, embeddings [image_tokens, dim]) per image
    images: list[tuple[int, Tensor]] = field(default_factory=list)
    # Token history for the sampler's penalties; None (no tracking) when all are default.
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    # logit_bias as (token ids, biases) within the vocabulary: made once at admission, not every step.
    bias: tuple[list[int], list[float]] | None = None


@dataclass
class _Prepared:
    """A step as the host prepared it: all its device part reads, fixed at launch."""

    t0: float  # perf_counter when the host began it
    holes_possible: bool  # launched with one step of overlap: the next step may feed on its ids
    continuous: bool = False  # launched while the engine had work since the step before ended
    errors: dict[str, str] = field(default_factory=dict)
    # None below: nothing to run (every request failed or the step had none); ids without a batch:
    # a captured graph replays the step.
    batch: StepBatch | None = None
    ids: Tensor | None = None  # [N] input token ids (PLACEHOLDER where ``holes`` fills them)
    row_idx: Tensor | None = None  # the rows whose logits are sampled; None: every row
    rows_on_device: Tensor | None = None  # ``batch_rows`` staged
    holes: tuple[Tensor, Tensor] | None = None  # input rows fed on the device, and whose ids they take
    # (first row, rows, start position, images) of each prefill chunk that carries images
    splices: list[tuple[int, int, int, list[tuple[int, Tensor]]]] = field(default_factory=list)
    rids: list[str] = field(default_factory=list)  # the requests sampled, in logits row order
    batch_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cols: SampleColumns | None = None
    histories: list[tuple[int, _TorchState, ScheduledChunk]] = field(default_factory=list)  # penalized rows
    logprob_ks: list[tuple[int, int]] = field(default_factory=list)  # (logits row, top-k) asking logprobs
    graph: GraphStep | None = None  # a decode step a captured CUDA graph replays (harness.engine.cuda_graphs)


class TorchExecutor:
    """The model, vision encoder and sampler on one device; one ``forward_step`` per engine step.

    A step's decode rows and every prefill chunk (of any number of requests)
    run as one batch; all of the step's integer inputs reach the device in one
    non-blocking copy into preallocated buffers (``harness.engine.staging.StepBuffers``),
    images as their raw bytes;
    the sampled ids come back in one copy, the step's only host sync.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.device_warning = device_warning(config.device, self.device)
        if self.device_warning:
            log.warning("%s", self.device_warning)
        if self.device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model_config = get_model_config(config.model_preset, config.vocab_size)
        mc = self.model_config
        cache_tokens = config.kv_capacity  # the paged cache: num_kv_blocks x kv_block_size
        self.memory = check_fits(
            MemoryPlan(
                weights=count_params(mc) * self.dtype.itemsize,
                kv_cache=cache_tokens * kv_bytes_per_token(mc, self.dtype),
                workspace=workspace_bytes(
                    mc, self.dtype, config.max_num_batched_tokens, config.max_num_seqs, config.max_model_len
                ),
                kv_tokens=cache_tokens,
            ),
            self.device,
        )
        self.model = build_model(
            mc,
            config.max_num_seqs,
            config.max_model_len,
            self.device,
            self.dtype,
            config.seed,
            num_blocks=config.num_kv_blocks + scratch_blocks(config),  # + a block for graphs' padding rows
            block_size=config.kv_block_size,
        )
        self.vision = build_vision_encoder(
            mc.vision_dim, mc.dim, config.image_tokens, self.device, self.dtype, config.seed + 1
        )
        self.stager = Stager(self.device)
        # A step's int inputs (token ids, positions, cache slots, tables) cross in these, reused: two,
        # taken in turn, so a step is staged while the one before it runs.
        self.step_buffers = (StepBuffers(self.device), StepBuffers(self.device))
        self._buffer_turn = 0
        self.sampler = Sampler(config.vocab_size, config.seed, self.device, self.stager)
        self.states: dict[str, _TorchState] = {}
        self.logprob_ids: set[str] = set()  # running requests that asked for logprobs: most steps have none
        # Requests with a logit bias or penalties: the sampler needs more of them than columns hold.
        self.special_ids: set[str] = set()
        # A row per live request: its sampling columns and block table.
        self.batch = InputBatch(config.max_num_seqs, blocks_for(config.max_model_len, config.kv_block_size))
        self.last_sampled = SampledIds(self.device, config.max_num_seqs)
        # Launched steps' ids come back on a side stream on CUDA; the newest such step's, noted.
        self.read_back = ReadBack(self.device)
        self._last_ids: Pending[np.ndarray] | None = None
        # Runs launched steps' device parts in order (one step of overlap); a step run by execute() runs inline.
        self.device_thread = DeviceThread()
        # On the CPU the forward needs the cores the host would overlap it with (measured slower,
        # docs/results.md): in series there unless told otherwise. In series, steps run inline.
        self.overlap_pays = self.device.type != "cpu" or config.overlap_on_cpu
        self.launches_in_series = False
        # The last device part raised: a step fed by its ids (``holes``) must not run on ids never
        # written (-1 into the embedding: an index error, a sticky device assert on CUDA).
        self._device_failed = False
        self.sdpa = self.model.sdpa_backends()
        self.compile_s: float | None = None
        if config.compile:
            started = time.perf_counter()
            self.model.enable_compile()
            self._warm_up()
            self.compile_s = time.perf_counter() - started
        # Decode-only steps as CUDA graphs (harness.engine.cuda_graphs), captured now; None when off.
        self.graphs = decode_graphs(config, self.model, self.sampler)
        synchronize(self.device)

    def _warm_up(self) -> None:
        """Compile now rather than in the first requests' TTFT: 1 row, then 2 and 3 (dynamic rows)."""
        with torch.inference_mode():
            for n in (1, 2, 3):
                # Block 0 is rewritten before any request reads it.
                plan = StepPlan(chunks=[Chunk([0], 0, n)])
                batch, (ids,) = self.model.stage(plan, [0] * n)
                self.model.forward_step(self.model.embed(ids), batch)
        synchronize(self.device)

    def info(self) -> dict[str, Any]:
        cfg = self.config
        info: dict[str, Any] = {
            "executor": "torch",
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "dtype": str(self.dtype).removeprefix("torch."),
            "model_preset": cfg.model_preset,
            "model": asdict(self.model_config),
            "num_params": sum(p.numel() for p in self.model.parameters()),
            **limits_info(cfg),
            "kv_cache_bytes": self.model.kv_cache_bytes,
            "memory": self.memory.as_gib(),
            "sdpa": self.sdpa,
            "compile": cfg.compile,
            "cuda_graphs": self.graphs.info() if self.graphs is not None else {"enabled": False},
            "torch_threads": torch.get_num_threads(),
            # Overlapped steps' time: the GPU's own (CUDA events), or the device thread's as the host sees it.
            "device_time": "cuda-events" if self.read_back.timed else "device-thread",
            "torch_version": torch.__version__,
        }
        if self.compile_s is not None:
            info["compile_s"] = round(self.compile_s, 1)
        if self.device_warning:
            info["device_warning"] = self.device_warning
        # The SDPA calls are the torch reference's: a varlen kernel makes none.
        reference = self.sdpa.get("attention", "torch-reference") == "torch-reference"
        if self.device.type == "cuda" and reference and "math" in self.sdpa.values():
            slow = ", ".join(k for k, v in self.sdpa.items() if v == "math")
            info["sdpa_warning"] = f"SDPA runs its math fallback for {slow}: attention scores are materialized"
        return info

    def step_counts(self) -> dict[str, int]:
        """Counters for the heartbeat, read on the output thread (a dict copy is one step under the GIL)."""
        if self.graphs is None:
            return {}
        replays, eager = dict(self.graphs.replays), dict(self.graphs.eager)
        return {"cuda_graph_replays": sum(replays.values()), "cuda_graph_eager_steps": sum(eager.values())}

    def _new_state(self, nr: NewRequest) -> _TorchState:
        params = nr.request.sampling_params
        st = _TorchState(params, self.sampler.request_generator(params), bias=self.sampler.bias_lists(params))
        if uses_penalties(params):
            st.prompt_ids, st.output_ids = nr.request.prompt_token_ids, []
        for item, pr in zip(nr.request.mm_inputs or [], nr.request.mm_placeholders or [], strict=True):
            # Computed once per request; raw pixels cross to the device and are converted there.
            st.images.append((pr.offset, self.vision.encode(item, self.stager.tensor)))
        return st

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Run the step here and return its outputs: the engine loop in series."""
        out = self._compute(self._prepare(sched, launched=False))
        return out.wait() if isinstance(out, Pending) else out

    def launch(self, sched: SchedulerOutput, continuous: bool = False) -> StepHandle[ModelRunnerOutput]:
        """Prepare the step on the host, hand its forward and sampling to the device thread and
        return at once (one step of overlap, ``harness.engine.overlap``).

        A decode row whose input is the token the step in flight samples (``PLACEHOLDER``) is fed
        on the device: that step leaves its ids in a device column by persistent-batch row, and
        this one gathers from it before its forward, so no sampled id waits for the host.
        """
        launched_ns = time.monotonic_ns()
        step = self._prepare(sched, launched=True)
        step.continuous = continuous
        return self.device_thread.launch(None, lambda: self._compute(step), continuous, launched_ns)

    def device_stats(self) -> DeviceStats:
        """Busy time and the gaps the host left between steps (overlapped): the GPU's own, from
        events on its stream, on CUDA; elsewhere the device thread's."""
        return self.read_back.gpu if self.read_back.timed else self.device_thread.stats

    def _prepare(self, sched: SchedulerOutput, launched: bool) -> _Prepared:
        """The host's part of a step: per-request state, the plan, its inputs staged on the device
        and everything the device part reads, fixed now (the next step's host part may run while
        this step's device part does). ``launched``: one step of overlap, so some inputs may be
        tokens still on the device; a step run in series has none to look for."""
        t0 = time.perf_counter()
        step = _Prepared(t0, launched)
        with torch.inference_mode():
            for rid in sched.finished_req_ids:
                self.states.pop(rid, None)
                self.logprob_ids.discard(rid)
                self.special_ids.discard(rid)
                self.batch.remove(rid)
            for nr in sched.new_requests:
                try:
                    st = self.states[nr.request_id] = self._new_state(nr)
                    self.batch.add(nr.request_id, st.params, st.generator)
                    if st.params.logprobs is not None:
                        self.logprob_ids.add(nr.request_id)
                    if st.params.logit_bias or st.output_ids is not None:
                        self.special_ids.add(nr.request_id)
                except Exception as exc:  # bad payload: fail this request, not the step
                    step.errors[nr.request_id] = error_text(exc)
            decodes = [c for c in sched.decodes if c.request_id in self.states]
            prefills = [c for c in sched.prefills if c.request_id in self.states]
            if decodes or prefills:
                self._stage_step(step, decodes, prefills)
        return step

    def _stage_step(self, step: _Prepared, decodes: list[ScheduledChunk], prefills: list[ScheduledChunk]) -> None:
        """The sampled rows' inputs; then, unless a captured graph replays the step (its inputs only
        the token ids), decode rows then prefill chunks as one plan, staged."""
        sample_chunks = decodes + [c for c in prefills if c.sample]
        step.rids = [c.request_id for c in sample_chunks]
        step.batch_rows = batch_rows = self.batch.rows(step.rids)
        # Prompt chunks that arrived packed (int32 views) are cast as arrays, never one Python int per token.
        token_ids = step_token_ids([c.token_ids[0] for c in decodes], [c.token_ids for c in prefills])
        holes = self._holes(token_ids, decodes, prefills, batch_rows) if step.holes_possible else None
        with_holes = list(holes) if holes is not None else []  # staged in the step's one copy
        if sample_chunks:
            self._sampling_inputs(step, sample_chunks)
        if self.graphs is not None:  # a decode-only step of plain requests: a captured graph replays it
            wanted = self.logprob_ids
            exclude = self.special_ids | wanted if self.special_ids or wanted else set()
            step.graph = self.graphs.prepare(self.batch, batch_rows, decodes, prefills, step.cols, exclude)
        if step.graph is not None:
            step.ids, step.rows_on_device, *staged_holes = self.stager.ints(token_ids, batch_rows, *with_holes)
            step.holes = (staged_holes[0], staged_holes[1]) if staged_holes else None
            return
        decode_blocks: list[Sequence[int]] = [c.block_ids for c in decodes]
        positions = [c.start_pos for c in decodes]
        plan = StepPlan(decode_blocks, positions, [Chunk(c.block_ids, c.start_pos, len(c.token_ids)) for c in prefills])
        if decodes:  # their tables from the persistent batch: only blocks new since the last step are copied
            width = blocks_for(max(positions) + 1, self.config.kv_block_size)
            plan.decode_table, plan.decode_table_lens = self.batch.tables(
                batch_rows[: len(decodes)], decode_blocks, width, self.config.num_kv_blocks
            )
        last = plan.last_rows()
        rows = list(range(len(decodes))) + [r for r, c in zip(last, prefills, strict=True) if c.sample]
        every_row = len(rows) == plan.n_rows  # a pure decode step: no row selection
        # Two sets of step buffers, taken in turn: this step's inputs are staged while the step
        # before it may still read its own.
        self._buffer_turn ^= 1
        buffers = self.step_buffers[self._buffer_turn]
        step.batch, (step.ids, row_idx, step.rows_on_device, *staged_holes) = self.model.stage(
            plan, token_ids, [] if every_row else rows, batch_rows, *with_holes, buffers=buffers
        )
        step.holes = (staged_holes[0], staged_holes[1]) if staged_holes else None
        step.row_idx = None if every_row else row_idx
        at = plan.n_decode
        for c in prefills:
            images = self.states[c.request_id].images
            if images:
                step.splices.append((at, len(c.token_ids), c.start_pos, images))
            at += len(c.token_ids)

    def _sampling_inputs(self, step: _Prepared, sample_chunks: list[ScheduledChunk]) -> None:
        """The sampler's columns of the step's sampled rows, and what its few special rows need."""
        suppress = [(i, c.suppress_token_ids) for i, c in enumerate(sample_chunks) if c.suppress_token_ids]
        step.cols = cols = self.batch.columns(step.batch_rows, suppress)
        if self.special_ids:  # the few rows that need their state: bias lists, token history
            for i, c in enumerate(sample_chunks):
                if c.request_id in self.special_ids:
                    st = self.states[c.request_id]
                    if st.params.logit_bias:
                        cols.biased[i] = SampleRow(st.params, st.generator, c.suppress_token_ids, bias=st.bias)
                    if st.output_ids is not None:
                        step.histories.append((i, st, c))
        wanted = self.logprob_ids
        if wanted:
            step.logprob_ks = [
                (i, self.states[c.request_id].params.logprobs or 0)
                for i, c in enumerate(sample_chunks)
                if c.request_id in wanted
            ]

    def _holes(
        self,
        token_ids: Sequence[int] | np.ndarray,
        decodes: list[ScheduledChunk],
        prefills: list[ScheduledChunk],
        batch_rows: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The step's input rows that feed a token still on the device (``PLACEHOLDER``), and the
        persistent-batch rows whose last sampled id they take; None when there are none."""
        flat = np.asarray(token_ids)
        holes = np.flatnonzero(flat == PLACEHOLDER)
        if not holes.size:
            return None
        n = len(decodes)
        rows = np.empty(holes.size, dtype=np.int64)
        in_decodes = holes < n
        rows[in_decodes] = batch_rows[holes[in_decodes]]
        if not in_decodes.all():  # a recompute chunk that ends on the token in flight (rare)
            ends = np.cumsum([len(c.token_ids) for c in prefills]) + n
            owners = [prefills[k].request_id for k in np.searchsorted(ends, holes[~in_decodes], side="right")]
            rows[~in_decodes] = self.batch.rows(owners)
        return holes, rows

    def _compute(self, step: _Prepared) -> ModelRunnerOutput | Pending[ModelRunnerOutput]:
        """The device's part of a step: fill the inputs still on the device, forward, sample, and
        read the sampled ids back (the step's one sync). Runs in order, one step at a time. On CUDA
        a launched step returns once its kernels and the copy of its ids are queued: its outputs
        are pending (``harness.engine.read_back``), and the next step can be launched behind it."""
        ids: Pending[np.ndarray] | None = None
        logprobs: dict[str, Logprobs] = {}
        if self._device_failed and step.holes is not None:
            raise RuntimeError("the step before this one failed, so the tokens it feeds were never sampled")
        try:
            with torch.inference_mode():
                marks = self.read_back.begin(step.continuous) if step.holes_possible else None
                if step.ids is not None:  # eager (a staged batch) or a graph's replay
                    ids, logprobs = self._forward_and_sample(step, marks)
                if ids is None:  # nothing fetched: wait here, so the step's time covers its kernels
                    self.read_back.end(marks)
                    synchronize(self.device)
                    if marks is not None:
                        self.read_back.time(marks)
        except BaseException:
            self._device_failed = True
            raise
        self._device_failed = False
        if ids is None:
            return ModelRunnerOutput({}, step.errors, time.perf_counter() - step.t0, logprobs=logprobs)
        done = ids
        if self.read_back.deferred and step.holes_possible:
            return Pending(lambda: self._outputs(step, done, logprobs))
        return self._outputs(step, done, logprobs)

    def _outputs(self, step: _Prepared, ids: Pending[np.ndarray], logprobs: dict[str, Logprobs]) -> ModelRunnerOutput:
        try:
            picked = ids.wait()
        except BaseException:  # the device's error, seen when its ids are read
            self._device_failed = True
            raise
        sampled = dict(zip(step.rids, picked.tolist(), strict=True))
        return ModelRunnerOutput(sampled, step.errors, time.perf_counter() - step.t0, logprobs=logprobs)

    def _forward_and_sample(
        self, step: _Prepared, marks: StepMarks | None
    ) -> tuple[Pending[np.ndarray] | None, dict[str, Logprobs]]:
        assert step.ids is not None
        ids, last = step.ids, self.last_sampled
        if step.holes is not None:
            holes, rows = step.holes
            ids.index_copy_(0, holes, last.device_ids.index_select(0, rows))
        if step.graph is not None and self.graphs is not None:  # the graph's forward and sampler
            assert step.rows_on_device is not None
            return self._read_back(step, self.graphs.replay(step.graph, ids), marks), {}
        assert step.batch is not None
        x = self.model.embed(ids)  # [N, dim]
        for at, n, start, images in step.splices:
            splice_images(x[at : at + n], start, images)
        logits = self.model.forward_step(x, step.batch, step.row_idx)
        if step.cols is None:
            return None, {}
        cols = step.cols
        if step.histories and step.holes is not None and self._last_ids is not None:
            self._last_ids.wait()  # a history may end with the step before's token, read from the host
        for i, st, c in step.histories:
            cols.penalized[i] = self._history_row(st, c, int(step.batch_rows[i]))
        tokens = self.sampler.sample_columns(logits, cols)
        logprobs: dict[str, Logprobs] = {}
        if step.logprob_ks:
            asked = [i for i, _ in step.logprob_ks]
            at_rows = torch.tensor(asked, device=logits.device)
            found = top_logprobs(
                logits[at_rows], tokens[at_rows], [k for _, k in step.logprob_ks], self.config.vocab_size
            )
            logprobs = {step.rids[i]: lp for i, lp in zip(asked, found, strict=True)}
        return self._read_back(step, tokens, marks), logprobs

    def _read_back(self, step: _Prepared, tokens: Tensor, marks: StepMarks | None) -> Pending[np.ndarray]:
        """The sampled ids on their way to the host (the step's one sync); a launched step also
        keeps them by row, on the device, for the step after it to feed, and notes them on the host
        for its penalty histories."""
        if not step.holes_possible:
            picked = self.stager.fetch_array(tokens)
            return Pending(lambda: picked)
        assert step.rows_on_device is not None
        rows, last = step.batch_rows, self.last_sampled
        last.keep(rows, step.rows_on_device, tokens)
        copied = self.read_back.ids(tokens, marks, self.stager.fetch_array)
        self._last_ids = Pending(lambda: last.note(rows, copied.wait()))
        return self._last_ids

    def _history_row(self, st: _TorchState, c: ScheduledChunk, batch_row: int) -> SampleRow:
        """A penalized row with its token history: the output tokens fed up to this step."""
        assert st.output_ids is not None and st.prompt_ids is not None
        # A decode feeds the newest output (maybe the token the step before sampled, read from its
        # record); a preempted request's recompute chunk may end with outputs it has not seen.
        fed = max(0, c.start_pos + len(c.token_ids) - len(st.prompt_ids))
        missing = fed - len(st.output_ids)
        if missing > 0:
            for t in c.token_ids[len(c.token_ids) - missing :]:
                t = int(t)
                st.output_ids.append(int(self.last_sampled.host_ids[batch_row]) if t == PLACEHOLDER else t)
        elif missing < 0:  # a token sampled for it that the scheduler dropped
            del st.output_ids[fed:]
        return SampleRow(
            st.params,
            st.generator,
            c.suppress_token_ids,
            prompt_token_ids=st.prompt_ids,
            output_token_ids=st.output_ids,
            bias=st.bias,
        )
