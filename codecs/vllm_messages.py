"""Our wire messages as vLLM's own, and back: the adapter around the ``vllm`` codec.

The ``vllm`` codec encodes what a vLLM 0.33 server sends: ``EngineCoreRequest``
with vLLM's ``SamplingParams`` and ``MultiModalFeatureSpec`` items, and
``EngineCoreOutputs`` with ``SchedulerStats`` on every step (vLLM's default,
stats logging on). Building those from our messages, and ours from them, is
the adapter's work, not the codec's: the transport times it apart (the
``convert`` figures) and a vLLM server would not pay it.

Where the two schemas differ, the mapping (written against vLLM 0.33.0):

- request: ``prompt`` is not carried (vLLM sends token ids only; our engine never
  reads the text); ``eos_token_id`` is vLLM's ``SamplingParams._eos_token_id``
  (and joins ``_all_stop_token_ids``, as vLLM's frontend does); ``best_of``,
  gone from vLLM, rides in ``extra_args``; ``lora_request`` is a ``LoRARequest``
  named after it; ``output_kind`` is DELTA, what a streaming vLLM frontend sets.
  vLLM's ``SamplingParams.__post_init__`` normalises on both sides (greedy
  resets top_p/top_k/min_p; duplicate stop ids are dropped): what comes out is
  what a vLLM engine would see.
- multimodal items: each dict of tensors is one ``MultiModalKwargsItem`` of
  ``batched`` fields (modality ``image``) with its hash and placeholder range.
  vLLM 0.33 carries processed tensors only: PIL images and numpy arrays are
  refused (``UnsupportedPayloadError`` names the codecs that carry them).
- outputs: ``finished`` is ``finish_reason is not None`` (vLLM has no flag);
  REJECTED is vLLM's ERROR with a ``RequestError`` of code ``validation_error``
  (what vLLM sends for a request it refuses), ERROR one of code ``engine_error``;
  ``num_cached_tokens`` is ``PrefillStats.num_cached_tokens``; ``step_index`` is
  ``SchedulerStats.step_counter`` (every batch carries vLLM's ``SchedulerStats``: stats
  logging is vLLM's default); with ``--output-stats`` our ``SchedulerStats`` fill its
  running, waiting and KV-usage counts and its ``iteration_details``; logprobs are ``LogprobsLists`` of numpy
  arrays (int32 ids and ranks, float32 logprobs: values our engine computes in
  float32 come back exactly); ``step_start_time`` is not carried (vLLM has
  no such field); ``timestamp`` 0.0 becomes the time of construction, as
  vLLM's ``EngineCoreOutputs.__post_init__`` does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import (
    MultiModalFeatureSpec,
    MultiModalFieldConfig,
    MultiModalFieldElem,
    MultiModalKwargsItem,
)
from vllm.multimodal.inputs import PlaceholderRange as VllmPlaceholderRange
from vllm.outputs import RequestError
from vllm.sampling_params import RequestOutputKind
from vllm.sampling_params import SamplingParams as VllmSamplingParams
from vllm.v1 import engine as vllm_engine
from vllm.v1.metrics.stats import PrefillStats, SchedulerIterationDetails, SchedulerStats
from vllm.v1.outputs import LogprobsLists

from harness.wire.messages import (
    EngineCoreAbort,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    Logprobs,
    PlaceholderRange,
    SamplingParams,
)
from harness.wire.messages import SchedulerStats as OurSchedulerStats

# The vLLM release this mapping was written against (the codec warns once on another).
VLLM_VERSION = "0.33.0"
MODALITY = "image"
VALIDATION_ERROR, ENGINE_ERROR = "validation_error", "engine_error"

_REASON_TO_VLLM = {
    FinishReason.STOP: vllm_engine.FinishReason.STOP,
    FinishReason.LENGTH: vllm_engine.FinishReason.LENGTH,
    FinishReason.ABORT: vllm_engine.FinishReason.ABORT,
    FinishReason.REJECTED: vllm_engine.FinishReason.ERROR,
    FinishReason.ERROR: vllm_engine.FinishReason.ERROR,
}
_REASON_FROM_VLLM = {
    vllm_engine.FinishReason.STOP: FinishReason.STOP,
    vllm_engine.FinishReason.LENGTH: FinishReason.LENGTH,
    vllm_engine.FinishReason.ABORT: FinishReason.ABORT,
    vllm_engine.FinishReason.REPETITION: FinishReason.STOP,
}

# Fields named alike in both SamplingParams (ours are all in vLLM's).
_SAME_SAMPLING_FIELDS = tuple(f for f in SamplingParams.__struct_fields__ if f not in ("best_of",))


class NotCarried(TypeError):
    """A multimodal value vLLM's message cannot hold (a PIL image, a numpy array)."""

    def __init__(self, value: Any) -> None:
        super().__init__(type(value).__name__)
        self.value = value


# --- requests ---------------------------------------------------------------------


def sampling_to_vllm(sp: SamplingParams, eos_token_id: int | None) -> VllmSamplingParams:
    fields = {name: getattr(sp, name) for name in _SAME_SAMPLING_FIELDS}
    fields["stop"] = list(sp.stop)
    fields["stop_token_ids"] = list(sp.stop_token_ids)
    if sp.best_of is not None:
        fields["extra_args"] = {"best_of": sp.best_of}
    vsp = VllmSamplingParams(output_kind=RequestOutputKind.DELTA, **fields)
    # What vLLM's frontend fills in from the tokenizer before it sends the request.
    vsp._eos_token_id = eos_token_id
    vsp._all_stop_token_ids = set(vsp.stop_token_ids or ())
    if eos_token_id is not None and not sp.ignore_eos:
        vsp._all_stop_token_ids.add(eos_token_id)
    return vsp


def sampling_from_vllm(vsp: VllmSamplingParams) -> SamplingParams:
    fields = {name: getattr(vsp, name) for name in _SAME_SAMPLING_FIELDS}
    fields["stop"] = list(vsp.stop or ())
    fields["stop_token_ids"] = list(vsp.stop_token_ids or ())
    fields["best_of"] = (vsp.extra_args or {}).get("best_of")
    return SamplingParams(**fields)


def mm_item_to_vllm(item: Any) -> MultiModalKwargsItem:
    if not isinstance(item, dict):
        raise NotCarried(item)
    for value in item.values():
        if not isinstance(value, torch.Tensor):
            raise NotCarried(value)
    batched = MultiModalFieldConfig.batched(MODALITY).field
    return MultiModalKwargsItem({key: MultiModalFieldElem(data=t, field=batched) for key, t in item.items()})


def mm_item_from_vllm(item: MultiModalKwargsItem | None) -> dict[str, Any]:
    return {key: elem.data for key, elem in (item or {}).items()}


def lora_to_vllm(name: str) -> LoRARequest:
    # vLLM requires an id >= 1 and a path; ours is a name only.
    return LoRARequest(lora_name=name, lora_int_id=1, lora_path=f"/adapters/{name}")


def request_to_vllm(req: EngineCoreRequest) -> vllm_engine.EngineCoreRequest:
    features = None
    if req.mm_inputs is not None:
        hashes: list[str | None] = [*req.mm_hashes] if req.mm_hashes else [None] * len(req.mm_inputs)
        places = req.mm_placeholders or [PlaceholderRange(0, 0)] * len(req.mm_inputs)
        features = [
            MultiModalFeatureSpec(
                data=mm_item_to_vllm(item),
                modality=MODALITY,
                identifier=h or f"{req.request_id}-{i}",
                mm_position=VllmPlaceholderRange(offset=p.offset, length=p.length),
                mm_hash=h,
            )
            for i, (item, h, p) in enumerate(zip(req.mm_inputs, hashes, places, strict=True))
        ]
    ids = req.prompt_token_ids
    return vllm_engine.EngineCoreRequest(
        request_id=req.request_id,
        prompt_token_ids=ids if isinstance(ids, list) else [int(t) for t in ids],
        mm_features=features,
        sampling_params=sampling_to_vllm(req.sampling_params, req.eos_token_id),
        pooling_params=None,
        arrival_time=req.arrival_time,
        lora_request=None if req.lora_request is None else lora_to_vllm(req.lora_request),
        cache_salt=req.cache_salt,
        data_parallel_rank=None,
        priority=req.priority,
    )


def request_from_vllm(v: vllm_engine.EngineCoreRequest) -> EngineCoreRequest:
    vsp = v.sampling_params
    assert vsp is not None  # a generate request always has them
    features = v.mm_features
    return EngineCoreRequest(
        request_id=v.request_id,
        prompt=None,
        prompt_token_ids=v.prompt_token_ids or [],
        sampling_params=sampling_from_vllm(vsp),
        eos_token_id=vsp._eos_token_id,
        arrival_time=v.arrival_time,
        mm_inputs=None if features is None else [mm_item_from_vllm(f.data) for f in features],
        mm_hashes=_hashes(features),
        mm_placeholders=(
            None
            if features is None
            else [PlaceholderRange(f.mm_position.offset, f.mm_position.length) for f in features]
        ),
        lora_request=None if v.lora_request is None else v.lora_request.lora_name,
        cache_salt=v.cache_salt,
        priority=v.priority,
    )


def _hashes(features: list[MultiModalFeatureSpec] | None) -> list[str] | None:
    if features is None or all(f.mm_hash is None for f in features):
        return None
    return [f.mm_hash or "" for f in features]


# --- outputs --------------------------------------------------------------------------


def logprobs_to_vllm(lp: Logprobs) -> LogprobsLists:
    # vLLM's sampler hands these over as numpy arrays (int32 ids and ranks, float32 logprobs).
    return LogprobsLists(
        np.asarray(lp.token_ids, dtype=np.int32),
        np.asarray(lp.logprobs, dtype=np.float32),
        np.asarray(lp.ranks, dtype=np.int32),
    )


def logprobs_from_vllm(v: LogprobsLists) -> Logprobs:
    return Logprobs(
        token_ids=np.asarray(v.logprob_token_ids).tolist(),
        logprobs=np.asarray(v.logprobs, dtype=np.float64).tolist(),
        ranks=np.asarray(v.sampled_token_ranks).tolist(),
    )


def output_to_vllm(o: EngineCoreOutput) -> vllm_engine.EngineCoreOutput:
    reason = o.finish_reason
    error = None
    if reason in (FinishReason.REJECTED, FinishReason.ERROR):
        code = VALIDATION_ERROR if reason is FinishReason.REJECTED else ENGINE_ERROR
        error = RequestError(code=code, message=o.error or "")
    return vllm_engine.EngineCoreOutput(
        request_id=o.request_id,
        new_token_ids=o.new_token_ids,
        finish_reason=None if reason is None else _REASON_TO_VLLM[reason],
        stop_reason=o.stop_reason,
        prefill_stats=PrefillStats(num_cached_tokens=o.num_cached_tokens) if o.num_cached_tokens else None,
        error=error,
        new_logprobs=None if o.new_logprobs is None else logprobs_to_vllm(o.new_logprobs),
    )


def output_from_vllm(v: vllm_engine.EngineCoreOutput) -> EngineCoreOutput:
    reason = None
    if v.finish_reason is not None:
        if v.finish_reason == vllm_engine.FinishReason.ERROR:
            code = v.error.code if v.error is not None else ENGINE_ERROR
            reason = FinishReason.REJECTED if code == VALIDATION_ERROR else FinishReason.ERROR
        else:
            reason = _REASON_FROM_VLLM[v.finish_reason]
    return EngineCoreOutput(
        request_id=v.request_id,
        new_token_ids=v.new_token_ids,
        finished=reason is not None,
        finish_reason=reason,
        stop_reason=v.stop_reason,
        num_cached_tokens=v.prefill_stats.num_cached_tokens if v.prefill_stats is not None else 0,
        error=v.error.message if v.error is not None else None,
        new_logprobs=None if v.new_logprobs is None else logprobs_from_vllm(v.new_logprobs),
    )


def outputs_to_vllm(batch: EngineCoreOutputs) -> vllm_engine.EngineCoreOutputs:
    ours = batch.scheduler_stats
    stats = SchedulerStats(step_counter=batch.step_index)
    if ours is not None:  # --output-stats: what vLLM's stats say of the same things
        stats.num_running_reqs, stats.num_waiting_reqs = ours.num_running_reqs, ours.num_waiting_reqs
        stats.kv_cache_usage = ours.kv_cache_usage
        # Our step's tokens are not split into prefill and decode: all go in the generation count.
        stats.iteration_details = SchedulerIterationDetails(
            iteration_index=batch.step_index,
            num_ctx_requests=0,
            num_ctx_tokens=0,
            num_generation_requests=0,
            num_generation_tokens=ours.num_scheduled_tokens,
            elapsed_ms=0.0,
        )
    return vllm_engine.EngineCoreOutputs(
        outputs=[output_to_vllm(o) for o in batch.outputs],
        scheduler_stats=stats,
        timestamp=batch.timestamp,
    )


def outputs_from_vllm(v: vllm_engine.EngineCoreOutputs) -> EngineCoreOutputs:
    stats = v.scheduler_stats
    ours = None
    if stats is not None and stats.iteration_details is not None:
        ours = OurSchedulerStats(
            num_running_reqs=stats.num_running_reqs,
            num_waiting_reqs=stats.num_waiting_reqs,
            kv_cache_usage=stats.kv_cache_usage,
            num_scheduled_tokens=stats.iteration_details.num_ctx_tokens + stats.iteration_details.num_generation_tokens,
        )
    return EngineCoreOutputs(
        outputs=[output_from_vllm(o) for o in v.outputs],
        step_index=stats.step_counter if stats is not None else 0,
        timestamp=v.timestamp,
        scheduler_stats=ours,
    )


# --- any message -----------------------------------------------------------------------

# Our type → (vLLM's type as its decoder takes it, to vLLM, from vLLM). An abort is a
# list of request ids, as vLLM's frontend sends it (after the ABORT request-type frame).
MAPPINGS: dict[type, tuple[Any, Any, Any]] = {
    EngineCoreRequest: (vllm_engine.EngineCoreRequest, request_to_vllm, request_from_vllm),
    EngineCoreOutputs: (vllm_engine.EngineCoreOutputs, outputs_to_vllm, outputs_from_vllm),
    EngineCoreAbort: (list[str], lambda m: list(m.request_ids), lambda ids: EngineCoreAbort(request_ids=list(ids))),
}
