"""The model (prefill/decode consistency), the vision encoder and the sampler."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from harness.engine.config import MODEL_PRESETS
from harness.engine.device import resolve_dtype
from harness.engine.model import PRESETS, build_model, get_model_config
from harness.engine.sampler import Sampler, SampleRow
from harness.engine.step_plan import Chunk, StepPlan
from harness.engine.vision import build_vision_encoder, check_mm_input, to_pixels
from harness.wire.messages import SamplingParams

CPU = torch.device("cpu")
VOCAB = 300
ATOL = 1e-4


@pytest.fixture(scope="module")
def model():
    cfg = get_model_config("tiny", VOCAB)
    return build_model(cfg, max_num_seqs=6, max_model_len=96, device=CPU, dtype=torch.float32, seed=0)


def _tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def test_chunked_prefill_matches_one_shot(model):
    toks = _tokens(50)
    one_shot = model.prefill(model.embed(toks), slot=0, start=0, all_logits=True)  # [50, V]
    assert one_shot.shape == (50, VOCAB)
    parts, start = [], 0
    for n in (13, 1, 25, 11):
        parts.append(model.prefill(model.embed(toks[start : start + n]), slot=1, start=start, all_logits=True))
        start += n
    torch.testing.assert_close(torch.cat(parts), one_shot, atol=ATOL, rtol=1e-4)
    # Default: logits of the last position only.
    last = model.prefill(model.embed(toks), slot=2, start=0)
    torch.testing.assert_close(last, one_shot[-1], atol=ATOL, rtol=1e-4)


@torch.inference_mode()
def test_decode_token_by_token_matches_prefill(model):
    toks = _tokens(40, seed=1)
    one_shot = model.prefill(model.embed(toks), slot=0, start=0, all_logits=True)
    model.prefill(model.embed(toks[:5]), slot=3, start=0)
    for p in range(5, 40):
        logits = model.decode(model.embed(toks[p : p + 1]), torch.tensor([3]), torch.tensor([p]))
        torch.testing.assert_close(logits[0], one_shot[p], atol=ATOL, rtol=1e-4)


@torch.inference_mode()
def test_batched_ragged_decode_equals_per_sequence(model):
    lengths = {0: 7, 1: 30, 4: 61}  # slot -> prompt length; slots 2, 3 unused on purpose
    seqs = {slot: _tokens(n + 1, seed=slot + 10) for slot, n in lengths.items()}
    for slot, n in lengths.items():
        model.prefill(model.embed(seqs[slot][:n]), slot=slot, start=0)
    slots = torch.tensor([4, 0, 1])  # not sorted: the batch order is arbitrary
    positions = torch.tensor([lengths[s] for s in slots.tolist()])
    nxt = torch.stack([seqs[s][lengths[s]] for s in slots.tolist()])
    batched = model.decode(model.embed(nxt), slots, positions)
    assert batched.shape == (3, VOCAB)
    for i, slot in enumerate(slots.tolist()):
        alone = model.decode(model.embed(nxt[i : i + 1]), torch.tensor([slot]), positions[i : i + 1])
        torch.testing.assert_close(batched[i], alone[0], atol=ATOL, rtol=1e-4)
        # ...and equals a one-shot prefill of the whole sequence.
        ref = model.prefill(model.embed(seqs[slot]), slot=5, start=0)
        torch.testing.assert_close(batched[i], ref, atol=ATOL, rtol=1e-4)


@torch.inference_mode()
def test_one_step_of_decodes_and_chunks_equals_each_sequence_alone(model):
    """forward_step: decode rows, a chunk from 0 and a chunk after a cached prefix, in one pass."""
    seqs = {s: _tokens(40, seed=20 + s) for s in range(4)}
    ref = {}
    for s in range(4):
        ref[s] = model.prefill(model.embed(seqs[s]), slot=5, start=0, all_logits=True)  # [40, V]
    for s, n in ((0, 30), (1, 12), (3, 10)):  # what each slot has cached
        model.prefill(model.embed(seqs[s][:n]), slot=s, start=0)
    tb = model.slot_blocks
    plan = StepPlan([tb(1), tb(0)], [12, 30], [Chunk(tb(2), 0, 17), Chunk(tb(3), 10, 25)])
    ids = torch.cat([seqs[1][12:13], seqs[0][30:31], seqs[2][:17], seqs[3][10:35]])
    batch, _ = model.stage(plan)
    logits = model.forward_step(model.embed(ids), batch)
    assert logits.shape == (2 + 17 + 25, VOCAB)
    expected = torch.cat([ref[1][12:13], ref[0][30:31], ref[2][:17], ref[3][10:35]])
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=1e-4)
    # Only the rows asked for go through the LM head.
    rows = torch.tensor(plan.last_rows())
    torch.testing.assert_close(model.forward_step(model.embed(ids), model.stage(plan)[0], rows), expected[rows])
    with pytest.raises(ValueError, match="same KV block"):
        model.stage(StepPlan([tb(1)], [3], [Chunk(tb(1), 0, 4)]))


def test_sdpa_backends_are_reported(model):
    kinds = model.sdpa_backends()
    sdpa = {k: v for k, v in kinds.items() if not k.startswith("attention")}
    assert set(sdpa) == {"prefill", "prefill_cached", "decode"}
    assert all(
        k in {"flash_attention", "efficient_attention", "math", "cudnn_attention", "overrideable"}
        for k in sdpa.values()
    )
    # On the CPU the torch reference attends: at most two SDPA calls a layer, no note.
    assert kinds["attention"] == "torch-reference" and kinds["attention_calls_per_layer"] == "2"
    assert "attention_note" not in kinds


@torch.inference_mode()
def test_weights_are_deterministic_and_logits_sane(model):
    again = build_model(model.cfg, 6, 96, CPU, torch.float32, seed=0)
    other = build_model(model.cfg, 6, 96, CPU, torch.float32, seed=1)
    toks = _tokens(20, seed=3)
    a = model.prefill(model.embed(toks), 0, 0)
    torch.testing.assert_close(again.prefill(again.embed(toks), 0, 0), a)
    assert not torch.allclose(other.prefill(other.embed(toks), 0, 0), a)
    assert torch.isfinite(a).all() and 0.1 < a.std().item() < 10


def test_presets_and_config_errors():
    assert tuple(PRESETS) == MODEL_PRESETS  # the names --model-preset offers without importing torch
    big = PRESETS["llama-8b"]
    assert (big.n_layers, big.dim, big.n_heads, big.n_kv_heads, big.ffn_dim) == (32, 4096, 32, 8, 14336)
    assert get_model_config("llama-8b", 4096).vocab_size == 128256
    assert get_model_config("tiny", 4096).vocab_size == 4096
    with pytest.raises(ValueError, match="unknown model preset"):
        get_model_config("nope", 10)
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int3", CPU)
    assert resolve_dtype("auto", CPU) == torch.float32


@torch.inference_mode()
def test_prefill_rejects_out_of_range(model):
    with pytest.raises(ValueError, match="outside"):
        model.prefill(model.embed(_tokens(10)), slot=0, start=90)
    with pytest.raises(ValueError, match="slot"):
        model.prefill(model.embed(_tokens(3)), slot=6, start=0)


# -- vision ------------------------------------------------------------------


@pytest.fixture(scope="module")
def encoder():
    return build_vision_encoder(64, 128, image_tokens=16, device=CPU, dtype=torch.float32, seed=1)


def _image(seed: int, size=(64, 48)) -> Image.Image:
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(arr)


@torch.inference_mode()
def test_vision_embeddings_depend_on_pixels(encoder):
    a, b = encoder.encode(_image(0)), encoder.encode(_image(1))
    assert a.shape == (16, 128) and torch.isfinite(a).all()
    assert not torch.allclose(a, b)
    torch.testing.assert_close(encoder.encode(_image(0)), a)


@torch.inference_mode()
def test_vision_accepts_tensors_arrays_and_modes(encoder):
    pv = torch.randn(1, 3, 40, 30)
    ref = encoder.encode({"pixel_values": pv})
    assert ref.shape == (16, 128)
    # bf16 and 3-D inputs; a read-only numpy array (as a codec may deliver it)
    bf = encoder.encode({"pixel_values": pv[0].to(torch.bfloat16)})
    torch.testing.assert_close(bf, ref, atol=0.05, rtol=0.05)
    arr = pv.numpy().astype(np.float16)
    arr.flags.writeable = False
    torch.testing.assert_close(encoder.encode({"pixel_values": arr}), ref, atol=0.05, rtol=0.05)
    assert encoder.encode(_image(2).convert("L")).shape == (16, 128)
    assert to_pixels({"pixel_values": np.zeros((3, 4, 4), np.uint8)}).dtype == torch.float32


@pytest.mark.parametrize(
    "bad, match",
    [
        ("not an image", "PIL image or a dict"),
        ({"pixels": 1}, "pixel_values"),
        ({"pixel_values": [1, 2]}, "torch.Tensor or numpy"),
        ({"pixel_values": torch.zeros(2, 3, 8, 8)}, "shape"),
        ({"pixel_values": torch.zeros(4, 8, 8)}, "shape"),
        ({"pixel_values": torch.zeros(3, 8, 8, dtype=torch.int32)}, "dtype"),
        ({"pixel_values": np.zeros((3, 0, 8), np.float32)}, "spatial size"),
    ],
)
def test_vision_rejects_bad_inputs(bad, match):
    with pytest.raises(ValueError, match=match):
        check_mm_input(bad)


# -- sampler -------------------------------------------------------------------


def _logits(n: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_greedy_is_argmax_and_top_k_1_is_greedy():
    s = Sampler(50, seed=0, device=CPU)
    logits = _logits(8)
    greedy = s.sample(logits, [SampleRow(SamplingParams(temperature=0.0))] * 8)
    assert greedy == logits.argmax(-1).tolist()
    assert s.sample(logits, [SampleRow(SamplingParams(temperature=1.0, top_k=1))] * 8) == greedy
    assert s.sample(logits, [SampleRow(SamplingParams(temperature=0.8, top_p=1e-6))] * 8) == greedy
    assert s.sample(logits, [SampleRow(SamplingParams(temperature=1.5, min_p=1.0))] * 8) == greedy


def test_seeded_request_is_independent_of_batch():
    row = _logits(1, seed=5)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=1234)

    def draws(batch_of: int, position: int) -> list[int]:
        s = Sampler(50, seed=99, device=CPU)
        gen = s.request_generator(params)
        out = []
        for step in range(15):
            logits = _logits(batch_of, seed=step)
            logits[position] = row[0]
            rows = [
                SampleRow(
                    SamplingParams(temperature=1.0, seed=step if i % 2 else None),
                    s.request_generator(SamplingParams(temperature=1.0, seed=step)) if i % 2 else None,
                )
                for i in range(batch_of)
            ]
            rows[position] = SampleRow(params, gen)
            out.append(s.sample(logits, rows)[position])
        return out

    alone = draws(1, 0)
    assert draws(5, 3) == alone == draws(4, 0)
    assert len(set(alone)) > 1  # actually random


def test_unseeded_sampling_follows_engine_seed():
    logits = _logits(6)
    rows = [SampleRow(SamplingParams(temperature=1.0))] * 6
    a = [Sampler(50, seed=3, device=CPU).sample(logits, rows) for _ in range(2)]
    assert a[0] == a[1]
    s = Sampler(50, seed=3, device=CPU)
    many = {tuple(s.sample(logits, rows)) for _ in range(10)}
    assert len(many) > 1


def test_filters_restrict_support():
    s = Sampler(50, seed=0, device=CPU)
    logits = _logits(1, seed=7)
    top5 = set(logits[0].topk(5).indices.tolist())
    rows = [SampleRow(SamplingParams(temperature=2.0, top_k=5))]
    assert all(s.sample(logits, rows)[0] in top5 for _ in range(50))
    probs = logits[0].softmax(-1)
    keep = {i for i, p in enumerate(probs.tolist()) if p >= 0.2 * probs.max().item()}
    rows = [SampleRow(SamplingParams(temperature=1.0, min_p=0.2))]
    assert all(s.sample(logits, rows)[0] in keep for _ in range(50))


def test_suppressed_ids_and_vocab_limit():
    s = Sampler(10, seed=0, device=CPU)
    logits = torch.zeros(1, 16)
    logits[0, 12] = 100.0  # beyond the tokenizer vocab: never picked
    logits[0, 3] = 50.0
    logits[0, 7] = 40.0
    assert s.sample(logits, [SampleRow(SamplingParams(temperature=0.0))]) == [3]
    assert s.sample(logits, [SampleRow(SamplingParams(temperature=0.0), suppress_token_ids=[3])]) == [7]
    with pytest.raises(ValueError, match="rows"):
        s.sample(logits, [])


def test_rows_with_non_finite_probabilities_fall_back_to_greedy():
    s = Sampler(50, seed=0, device=CPU)
    logits = _logits(4)
    logits[0, 5] = float("inf")  # softmax -> NaN
    logits[2, 9] = float("nan")
    logits[2, 11] = 30.0  # the greedy pick once NaN is ignored
    logits[3, 4], logits[3, 6] = 3e38, 2e38  # / temperature overflows float32 to inf
    rows = [
        SampleRow(SamplingParams(temperature=1.0)),
        SampleRow(SamplingParams(temperature=1.0)),
        SampleRow(
            SamplingParams(temperature=0.7, top_k=10, seed=7),
            s.request_generator(SamplingParams(temperature=0.7, seed=7)),
        ),
        SampleRow(SamplingParams(temperature=0.01, top_p=0.9)),
    ]
    picks = s.sample(logits, rows)
    assert picks[0] == 5 and picks[2] == 11 and picks[3] == 4
    assert 0 <= picks[1] < 50  # the healthy row is still sampled


def test_seeded_row_ignores_other_rows_filters():
    """A seeded request samples the same token alone or beside a top-k row."""
    from harness.engine.sampler import Sampler, SampleRow

    sampler = Sampler(512, 0, torch.device("cpu"))
    logits = torch.randn(2, 512, generator=torch.Generator().manual_seed(1))
    other = SampleRow(SamplingParams(temperature=1.0, top_k=5))
    for seed in range(20):
        params = SamplingParams(temperature=1.0, seed=seed)
        alone = sampler.sample(logits[:1].clone(), [SampleRow(params, sampler.request_generator(params))])[0]
        mixed = sampler.sample(logits.clone(), [SampleRow(params, sampler.request_generator(params)), other])[0]
        assert alone == mixed


# -- logit bias and penalties ---------------------------------------------------


def _greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, **kw)


def test_logit_bias_forces_a_token_under_greedy():
    s = Sampler(50, seed=0, device=CPU)
    logits = _logits(3)
    plain = logits.argmax(-1).tolist()
    target = (plain[0] + 1) % 50
    bias = {target: 100.0, 10_000: 100.0, -1: 100.0}  # ids outside the vocab are ignored
    rows = [
        SampleRow(_greedy(logit_bias=bias)),
        SampleRow(_greedy()),
        SampleRow(_greedy(logit_bias={plain[2]: -100.0})),
    ]
    before = logits.clone()
    picks = s.sample(logits, rows)
    assert picks[0] == target
    assert picks[1] == plain[1]  # the row without a bias is untouched
    assert picks[2] != plain[2]  # a negative bias bans the argmax
    assert torch.equal(logits, before)  # the caller's logits are not modified
    # A bias also steers temperature sampling.
    assert all(
        s.sample(logits[:1], [SampleRow(SamplingParams(temperature=1.0, logit_bias=bias))]) == [target]
        for _ in range(5)
    )


def test_repetition_penalty_moves_argmax_off_a_repeated_token():
    s = Sampler(10, seed=0, device=CPU)
    logits = torch.zeros(2, 10)
    logits[0, 3], logits[0, 7] = 3.0, 1.99  # positive: 3.0 / 1.5 = 2.0, still ahead of 1.99
    logits[1, 3], logits[1, 7] = -1.0, -1.49  # negative: -1.0 * 1.5 = -1.5, now behind -1.49
    logits[1, [0, 1, 2, 4, 5, 6, 8, 9]] = -5.0

    def pick(row: int, p: float, prompt=(), output=()) -> int:
        r = SampleRow(_greedy(repetition_penalty=p), prompt_token_ids=list(prompt), output_token_ids=list(output))
        return s.sample(logits[row : row + 1], [r])[0]

    assert pick(0, 1.5, output=[3]) == 3  # divided: 2.0 > 1.99
    logits[0, 7] = 2.01
    assert pick(0, 1.5) == 3  # not seen: no penalty
    assert pick(0, 1.5, output=[3, 3, 3]) == 7  # applied once, whatever the count
    assert pick(0, 1.5, prompt=[3]) == 7  # the prompt counts too (vLLM/HF semantics)
    assert pick(1, 1.5, prompt=[3]) == 7  # multiplied: -1.5 < -1.49
    assert pick(1, 1.5, prompt=[1]) == 3
    assert pick(0, 0.5, prompt=[7], output=[]) == 7  # p < 1 favours seen tokens


def test_presence_and_frequency_penalties_lower_repeated_output_tokens():
    s = Sampler(10, seed=0, device=CPU)
    logits = torch.zeros(1, 10)
    logits[0, 3], logits[0, 7] = 5.0, 4.45

    def pick(prompt=(), output=(), **kw) -> int:
        r = SampleRow(_greedy(**kw), prompt_token_ids=list(prompt), output_token_ids=list(output))
        return s.sample(logits, [r])[0]

    assert pick(output=[3], presence_penalty=0.5) == 3  # 4.5 > 4.45
    assert pick(output=[3], presence_penalty=0.6) == 7  # 4.4 < 4.45
    assert pick(output=[3, 3, 3], presence_penalty=0.5) == 3  # presence ignores the count
    assert pick(output=[3, 3], frequency_penalty=0.25) == 3  # 5 - 0.5 = 4.5
    assert pick(output=[3, 3, 3], frequency_penalty=0.25) == 7  # 5 - 0.75 = 4.25
    assert pick(output=[3], presence_penalty=0.3, frequency_penalty=0.3) == 7  # both: 4.4
    assert pick(prompt=[3, 3, 3], presence_penalty=2.0, frequency_penalty=2.0) == 3  # output tokens only
    assert pick(output=[7], presence_penalty=-1.0) == 7  # negative values encourage repeats


def test_penalty_rows_batch_with_default_and_seeded_rows():
    s = Sampler(50, seed=0, device=CPU)
    logits = _logits(4, seed=3)
    top = logits.argmax(-1).tolist()
    seeded = SamplingParams(temperature=1.0, seed=5, frequency_penalty=100.0)
    rows = [
        SampleRow(_greedy()),
        SampleRow(_greedy(presence_penalty=100.0), output_token_ids=[top[1]]),
        SampleRow(seeded, s.request_generator(seeded), output_token_ids=list(range(49))),
        SampleRow(_greedy(repetition_penalty=1.2, logit_bias={0: 1.0}), prompt_token_ids=[0, 1]),
    ]
    picks = s.sample(logits, rows)
    assert picks[0] == top[0]
    assert picks[1] != top[1]
    assert picks[2] == 49  # every other id is penalised out of reach
    ref = logits[3].clone()
    ref[0] += 1.0
    ref[:2] = torch.where(ref[:2] > 0, ref[:2] / 1.2, ref[:2] * 1.2)
    assert picks[3] == int(ref.argmax())


def test_default_rows_never_touch_the_penalty_path(monkeypatch):
    """Default params: same tokens with or without history, and no bias/penalty work at all."""

    def fresh_rows(s: Sampler, with_history: bool) -> list[SampleRow]:
        hist: dict[str, Any] = dict(prompt_token_ids=[1, 2, 3], output_token_ids=[4, 4]) if with_history else {}
        kinds = [
            _greedy(),
            SamplingParams(temperature=1.0),
            SamplingParams(temperature=0.8, top_k=7),
            SamplingParams(temperature=1.0, seed=11),
            SamplingParams(temperature=0.9, top_p=0.7, seed=3),
            SamplingParams(temperature=1.2, min_p=0.05, logit_bias={}),
        ]
        return [SampleRow(p, s.request_generator(p), [4] if i == 0 else None, **hist) for i, p in enumerate(kinds)]

    def draws(with_history: bool) -> list[list[int]]:
        s = Sampler(50, seed=7, device=CPU)  # a fresh engine generator per run
        rows = fresh_rows(s, with_history)
        return [s.sample(_logits(6, seed=step), rows) for step in range(4)]

    def run() -> list[list[int]]:
        a = draws(False)
        assert draws(True) == a
        return a

    expected = run()

    def boom(*args, **kwargs):
        raise AssertionError("default rows must not reach the bias/penalty code")

    monkeypatch.setattr(Sampler, "_with_logit_bias", boom)
    monkeypatch.setattr(Sampler, "_with_penalties", boom)
    monkeypatch.setattr(Sampler, "_flat_bins", boom)
    assert run() == expected
