"""Workloads (sonnet, random, images), the corpus, and data-URL image decoding."""

from __future__ import annotations

import argparse
import base64
import importlib.util
import io
import statistics
from pathlib import Path

import pytest
from PIL import Image

from harness.frontend.images import decode_data_url
from harness.tokenizers.tokenizer import TextTokenizer, load_tokenizer
from harness.workloads.chat import chat_prompt_len
from harness.workloads.custom import sample_custom_requests
from harness.workloads.datasets import add_dataset_arguments, build_workload
from harness.workloads.images import synthetic_image, to_data_url
from harness.workloads.random_dataset import RandomOptions, sample_random_requests
from harness.workloads.sample import SampleRequest
from harness.workloads.sharegpt import sample_sharegpt_requests
from harness.workloads.sonnet import (
    EMBEDDED_SONNETS,
    SONNET_BASE_PROMPT,
    SonnetOptions,
    plan_sonnet,
    read_poem_lines,
    sample_sonnet_requests,
)
from harness.workloads.spec import WorkloadSpec
from harness.workloads.trace import sample_trace_requests

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_SONNET = Path("/work/shared/reference/sonnet.txt")


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def parse(*argv: str) -> WorkloadSpec:
    """The workload the dataset flags describe, read once as the commands read it."""
    parser = argparse.ArgumentParser()
    add_dataset_arguments(parser)
    return WorkloadSpec.from_args(parser.parse_args(list(argv)))


# -- corpus -------------------------------------------------------------------


def test_corpus_shape() -> None:
    lines = EMBEDDED_SONNETS.read_text(encoding="utf-8").splitlines()
    assert len(lines) >= 500 and len(lines) % 14 == 0
    assert all(line.strip() for line in lines)
    words = [len(line.split()) for line in lines]
    assert min(words) >= 7 and max(words) <= 13
    assert 8 <= statistics.mean(words) <= 12


def test_committed_corpus_is_what_the_script_writes() -> None:
    spec = importlib.util.spec_from_file_location("write_corpus", ROOT / "scripts" / "write_corpus.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.corpus() == EMBEDDED_SONNETS.read_text(encoding="utf-8")


@pytest.mark.skipif(not REFERENCE_SONNET.is_file(), reason="reference sonnet.txt not present")
def test_corpus_shares_no_line_with_the_reference() -> None:
    ours = {line.strip().lower() for line in read_poem_lines()}
    theirs = {line.strip().lower() for line in read_poem_lines(REFERENCE_SONNET)}
    assert not ours & theirs


# -- sonnet ---------------------------------------------------------------------


def test_sonnet_prompts_share_base_and_prefix(tok: TextTokenizer) -> None:
    lines = read_poem_lines()
    plan = plan_sonnet(tok, lines)
    assert plan.num_prefix_lines > 0
    prefix = SONNET_BASE_PROMPT + "".join(lines[: plan.num_prefix_lines])
    reqs = sample_sonnet_requests(tok, 40, seed=1)
    assert len(reqs) == 40
    for r in reqs:
        assert isinstance(r, SampleRequest)
        assert r.prompt.startswith(prefix)
        body = r.prompt[len(SONNET_BASE_PROMPT) :]
        assert body.count("\n") == plan.num_input_lines
        assert r.expected_output_len == 150 and r.image_data_urls == ()
    assert len({r.prompt for r in reqs}) == 40


def test_sonnet_lengths_near_target(tok: TextTokenizer) -> None:
    lines = read_poem_lines()
    plan = plan_sonnet(tok, lines)
    reqs = sample_sonnet_requests(tok, 100, seed=0)
    lens = [r.prompt_len for r in reqs]
    # vLLM's arithmetic lands near the target, not on it (line-count rounding,
    # a fixed prefix whose lines are not exactly average).
    assert abs(statistics.mean(lens) - 550) <= 11
    prefix_tokens = len(tok.encode("".join(lines[: plan.num_prefix_lines])))
    expected = plan.base_offset + prefix_tokens + (plan.num_input_lines - plan.num_prefix_lines) * plan.avg_line_len
    assert abs(statistics.mean(lens) - expected) <= 3
    # prompt_len is the chat-formatted count with the server's tokenizer.
    assert all(r.prompt_len == chat_prompt_len(tok, r.prompt) for r in reqs[:5])


def test_sonnet_seed_determinism(tok: TextTokenizer) -> None:
    a = sample_sonnet_requests(tok, 10, seed=3)
    b = sample_sonnet_requests(tok, 10, seed=3)
    c = sample_sonnet_requests(tok, 10, seed=4)
    assert a == b
    assert [r.prompt for r in a] != [r.prompt for r in c]


def test_sonnet_custom_lengths(tok: TextTokenizer) -> None:
    reqs = sample_sonnet_requests(tok, 20, input_len=300, output_len=7, prefix_len=0)
    assert abs(statistics.mean(r.prompt_len for r in reqs) - 300) <= 12
    assert all(r.expected_output_len == 7 for r in reqs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"input_len": 15, "prefix_len": 0}, "greater than the base prompt"),
        ({"input_len": 200, "prefix_len": 200}, "must be smaller"),
        ({"input_len": 200, "prefix_len": 300}, "must be smaller"),
        ({"prefix_len": -1}, ">= 0"),
        ({"output_len": 0}, "output-len"),
        ({"input_len": 100_000, "prefix_len": 90_000}, "has only"),
    ],
)
def test_sonnet_bad_settings(tok: TextTokenizer, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sample_sonnet_requests(tok, 2, **kwargs)


def test_sonnet_dataset_path(tok: TextTokenizer, tmp_path: Path) -> None:
    custom = tmp_path / "poems.txt"
    custom.write_text("".join(f"A short original line number {i} of this little test\n" for i in range(60)) + "\n")
    reqs = sample_sonnet_requests(tok, 5, dataset_path=custom)
    assert all("little test" in r.prompt for r in reqs)
    with pytest.raises(FileNotFoundError):
        sample_sonnet_requests(tok, 1, dataset_path=tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="no lines"):
        sample_sonnet_requests(tok, 1, dataset_path=empty)


@pytest.mark.skipif(not REFERENCE_SONNET.is_file(), reason="reference sonnet.txt not present")
def test_reference_file_through_dataset_path(tok: TextTokenizer) -> None:
    args = parse("--dataset-path", str(REFERENCE_SONNET), "--num-prompts", "20")
    reqs = build_workload(args, tok)
    assert len(reqs) == 20
    assert all(r.prompt.startswith(SONNET_BASE_PROMPT) for r in reqs)
    assert abs(statistics.mean(r.prompt_len for r in reqs) - 550) <= 30


# -- random ---------------------------------------------------------------------


def test_random_lengths_in_range(tok: TextTokenizer) -> None:
    reqs = sample_random_requests(tok, 30, input_len=200, output_len=40, range_ratio=0.25, seed=5)
    assert all(150 - 2 <= r.prompt_len <= 250 + 2 for r in reqs)
    assert all(30 <= r.expected_output_len <= 50 for r in reqs)
    assert len({r.expected_output_len for r in reqs}) > 1
    # prompt_len is the actual length of the text, re-tokenized.
    assert all(r.prompt_len == len(tok.encode(r.prompt)) for r in reqs)


def test_random_fixed_length_and_determinism(tok: TextTokenizer) -> None:
    a = sample_random_requests(tok, 10, input_len=128, output_len=16, seed=9)
    assert all(abs(r.prompt_len - 128) <= 2 for r in a)
    assert all(r.expected_output_len == 16 for r in a)
    assert a == sample_random_requests(tok, 10, input_len=128, output_len=16, seed=9)
    assert a != sample_random_requests(tok, 10, input_len=128, output_len=16, seed=10)


def test_random_bad_settings(tok: TextTokenizer) -> None:
    with pytest.raises(ValueError, match="range-ratio"):
        sample_random_requests(tok, 1, range_ratio=1.0)
    with pytest.raises(ValueError, match="num-prompts"):
        sample_random_requests(tok, 0)


@pytest.mark.parametrize(
    ("sample", "flag"),
    [
        (sample_custom_requests, "--custom-output-len"),
        (sample_sharegpt_requests, "--sharegpt-output-len"),
        (sample_trace_requests, None),
    ],
    ids=["custom", "sharegpt", "trace"],
)
def test_file_datasets_refuse_counts_below_one_before_reading(tok: TextTokenizer, sample, flag) -> None:
    """The shared count checks run first: no file is needed to be told which flag is wrong."""
    missing = "/nonexistent/dataset.jsonl"
    with pytest.raises(ValueError, match=r"^--num-prompts must be >= 1, got 0$"):
        sample(tok, 0, dataset_path=missing)
    if flag is not None:
        with pytest.raises(ValueError, match=rf"^{flag} must be >= 1, got 0$"):
            sample(tok, 1, output_len=0, dataset_path=missing)


# -- images ---------------------------------------------------------------------


def test_image_workload(tok: TextTokenizer) -> None:
    args = parse(
        "--num-prompts",
        "3",
        "--images-per-request",
        "2",
        "--image-width",
        "64",
        "--image-height",
        "48",
        "--image-format",
        "jpeg",
        "--seed",
        "11",
    )
    reqs = build_workload(args, tok)
    urls = [u for r in reqs for u in r.image_data_urls]
    assert len(urls) == 6 and len(set(urls)) == 6
    for url in urls:
        assert url.startswith("data:image/jpeg;base64,")
        img = decode_data_url(url, max_bytes=1 << 20)
        assert img.size == (64, 48) and img.format == "JPEG"
    for r in reqs:
        assert r.prompt_len == chat_prompt_len(tok, r.prompt, r.image_data_urls)
    assert build_workload(args, tok) == reqs
    with pytest.raises(ValueError, match="sonnet"):
        build_workload(parse("--dataset-name", "random", "--images-per-request", "1"), tok)


def test_synthetic_images_differ_and_png_round_trips() -> None:
    a, b = synthetic_image(80, 60, 1), synthetic_image(80, 60, 2)
    assert a.size == (80, 60) and a.mode == "RGB"
    assert a.tobytes() != b.tobytes()
    assert synthetic_image(80, 60, 1).tobytes() == a.tobytes()
    decoded = decode_data_url(to_data_url(a, "png"))
    assert decoded.format == "PNG" and decoded.tobytes() == a.tobytes()
    with pytest.raises(ValueError):
        to_data_url(a, "gif")
    with pytest.raises(ValueError):
        synthetic_image(0, 10, 1)


def _png_b64(size: tuple[int, int] = (8, 8)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("garbage", "not a data URL"),
        ("https://example.com/cat.png", "not a data URL"),
        ("data:text/plain;base64,aGVsbG8=", "image/"),
        ("data:image/png,rawbytes", "base64"),
        ("data:image/png;base64,!!!not base64!!!", "not valid base64"),
        ("data:image/png;base64,", "empty"),
        ("data:image/png;base64," + base64.b64encode(b"hello, not an image").decode(), "not a readable image"),
        ("data:image/png;base64," + _png_b64()[:60], "not valid base64|could not be decoded|not a readable"),
    ],
)
def test_decode_data_url_rejects_bad_input(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_data_url(url)


def test_decode_data_url_limits() -> None:
    url = "data:image/png;base64," + _png_b64((64, 64))
    assert decode_data_url(url).size == (64, 64)
    with pytest.raises(ValueError, match="too large"):
        decode_data_url(url, max_bytes=50)
    with pytest.raises(ValueError, match="too large"):
        decode_data_url("data:image/png;base64," + "A" * 4_000_000, max_bytes=1000)
    with pytest.raises(ValueError, match="pixels"):
        decode_data_url(url, max_pixels=32 * 32)
    with pytest.raises(ValueError):
        decode_data_url(None)


# -- CLI glue -------------------------------------------------------------------


def test_cli_defaults_build_a_sonnet_workload(tok: TextTokenizer) -> None:
    args = parse("--num-prompts", "4")
    assert (args.dataset_name, args.seed, args.images_per_request) == ("sonnet", 0, 0)
    assert args.options == SonnetOptions(sonnet_input_len=550, sonnet_output_len=150, sonnet_prefix_len=200)
    assert parse("--dataset-name", "random").options == RandomOptions(
        random_input_len=1024, random_output_len=128, random_range_ratio=0.0
    )
    assert len(build_workload(args, tok)) == 4
    rand = build_workload(parse("--dataset-name", "random", "--num-prompts", "2", "--random-input-len", "64"), tok)
    assert len(rand) == 2 and all(abs(r.prompt_len - 64) <= 2 for r in rand)


def test_a_workload_records_the_flat_keys_of_its_flags() -> None:
    """Run files keep one flat key per flag (metadata.flags), a dataset's own among them."""
    record = parse("--sonnet-input-len", "300", "--seed", "2").record()
    assert record == {
        **{"dataset_name": "sonnet", "dataset_path": None, "num_prompts": 1000, "images_per_request": 0},
        **{"image_width": 512, "image_height": 512, "image_format": "png", "image_reuse": 0.0},
        **{"seed": 2, "tokenizer": None},
        **{"sonnet_input_len": 300, "sonnet_output_len": 150, "sonnet_prefix_len": 200},
    }
    assert parse("--dataset-name", "random").record()["random_range_ratio"] == 0.0
    with pytest.raises(ValueError, match="random_input_len"):
        parse().with_options(random_input_len=5)
    with pytest.raises(ValueError, match="RandomOptions"):
        WorkloadSpec(options=RandomOptions())  # sonnet's spec with random's settings


@pytest.mark.parametrize(
    "argv",
    [
        ["--num-prompts", "0"],
        ["--random-range-ratio", "1.5"],
        ["--image-format", "gif"],
        ["--dataset-name", "no-such-dataset"],
        ["--images-per-request", "-1"],
    ],
)
def test_cli_rejects_bad_flags(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)
    assert "error" in capsys.readouterr().err
