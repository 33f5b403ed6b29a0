"""The paged KV cache: token streams equal an uncached reference, preemption, prefix caching, memory.

The reference ("the old engine") is the same model's weights run with no KV cache at all: for
every token, one causal forward over the whole sequence so far (``reference_logits``), then the
same sampler with a fresh generator of the request's seed. Nothing in it is paged, cached,
batched with another request or chunked, so a difference in the engine's streams is the cache's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore
from harness.engine.device import MemoryPlan, count_params, kv_bytes_per_token, workspace_bytes
from harness.engine.executor import TorchExecutor
from harness.engine.kv_blocks import BlockPool, block_hash
from harness.engine.model import Block, Transformer, _dense_fns, get_model_config
from harness.engine.opcount import OpCounter
from harness.engine.sampler import Sampler, SampleRow
from harness.engine.scheduler import Scheduler
from harness.engine.staging import Stager
from harness.engine.step import ModelRunnerOutput
from harness.engine.step_plan import Chunk, StepPlan, blocks_for
from harness.wire.messages import EngineCoreRequest, PlaceholderRange, SamplingParams

VOCAB = 256
CPU = torch.device("cpu")


def make_config(**kw: Any) -> EngineConfig:
    base: dict = dict(
        device="cpu",
        vocab_size=VOCAB,
        eos_token_id=None,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=128,
        long_prefill_token_threshold=0,
        image_tokens=4,
        num_threads=1,
        prefix_caching=True,
    )
    base.update(kw)
    return EngineConfig(**base)


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def request(rid: str, ids: list[int], max_tokens: int, **sp: Any) -> EngineCoreRequest:
    return EngineCoreRequest(rid, None, ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sp), None, 0.0)


@torch.inference_mode()
def reference_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    """The last position's logits [V] of one causal forward over ``ids``, with no KV cache."""
    n = len(ids)
    x = model.embed(torch.tensor(ids))
    attn_in, attn_out_ffn = _dense_fns(model.cfg)
    pos = torch.arange(n)
    cos, sin = model.rope_cos[pos], model.rope_sin[pos]
    for layer in model.layers:
        assert isinstance(layer, Block)
        q, k, v = attn_in(x, layer.attn_norm.weight, layer.attn.wqkv.weight, cos, sin)
        g = q.shape[1] // k.shape[1]
        kh, vh = k.transpose(0, 1).repeat_interleave(g, 0), v.transpose(0, 1).repeat_interleave(g, 0)
        a = F.scaled_dot_product_attention(q.transpose(0, 1), kh, vh, is_causal=True).transpose(0, 1).reshape(n, -1)
        x = attn_out_ffn(x, a, layer.attn.wo.weight, layer.ffn_norm.weight, layer.ffn.w13.weight, layer.ffn.w2.weight)
    return model.output(model.norm(x[-1:])).float()[0]


@torch.inference_mode()
def reference_stream(model: Transformer, config: EngineConfig, r: EngineCoreRequest) -> list[int]:
    sampler = Sampler(config.vocab_size, config.seed, CPU, Stager(CPU))
    params = r.sampling_params
    gen = sampler.request_generator(params)
    seq, out = list(r.prompt_token_ids), []
    for _ in range(params.max_tokens or 0):
        tok = int(sampler.sample_tensor(reference_logits(model, seq)[None], [SampleRow(params, gen)])[0])
        seq.append(tok)
        out.append(tok)
    return out


def run(
    core: EngineCore, reqs: list[EngineCoreRequest], later: list[EngineCoreRequest] | None = None
) -> dict[str, list[int]]:
    """Every request's tokens; ``later`` ones are added once the first ones are done."""
    streams: dict[str, list[int]] = {}
    for batch in (reqs, later or []):
        for r in batch:
            assert core.add_request(r) is None
        for _ in range(2000):
            if not core.has_work():
                break
            for o in core.step():
                assert o.error is None, o.error
                streams.setdefault(o.request_id, []).extend(o.new_token_ids)
        assert not core.has_work()
    return streams


def check_against_reference(core: EngineCore, streams: dict[str, list[int]], reqs: list[EngineCoreRequest]) -> None:
    executor = core.executor
    assert isinstance(executor, TorchExecutor)
    for r in reqs:
        assert streams[r.request_id] == reference_stream(executor.model, core.config, r), r.request_id


GREEDY: dict = dict(temperature=0.0)
SEEDED: dict = dict(temperature=1.0, top_p=0.95)


def sampling(kind: str, i: int) -> dict:
    return GREEDY if kind == "greedy" else {**SEEDED, "seed": 1000 + i}


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_streams_equal_the_uncached_reference(kind: str) -> None:
    """Batched, chunked (a 24-token chunk cap), paged: the same tokens as the reference, no preemption."""
    core = EngineCore(make_config(long_prefill_token_threshold=24))
    reqs = [request(f"r{i}", prompt(10 + 9 * i, seed=i), 12, **sampling(kind, i)) for i in range(5)]
    streams = run(core, reqs)
    assert core.scheduler.preemptions == 0
    check_against_reference(core, streams, reqs)


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_recomputes_the_same_streams(kind: str, prefix_caching: bool) -> None:
    """Eight blocks for four requests that each grow to four: decodes preempt the newest, which
    recompute prompt + outputs (from their own cached blocks when prefix caching is on)."""
    core = EngineCore(make_config(kv_cache_tokens=8 * 16, prefix_caching=prefix_caching))
    reqs = [request(f"p{i}", prompt(30, seed=10 + i), 20, **sampling(kind, i)) for i in range(4)]
    streams = run(core, reqs)
    assert core.scheduler.preemptions > 0
    assert core.scheduler.step_counts()["preemptions"] == core.scheduler.preemptions
    check_against_reference(core, streams, reqs)
    assert core.scheduler.pool.num_used == 0


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_prefix_hits_give_the_same_streams(kind: str) -> None:
    """Requests sharing a 40-token prefix (2 full blocks): admitted in the same step (the second
    reads the blocks the first writes in that very forward), and after the first ended (its blocks
    cached and free)."""
    core = EngineCore(make_config())
    shared = prompt(40, seed=99)
    first = [request(f"s{i}", shared + prompt(10, seed=50 + i), 10, **sampling(kind, i)) for i in range(2)]
    later = [request("s2", shared + prompt(7, seed=60), 10, **sampling(kind, 2))]
    streams = run(core, first, later)
    s = core.scheduler
    assert s.prefix_hit_tokens == 2 * 32  # s1 and s2 each reuse 2 blocks of 16
    assert s.prefix_query_tokens == 50 + 50 + 47
    assert s.prefix_cache_hit_rate == pytest.approx(64 / 147)
    check_against_reference(core, streams, first + later)


def _image(channel: int) -> dict:
    """A 16 x 16 image of one pure colour (random-noise images all look alike to the random encoder)."""
    pixels = np.zeros((3, 16, 16), dtype=np.uint8)
    pixels[channel] = 255
    return {"pixel_values": pixels}


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_a_prefix_hit_ending_inside_an_image_gives_the_same_stream(kind: str) -> None:
    """The image sits at [28, 36) of a 38-token prompt. An earlier request with the same first 36
    tokens and image leaves blocks 0-1 cached, so the second computes from position 32, inside the
    image. Reference: the second request alone on a fresh engine (same weights), no prefix caching;
    a blue image instead of the red one changes its tokens, so the image is really read."""
    ph = [PlaceholderRange(28, 8)]
    ids = prompt(38, seed=5)

    def mm_request(rid: str, tokens: list[int], channel: int) -> EngineCoreRequest:
        sp = SamplingParams(max_tokens=8, ignore_eos=True, **sampling(kind, 7))
        return EngineCoreRequest(rid, None, tokens, sp, None, 0.0, mm_inputs=[_image(channel)], mm_placeholders=ph)

    core = EngineCore(make_config(image_tokens=8))
    streams = run(core, [mm_request("a", ids[:36] + prompt(10, seed=6), 0)], [mm_request("b", ids, 0)])
    assert core.scheduler.prefix_hit_tokens == 32

    def alone(channel: int) -> list[int]:
        return run(EngineCore(make_config(image_tokens=8, prefix_caching=False)), [mm_request("b", ids, channel)])["b"]

    assert streams["b"] == alone(0) != alone(2)


# -- the scheduler alone ----------------------------------------------------------------


def drive(s: Scheduler, steps: int = 500) -> None:
    for _ in range(steps):
        if not s.has_unfinished_requests():
            return
        out = s.schedule()
        s.update_from_output(out, ModelRunnerOutput({c.request_id: 5 for c in out.chunks if c.sample}))


def test_admission_by_free_blocks_fits_more_sequences() -> None:
    """The same 8 x 128 tokens of KV (64 blocks): reserved whole, 8 sequences ran at once; paged,
    40 prompts of 16 tokens are admitted (a block each), and 32 keep decoding past a block boundary."""
    s = Scheduler(make_config(max_num_seqs=64, max_num_batched_tokens=1024, kv_cache_tokens=8 * 128))
    for i in range(40):
        s.add_request(request(f"m{i}", prompt(16, seed=i), 4))
    out = s.schedule()
    assert len(out.new_requests) == 40
    s.update_from_output(out, ModelRunnerOutput({c.request_id: 5 for c in out.chunks if c.sample}))
    out = s.schedule()
    assert len(out.decodes) == 32 and len(out.preempted_req_ids) == 8  # each now needs a second block
    s.update_from_output(out, ModelRunnerOutput({c.request_id: 5 for c in out.chunks if c.sample}))
    drive(s)
    assert not s.has_unfinished_requests() and s.pool.num_used == 0


def test_preempted_request_keeps_its_executor_state_and_resumes_first() -> None:
    s = Scheduler(make_config(kv_cache_tokens=4 * 16, prefix_caching=False))
    s.add_request(request("old", prompt(16, seed=1), 20))
    s.add_request(request("new", prompt(16, seed=2), 20))
    preempted = []
    new_ids = []
    for _ in range(200):
        if not s.has_unfinished_requests():
            break
        out = s.schedule()
        preempted += out.preempted_req_ids
        new_ids += [nr.request_id for nr in out.new_requests]
        assert not set(out.preempted_req_ids) & set(out.finished_req_ids)
        s.update_from_output(out, ModelRunnerOutput({c.request_id: 5 for c in out.chunks if c.sample}))
    assert preempted and preempted[0] == "new"  # the newest goes first
    assert sorted(new_ids) == ["new", "old"]  # sent to the executor once, whatever the preemptions


def _mm_request(rid: str, ids: list[int], pixels: np.ndarray | None) -> EngineCoreRequest:
    mm = [{"pixel_values": pixels}] if pixels is not None else None
    ph = [PlaceholderRange(20, 4)] if pixels is not None else None
    return EngineCoreRequest(rid, None, ids, SamplingParams(max_tokens=2), None, 0.0, mm_inputs=mm, mm_placeholders=ph)


def test_an_image_prompt_never_hits_a_text_prompt_with_the_same_ids() -> None:
    s = Scheduler(make_config())
    ids = prompt(40, seed=7)
    red = np.zeros((3, 8, 8), dtype=np.uint8)
    red[0] = 255
    blue = np.zeros((3, 8, 8), dtype=np.uint8)
    blue[2] = 255
    hits = []
    for rid, pixels in (("text", None), ("red", red), ("red-again", red.copy()), ("blue", blue)):
        before = s.prefix_hit_tokens
        s.add_request(_mm_request(rid, ids, pixels))
        drive(s)
        hits.append(s.prefix_hit_tokens - before)
    # Block 0 (positions 0-15) holds no image; block 1 (16-31) holds the image at 20-23.
    assert hits == [0, 16, 32, 16]


def test_prefix_caching_off_never_hits() -> None:
    s = Scheduler(make_config(prefix_caching=False))
    ids = prompt(50, seed=3)
    for i in range(3):
        s.add_request(request(f"n{i}", ids, 2))
        drive(s)
    assert s.prefix_hit_tokens == 0 and s.prefix_query_tokens == 150


def test_block_pool_evicts_least_recently_freed_tail_first() -> None:
    pool = BlockPool(3, 16)
    blocks = pool.allocate(3)
    digests = [bytes([i]) * 16 for i in range(3)]
    for b, d in zip(blocks, digests, strict=True):
        pool.cache(b, d)
    pool.release(blocks)
    assert pool.num_free == 3 and pool.num_used == 0
    (b,) = pool.allocate(1)
    assert b == blocks[2] and pool.lookup(digests[2]) is None  # the prompt's tail went first
    assert pool.lookup(digests[0]) == blocks[0]
    pool.take(blocks[0])  # a hit on an idle cached block takes it out of the free queue
    assert pool.num_free == 1 and pool.evictions == 1
    with pytest.raises(ValueError, match="2 blocks asked, 1 free"):
        pool.allocate(2)


def test_block_hash_chains_its_parent() -> None:
    a = block_hash(None, [1, 2, 3], 0, [])
    assert block_hash(None, [1, 2, 3], 0, []) == a
    assert block_hash(a, [4, 5, 6], 3, []) != block_hash(block_hash(None, [9, 2, 3], 0, []), [4, 5, 6], 3, [])
    assert block_hash(None, np.array([1, 2, 3], dtype=np.int32), 0, []) == a  # a packed prompt's view


# -- one attention call per group, whatever the number of chunks ---------------------------


@torch.inference_mode()
def test_step_ops_do_not_grow_with_the_number_of_prompts() -> None:
    cfg = get_model_config("tiny", VOCAB)
    model = Transformer(cfg, 8, 128, CPU, torch.float32)
    model.init_weights(0)

    def count(n_prompts: int, decodes: int) -> int:
        tb = model.slot_blocks
        plan = StepPlan(
            [tb(7 - d) for d in range(decodes)],
            [20 + d for d in range(decodes)],
            [Chunk(tb(i), 0, 10 + 3 * i) for i in range(n_prompts)],
        )
        with OpCounter() as ops:
            batch, (ids,) = model.stage(plan, [5] * plan.n_rows)
            model.forward_step(model.embed(ids), batch)
        assert ops.num_syncs == 0, ops.syncs
        return ops.num_ops

    assert count(1, 0) == count(4, 0)
    assert count(1, 3) == count(4, 3)


# -- the memory plan ------------------------------------------------------------------------


def test_llama_8b_bf16_fits_256_seed_sequences_in_80_gb() -> None:
    """The seed's workload (docs/seed.md): ~509 prompt tokens of which 200 are a shared prefix,
    150 output tokens, 256 sequences at once, llama-8b in bf16 on an 80 GB card.

    Weights 16.1 GB; KV 128 KiB a token, 42 blocks of 16 a sequence (659 tokens), the 12 full
    blocks of the shared prefix held once: 12 + 256 x 30 blocks = 16.1 GB; the margin for
    activations is ``workspace_bytes`` at a 2,048-token step (activations, the sampler's copies
    of 256 rows of logits, math-kernel attention scores, the keys and values attention gathers
    out of the paged cache, 1 GiB of allocator slack): 5.1 GB.
    The old layout, 256 slots of a whole max_model_len (2,048), needed 68.7 GB of KV alone.
    """
    cfg = get_model_config("llama-8b", 128256)
    dtype, block = torch.bfloat16, 16
    weights = count_params(cfg) * dtype.itemsize
    per_token = kv_bytes_per_token(cfg, dtype)
    assert per_token == 128 * 1024
    seq_blocks = blocks_for(509 + 150, block)
    shared = 200 // block
    blocks = shared + 256 * (seq_blocks - shared)
    kv = blocks * block * per_token
    margin = workspace_bytes(cfg, dtype, 2048, 256, 2048)
    plan = MemoryPlan(weights=weights, kv_cache=kv, workspace=margin, kv_tokens=blocks * block, free=80 * 10**9)
    assert plan.shortfall("an 80 GB card") is None
    assert (round(weights / 1e9, 1), round(kv / 1e9, 1), round(margin / 1e9, 1)) == (16.1, 16.1, 5.1)
    assert plan.needed < 40 * 10**9  # half the card: room for ~2x the sequences
    # Even without the shared prefix (no prefix caching) it fits: 256 x 42 blocks = 22.5 GB.
    assert weights + 256 * seq_blocks * block * per_token + margin < 80 * 10**9
    old = 256 * 2048 * per_token
    assert round(old / 1e9, 1) == 68.7 and weights + old + margin > 80 * 10**9
