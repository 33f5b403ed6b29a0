"""Continuous-batching scheduler with chunked prefill, a paged KV cache and prefix caching.

Each ``schedule()`` builds one step under two limits, a token budget
(``max_num_batched_tokens``) and at most ``max_num_seqs`` running sequences:

1. every running request that is decoding gets its one token;
2. running requests still in prefill continue with their next chunk;
3. waiting requests are admitted in arrival order (FCFS, no skipping ahead, so
   a large request can't starve) while a slot is free, the KV blocks of their
   prompt are free, and budget is left; none in a step that preempted.

A prefill chunk is capped at ``long_prefill_token_threshold`` whenever other
requests are running or waiting, so one long prompt can't stall everyone's
decode; alone, a prompt may use the whole budget.

KV is paged (``harness.engine.kv_blocks``): a pool of ``num_kv_blocks`` blocks of
``kv_block_size`` tokens. Admission takes the blocks of the prompt (less those a
prefix-cache hit supplies); a decode takes a new block when its sequence crosses
a block boundary. When none is free, the newest running request is *preempted*:
its blocks go back to the pool, it returns to the head of the queue and later
recomputes its prompt and generated tokens (its executor state, the seeded
sampler included, stays, so its tokens are those it would have produced).
Full computed blocks are registered by digest (prefix caching), so a request
sharing a prompt prefix with an earlier one, or a preempted one coming back,
skips computing them. A request that could never fit (prompt + max_tokens over
the cache) is rejected in ``add_request``. The capacity defaults to
``max_num_seqs x max_model_len`` tokens (``EngineConfig.kv_capacity``). Each running
request also holds a *slot* (lowest free first) that counts it against
``max_num_seqs``. ``admission_stats()`` counts the steps that left requests waiting
and why (KV, no free slot, or the token budget), so a TTFT that measures the
admission queue shows as such, with preemptions and the prefix-cache hit rate.

Prefill chunks of several requests in one step run as one batch in the
executor (``harness.engine.model.forward_step``).

Stop strings (``SamplingParams.stop``) are a detokenizer matter: the frontend
checks them and aborts the request.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.engine.config import EngineConfig
from harness.engine.kv_blocks import BlockHash, BlockPool, ImageSpan, block_hash, image_digest
from harness.engine.request_checks import check_request
from harness.engine.step import ModelRunnerOutput, NewRequest, ScheduledChunk, SchedulerOutput
from harness.engine.step_plan import blocks_for
from harness.wire.messages import EngineCoreOutput, EngineCoreRequest, FinishReason

BLOCKED_BY = ("kv_cache", "max_num_seqs", "token_budget")


@dataclass
class _Request:
    req: EngineCoreRequest
    prompt_len: int
    max_tokens: int
    eos_token_id: int | None
    # The prompt as it arrived: a list of ints, or (msgspec-packed) an int32 array that is
    # sliced, never turned into one Python int per token.
    prompt: Sequence[int]
    outputs: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    slot: int = -1
    sent_to_executor: bool = False
    # The request's stop token ids as a set, made once at admission (a step checks membership only).
    stop_ids: frozenset[int] = frozenset()
    # Its KV blocks in position order, the digests of its full blocks so far, and how many of its
    # blocks are registered in the pool's prefix cache.
    blocks: list[int] = field(default_factory=list)
    hashes: list[BlockHash] = field(default_factory=list)
    num_cached_blocks: int = 0
    images: list[ImageSpan] = field(default_factory=list)
    # False when an image could not be read: its KV is never shared (the executor reports the error).
    cacheable: bool = True

    def __post_init__(self) -> None:
        self.stop_ids = frozenset(self.req.sampling_params.stop_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.outputs)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.outputs)

    def tokens(self, start: int, n: int) -> Sequence[int]:
        """Tokens [start, start+n): a slice of the prompt (a view for an array) or of the outputs."""
        if start + n <= self.prompt_len:
            return self.prompt[start : start + n]
        if start >= self.prompt_len:
            return self.outputs[start - self.prompt_len : start - self.prompt_len + n]
        return [*self.prompt[start:], *self.outputs[: start + n - self.prompt_len]]

    @property
    def token_ids(self) -> list[int]:
        """Prompt then outputs, as one list (for inspection; the step uses ``tokens``)."""
        return [int(t) for t in self.prompt] + self.outputs


class Scheduler:
    def __init__(self, config: EngineConfig) -> None:
        if config.max_num_seqs < 1 or config.max_model_len < 2:
            raise ValueError("max_num_seqs must be >= 1 and max_model_len >= 2")
        if config.max_num_batched_tokens < config.max_num_seqs:
            # Otherwise some decodes would miss steps whenever all slots are busy.
            raise ValueError(
                f"max_num_batched_tokens ({config.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({config.max_num_seqs})"
            )
        self.config = config
        self.waiting: deque[str] = deque()
        self.running: list[str] = []  # admission order
        self.requests: dict[str, _Request] = {}
        self._free_slots: list[int] = list(range(config.max_num_seqs))
        heapq.heapify(self._free_slots)
        self.pool = BlockPool(config.num_kv_blocks, config.kv_block_size)
        self._block = config.kv_block_size
        self.preemptions = 0
        # Prefix caching: prompt tokens admitted, and those of them served from cached blocks.
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self._finished_for_executor: list[str] = []
        self._step = 0
        # Chunk cap when others are present; <= 0 disables it.
        self._cap = config.long_prefill_token_threshold
        self._kv_capacity = config.kv_capacity
        # Steps that left requests waiting, by what stopped admission: "kv_cache"
        # (the next request's prompt blocks are not free, or the step preempted), "max_num_seqs" (no free
        # slot) or "token_budget" (the step's tokens ran out first: not admission).
        self.blocked_steps: dict[str, int] = dict.fromkeys(BLOCKED_BY, 0)
        self.waiting_peak = 0

    # -- queries -----------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_tokens_used(self) -> int:
        """Tokens of the blocks running requests hold."""
        return self.pool.num_used * self._block

    @property
    def kv_capacity(self) -> int:
        return self._kv_capacity

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # -- requests in and out -----------------------------------------------
    def add_request(self, req: EngineCoreRequest) -> None:
        """Queue a request; raises ValueError (message says why) if it can't be served."""
        max_tokens = self._validate(req)
        eos = req.eos_token_id if req.eos_token_id is not None else self.config.eos_token_id
        images = self._image_spans(req) if self.config.prefix_caching else []
        self.requests[req.request_id] = _Request(
            req=req,
            prompt_len=len(req.prompt_token_ids),
            max_tokens=max_tokens,
            eos_token_id=eos,
            prompt=req.prompt_token_ids,
            images=images or [],
            cacheable=self.config.prefix_caching and images is not None,
        )
        self.waiting.append(req.request_id)

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Drop waiting or running requests, freeing their KV; returns the ids that existed."""
        found = []
        for rid in request_ids:
            if rid in self.requests:  # also skips an id listed twice
                self._remove_running_or_waiting(rid)
                found.append(rid)
        return found

    @staticmethod
    def _image_spans(req: EngineCoreRequest) -> list[ImageSpan] | None:
        """Each image's range and pixel digest, made now (the payload is dropped after the first
        step); None when one can't be read, which the executor reports as the request's error."""
        spans = []
        for item, pr in zip(req.mm_inputs or [], req.mm_placeholders or [], strict=True):
            try:
                spans.append(ImageSpan(pr.offset, pr.length, image_digest(item)))
            except Exception:
                return None
        return spans

    def _validate(self, req: EngineCoreRequest) -> int:
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}: a request with this id is still in the engine")
        return check_request(req, self.config, self._kv_capacity)

    def _free(self, rid: str) -> None:
        r = self.requests.pop(rid)
        self._release(r)
        if r.sent_to_executor:
            self._finished_for_executor.append(rid)

    def _release(self, r: _Request) -> None:
        """Give back the request's slot and blocks (cached ones stay findable until evicted)."""
        if r.slot >= 0:
            heapq.heappush(self._free_slots, r.slot)
            r.slot = -1
        self.pool.release(r.blocks)
        r.blocks = []
        r.num_cached_blocks = 0

    def _preempt(self, rid: str, out: SchedulerOutput) -> None:
        """Free a running request's KV and queue it first again: it recomputes its tokens later."""
        self.running.remove(rid)
        r = self.requests[rid]
        self._release(r)
        r.num_computed_tokens = 0
        self.waiting.appendleft(rid)
        self.preemptions += 1
        out.preempted_req_ids.append(rid)

    def _grow(self, r: _Request, rid: str, n_tokens: int, out: SchedulerOutput) -> bool:
        """Blocks for ``n_tokens`` of ``r``, preempting the newest running requests while none is free.

        False when ``r`` itself was the newest and got preempted.
        """
        need = blocks_for(n_tokens, self._block) - len(r.blocks)
        if need <= 0:
            return True
        while need > self.pool.num_free:
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim == rid:
                return False
        r.blocks.extend(self.pool.allocate(need))
        return True

    def _hash(self, r: _Request, i: int) -> BlockHash | None:
        """The digest of ``r``'s block ``i``, made once; None while one of its tokens is not known
        (negative: a token still on the device, harness.engine.overlap's placeholder)."""
        bs = self._block
        while len(r.hashes) <= i:
            j = len(r.hashes)
            tokens = r.tokens(j * bs, bs)
            if min(tokens) < 0:
                return None
            parent = r.hashes[-1] if r.hashes else None
            r.hashes.append(block_hash(parent, tokens, j * bs, r.images))
        return r.hashes[i]

    def _prefix_hits(self, r: _Request) -> list[int]:
        """Cached blocks holding ``r``'s leading tokens; at least its last token is left to compute."""
        if not r.cacheable:
            return []
        hits = []
        for i in range((r.num_tokens - 1) // self._block):
            digest = self._hash(r, i)
            b = self.pool.lookup(digest) if digest is not None else None
            if b is None:
                break
            hits.append(b)
        return hits

    def _cache_full_blocks(self, r: _Request) -> None:
        """Register the blocks ``r`` has now computed in full, for later requests to hit."""
        if not r.cacheable:
            return
        for i in range(r.num_cached_blocks, r.num_computed_tokens // self._block):
            digest = self._hash(r, i)
            if digest is None:
                return
            self.pool.cache(r.blocks[i], digest)
            r.num_cached_blocks = i + 1

    # -- one step ------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        out = SchedulerOutput(step_index=self._step)
        budget = cfg.max_num_batched_tokens
        others_present = len(self.running) + len(self.waiting) > 1

        # 1. decodes (one un-fed token each), a new block at a block boundary; preempting the
        # newest requests when none is free (they come after this one: not scheduled yet)
        bs = self._block
        for rid in list(self.running):
            if budget == 0:
                break
            r = self.requests[rid]
            if r.slot < 0 or not self._is_decode(r):  # preempted above, or still in prefill
                continue
            # The fed token's position is num_computed_tokens: a new block only at a boundary.
            if r.num_computed_tokens // bs < len(r.blocks) or self._grow(r, rid, r.num_computed_tokens + 1, out):
                out.decodes.append(self._chunk(r, rid, 1))
                budget -= 1
        # 2. running requests still in prefill (their blocks were taken at admission)
        for rid in self.running:
            if budget == 0:
                break
            r = self.requests[rid]
            if r.num_computed_tokens < r.num_tokens and not self._is_decode(r):
                n = self._chunk_len(r, budget, others_present)
                out.prefills.append(self._chunk(r, rid, n))
                budget -= n
        # 3. admit waiting requests (FCFS), not in a step that had to preempt
        self.waiting_peak = max(self.waiting_peak, len(self.waiting))
        while self.waiting and budget > 0 and self._free_slots and not out.preempted_req_ids:
            r = self.requests[self.waiting[0]]
            hits = self._prefix_hits(r)
            need = blocks_for(r.num_tokens, self._block) - len(hits)
            idle_hits = sum(1 for b in hits if self.pool.ref[b] == 0)  # these leave the free queue too
            if need + idle_hits > self.pool.num_free:
                break
            rid = self.waiting.popleft()
            for b in hits:
                self.pool.take(b)
            r.blocks = hits + self.pool.allocate(need)
            r.num_cached_blocks = len(hits)
            r.num_computed_tokens = len(hits) * self._block
            self.prefix_query_tokens += r.num_tokens
            self.prefix_hit_tokens += r.num_computed_tokens
            r.slot = heapq.heappop(self._free_slots)
            self.running.append(rid)
            if not r.sent_to_executor:  # a preempted request's executor state is still there
                r.sent_to_executor = True
                out.new_requests.append(NewRequest(rid, r.req, r.slot, r.max_tokens))
            n = self._chunk_len(r, budget, others_present)
            out.prefills.append(self._chunk(r, rid, n))
            budget -= n

        if self.waiting:
            self.blocked_steps[self._blocked_by(budget)] += 1
        out.total_num_tokens = cfg.max_num_batched_tokens - budget
        if out.total_num_tokens:
            # Hand over finished ids only with a step the executor will run.
            out.finished_req_ids, self._finished_for_executor = self._finished_for_executor, []
            self._step += 1
        return out

    def _blocked_by(self, budget: int) -> str:
        if budget == 0:
            return "token_budget"
        if not self._free_slots:
            return "max_num_seqs"
        return "kv_cache"

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Prompt tokens served from cached blocks over prompt tokens admitted (0 before any)."""
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    def admission_stats(self) -> dict[str, Any]:
        """How often admission, not the token budget, kept requests waiting (for the engine's info)."""
        return {
            "steps": self._step,
            "admission_blocked_steps": self.blocked_steps["kv_cache"] + self.blocked_steps["max_num_seqs"],
            "admission_blocked_by": dict(self.blocked_steps),
            "waiting_peak": self.waiting_peak,
            "kv_cache_tokens": self._kv_capacity,
            "kv_tokens_used": self.kv_tokens_used,
            "kv_block_size": self._block,
            "kv_cache_blocks": self.pool.num_blocks,
            "preemptions": self.preemptions,
            "prefix_cache_hit_tokens": self.prefix_hit_tokens,
            "prefix_cache_query_tokens": self.prefix_query_tokens,
            "prefix_cache_hit_rate": round(self.prefix_cache_hit_rate, 4),
        }

    def step_counts(self) -> dict[str, int]:
        """Counters for the heartbeat: steps run, steps that left requests waiting (by cause),
        preemptions, and prompt tokens admitted and served from the prefix cache."""
        return {
            "steps": self._step,
            **{f"blocked_{k}": v for k, v in self.blocked_steps.items()},
            "preemptions": self.preemptions,
            "prefix_cache_hit_tokens": self.prefix_hit_tokens,
            "prefix_cache_query_tokens": self.prefix_query_tokens,
        }

    @staticmethod
    def _is_decode(r: _Request) -> bool:
        """Past its prompt with only the newest sampled token to feed (a recompute is a prefill)."""
        return r.num_computed_tokens >= r.prompt_len and r.num_computed_tokens == r.num_tokens - 1

    def _chunk_len(self, r: _Request, budget: int, others_present: bool) -> int:
        n = min(r.num_tokens - r.num_computed_tokens, budget)
        if others_present and self._cap > 0:
            n = min(n, self._cap)
        return n

    def _chunk(self, r: _Request, rid: str, n: int) -> ScheduledChunk:
        start = r.num_computed_tokens
        r.num_computed_tokens += n
        sample = r.num_computed_tokens == r.num_tokens
        suppress = None
        sp = r.req.sampling_params
        # The token sampled now would be output number num_output_tokens + 1.
        if sample and r.num_output_tokens + 1 <= sp.min_tokens:
            suppress = list(sp.stop_token_ids)
            if r.eos_token_id is not None and not sp.ignore_eos:
                suppress.append(r.eos_token_id)
        if r.cacheable and r.num_computed_tokens // self._block > r.num_cached_blocks:
            self._cache_full_blocks(r)
        # The request's own table, not a copy: the executor reads it during this step only.
        return ScheduledChunk(rid, r.slot, r.tokens(start, n), start, sample, suppress or None, r.blocks)

    def update_from_output(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Append sampled tokens, check stop conditions, free finished requests."""
        outputs: list[EngineCoreOutput] = []
        for rid, msg in result.errors.items():
            if rid in self.requests:
                self._remove_running_or_waiting(rid)
                outputs.append(EngineCoreOutput(rid, [], finished=True, finish_reason=FinishReason.ERROR, error=msg))
        for chunk in sched.chunks:
            if not chunk.sample:
                continue
            rid = chunk.request_id
            r = self.requests.get(rid)
            if r is None:  # aborted meanwhile, or failed above
                continue
            tok = result.sampled_token_ids.get(rid)
            if tok is None:  # never leave a request stuck without its token
                self._remove_running_or_waiting(rid)
                outputs.append(
                    EngineCoreOutput(
                        rid,
                        [],
                        finished=True,
                        finish_reason=FinishReason.ERROR,
                        error="the executor produced no token for this request",
                    )
                )
                continue
            r.outputs.append(tok)
            reason, stop_reason = self._check_stop(r, tok)
            lp = result.logprobs.get(rid)
            if reason is None:
                outputs.append(EngineCoreOutput(rid, [tok], new_logprobs=lp))
            else:
                outputs.append(
                    EngineCoreOutput(
                        rid, [tok], finished=True, finish_reason=reason, stop_reason=stop_reason, new_logprobs=lp
                    )
                )
                self._remove_running_or_waiting(rid)
        return outputs

    def _check_stop(self, r: _Request, tok: int) -> tuple[FinishReason | None, int | None]:
        sp = r.req.sampling_params
        if r.num_output_tokens >= sp.min_tokens:
            # A stop token on the last allowed token still reports "stop".
            if tok in r.stop_ids:
                return FinishReason.STOP, tok
            if tok == r.eos_token_id and not sp.ignore_eos:
                return FinishReason.STOP, None
        if r.num_output_tokens >= r.max_tokens:
            return FinishReason.LENGTH, None
        return None, None

    def _remove_running_or_waiting(self, rid: str) -> None:
        if rid in self.running:
            self.running.remove(rid)
        elif rid in self.waiting:
            self.waiting.remove(rid)
        self._free(rid)
