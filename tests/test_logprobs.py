"""Top-K logprobs: the engine's computation and the frontend's OpenAI shapes."""

from __future__ import annotations

import math

import torch

from harness.engine.logprobs import sim_logprobs, top_logprobs
from harness.frontend.logprobs import LogprobsRenderer
from harness.tokenizers.tokenizer import load_tokenizer
from harness.wire.messages import Logprobs


def test_top_logprobs_match_a_log_softmax_and_rank_the_sampled_token() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, 9.0], [5.0, 1.0, 1.0, 0.0, 0.0, 9.0]])
    tokens = torch.tensor([2, 0])
    # The head is wider than the vocabulary (id 5): only the first 5 ids count.
    got = top_logprobs(logits, tokens, [2, 0], vocab_size=5)
    ref = torch.log_softmax(logits[:, :5], dim=-1)
    first, second = got
    assert first.token_ids == [[2, 1, 3]] and first.ranks == [3]  # ids 1 and 3 are more likely than 2
    assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(first.logprobs[0], ref[0, [2, 1, 3]].tolist()))
    assert second.token_ids == [[0]] and second.ranks == [1]  # K=0: the sampled token's own logprob only
    assert math.isclose(second.logprobs[0][0], ref[1, 0].item(), rel_tol=1e-6)


def test_sim_logprobs_have_the_shape_of_real_ones_in_float32() -> None:
    lp = sim_logprobs(token=42, k=5, key=123, vocab_size=1000)
    assert len(lp.token_ids[0]) == len(lp.logprobs[0]) == 6 and lp.token_ids[0][0] == 42 and lp.ranks == [1]
    assert all(float(torch.tensor(v, dtype=torch.float32).item()) == v for v in lp.logprobs[0])
    assert lp.logprobs[0] == sorted(lp.logprobs[0], reverse=True)


def test_renderer_builds_openai_completion_and_chat_logprobs() -> None:
    tok = load_tokenizer()
    a, b = tok.encode("Hello world")[:2]
    lp = Logprobs(token_ids=[[a, a, b]], logprobs=[[-0.5, -0.5, -1.5]], ranks=[1])
    completion = LogprobsRenderer(tok, chat=False)
    chunk = completion.render(lp)
    text_a, text_b = tok.decode([a], skip_special_tokens=False), tok.decode([b], skip_special_tokens=False)
    assert chunk == {
        "tokens": [text_a],
        "token_logprobs": [-0.5],
        "top_logprobs": [{text_a: -0.5, text_b: -1.5}],
        "text_offset": [0],
    }
    assert completion.render(lp)["text_offset"] == [len(text_a)]  # the second token starts after the first
    assert completion.render(None) is None
    assert len(completion.all["tokens"]) == 2
    chat = LogprobsRenderer(tok, chat=True).render(lp)
    assert chat is not None
    entry = chat["content"][0]
    assert entry["token"] == text_a and entry["logprob"] == -0.5 and entry["bytes"] == list(text_a.encode())
    assert [t["token"] for t in entry["top_logprobs"]] == [text_a, text_b]


def test_output_stats_say_what_the_scheduler_holds() -> None:
    """--output-stats: the state attached to a step's outputs (running, waiting, KV usage, tokens)."""
    from harness.engine.config import EngineConfig
    from harness.engine.core import EngineCore
    from harness.wire.messages import EngineCoreRequest, SamplingParams

    core = EngineCore(EngineConfig(executor="sim", sim_step_fixed_ms=0.0, max_num_seqs=1, max_model_len=64))
    for i in range(2):
        core.add_request(EngineCoreRequest(f"r{i}", None, [1, 2, 3], SamplingParams(max_tokens=4), None, 0.0))
    core.step()
    stats = core.scheduler_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (1, 1)  # one slot: the second waits
    assert stats.num_scheduled_tokens == 3 and 0 < stats.kv_cache_usage <= 1
