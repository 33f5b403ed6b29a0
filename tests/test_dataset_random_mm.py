"""random-mm (random prompts with images of drawn counts and sizes) and --image-reuse (images that
repeat earlier ones, byte for byte). Every draw is seeded: the counted shares are fixed numbers, the
bounds around them only say how far a seed may land from the probability."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.like_for_like import arm_differences, compared_settings
from harness.analysis.runs import RunEntry
from harness.analysis.verdicts import Arm
from harness.frontend.images import decode_data_url
from harness.tokenizers.tokenizer import TextTokenizer, load_tokenizer
from harness.workloads.chat import chat_prompt_len
from harness.workloads.datasets import add_dataset_arguments, build_workload
from harness.workloads.images import ImageSpec, draw_image_urls, make_image_urls, plan_reuse
from harness.workloads.random_dataset import RandomOptions, sample_random_requests
from harness.workloads.random_mm import (
    DEFAULT_BUCKETS,
    RandomMMOptions,
    draw_image_sizes,
    parse_bucket_config,
    parse_limit,
)
from harness.workloads.spec import WorkloadSpec

SMALL = "{(16, 24, 1): 0.5, (32, 32, 1): 0.5}"  # (height, width, frames): tiny images, quick to make


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_dataset_arguments(p)
    return p


def parse(*argv: str) -> WorkloadSpec:
    return WorkloadSpec.from_args(parser().parse_args(["--dataset-name", "random-mm", *argv]))


def repeated_share(urls_per_request: list[tuple[str, ...]]) -> float:
    """The share of images whose bytes an earlier image already carried."""
    seen: set[str] = set()
    repeats = total = 0
    for urls in urls_per_request:
        for url in urls:
            repeats += url in seen
            total += 1
        seen.update(urls)
    return repeats / total


# -- the flags ----------------------------------------------------------------------------------


def test_bucket_config_parses_vllm_forms_and_normalises() -> None:
    assert parse_bucket_config("{(256, 256, 1): 0.5, (720, 1280, 1): 0.5}") == DEFAULT_BUCKETS
    # JSON's string keys, weights that are not probabilities, a zero-chance video bucket (vLLM's default).
    parsed = parse_bucket_config('{"(10, 20, 1)": 1, (30, 40, 1): 3, (720, 1280, 16): 0.0}')
    assert list(parsed) == [((10, 20, 1), 0.25), ((30, 40, 1), 0.75)]
    assert parsed.sizes() == [(20, 10), (40, 30)]  # (width, height): keys are (height, width, frames)
    assert parse_bucket_config(str(parsed)) == parsed  # it prints as the flag takes it
    assert str(DEFAULT_BUCKETS) == "{(256, 256, 1): 0.5, (720, 1280, 1): 0.5}"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{(256, 256): 1.0}", "three integers"),
        ("{(256, 256, 16): 1.0}", "video"),
        ("{(256, 256, 1): -0.5}", ">= 0"),
        ("{(256, 256, 1): 0}", "above 0"),
        ("{(0, 256, 1): 1}", ">= 1"),
        ("{(8, 8, 1): 'half'}", "number"),
        ("[(256, 256, 1), 1.0]", "pair"),
        ("{}", "above 0"),
        ("256x256", "is not a dict"),
    ],
)
def test_a_bad_bucket_config_is_refused_naming_the_flag(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse("--random-mm-bucket-config", value)
    err = capsys.readouterr().err
    assert "argument --random-mm-bucket-config" in err and message in err


def test_the_limit_takes_a_number_or_vllms_dict(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_limit("3") == 3 and parse_limit('{"image": 3, "video": 0}') == 3
    for bad, message in [("{'video': 1}", '"image"'), ("{'image': 2, 'text': 1}", "text"), ("-1", ">= 0")]:
        with pytest.raises(SystemExit):
            parse("--random-mm-limit-mm-per-prompt", bad)
        err = capsys.readouterr().err
        assert "argument --random-mm-limit-mm-per-prompt" in err and message in err
    for flag, bad in [("--random-mm-num-mm-items-range-ratio", "1.5"), ("--image-reuse", "2")]:
        with pytest.raises(SystemExit):
            parse(flag, bad)
        assert f"argument {flag}" in capsys.readouterr().err


def test_random_mm_shares_randoms_text_flags_and_records_its_own() -> None:
    help_text = parser().format_help()
    # Once, as any other flag: in the usage and in the list.
    assert help_text.count("--random-input-len") == help_text.count("--sonnet-input-len") == 2
    spec = parse("--random-input-len", "16", "--random-mm-bucket-config", SMALL, "--image-reuse", "0.25")
    assert spec.options.random_input_len == 16 and spec.has_images
    record = spec.record()
    assert record["random_input_len"] == 16 and record["image_reuse"] == 0.25
    assert json.loads(json.dumps(record))["random_mm_bucket_config"] == [[[16, 24, 1], 0.5], [[32, 32, 1], 0.5]]
    assert {"image_reuse", "random_mm_bucket_config", "random_mm_limit_mm_per_prompt"} <= set(compared_settings())
    # The plain random dataset keeps its own options, and refuses random-mm's.
    plain = WorkloadSpec.from_args(parser().parse_args(["--dataset-name", "random", "--random-input-len", "16"]))
    assert plain.options == RandomOptions(random_input_len=16) and not plain.has_images
    with pytest.raises(ValueError, match="RandomMMOptions"):
        WorkloadSpec(dataset_name="random", options=RandomMMOptions())


def test_two_runs_with_different_reuse_are_not_compared() -> None:
    def arm(label: str, spec: WorkloadSpec) -> Arm:
        flags = json.loads(json.dumps(spec.record()))  # as a run file holds them
        return Arm(label, [RunEntry(label, 0, "ok", "", None, {"metadata": {"flags": flags}})])

    a, b = parse("--image-reuse", "0"), parse("--image-reuse", "0.5")
    assert arm_differences([arm("a", a), arm("b", b)]) == ["b: image_reuse: a 0.0, b 0.5"]
    c = parse("--random-mm-bucket-config", "{(16, 24, 1): 1}")
    assert [d.split(":")[1] for d in arm_differences([arm("a", a), arm("c", c)])] == [" random_mm_bucket_config"]
    # A run file from before --image-reuse repeated no image.
    older = Arm("older", [RunEntry("older", 0, "ok", "", None, {"metadata": {"flags": {"dataset_name": "random-mm"}}})])
    assert arm_differences([older, arm("b", b)]) == ["b: image_reuse: older 0.0, b 0.5"]


# -- items per request and their sizes --------------------------------------------------------


def test_items_per_request_are_uniform_in_the_range_under_the_limit() -> None:
    # n=4, r=0.5: [2, 6]; the limit 5 cuts the top.
    options = RandomMMOptions(random_mm_base_items_per_request=4, random_mm_num_mm_items_range_ratio=0.5)
    assert options.item_range == (2, 6)
    limited = RandomMMOptions(
        random_mm_base_items_per_request=4, random_mm_num_mm_items_range_ratio=0.5, random_mm_limit_mm_per_prompt=5
    )
    counts = Counter(len(sizes) for sizes in draw_image_sizes(limited, 4000, seed=3))
    assert sorted(counts) == [2, 3, 4, 5]
    assert all(abs(n / 4000 - 0.25) < 0.03 for n in counts.values())  # about 5 standard errors
    assert RandomMMOptions(random_mm_base_items_per_request=3).item_range == (3, 3)
    assert RandomMMOptions(random_mm_base_items_per_request=1, random_mm_num_mm_items_range_ratio=1).item_range == (
        0,
        2,
    )
    assert not RandomMMOptions(random_mm_base_items_per_request=0).has_images
    too_few = RandomMMOptions(random_mm_base_items_per_request=4, random_mm_limit_mm_per_prompt=2)
    with pytest.raises(ValueError, match="--random-mm-limit-mm-per-prompt 2"):
        _ = too_few.item_range


def test_bucket_sizes_are_drawn_with_their_probabilities() -> None:
    buckets = parse_bucket_config("{(8, 8, 1): 0.2, (16, 8, 1): 0.3, (8, 16, 1): 0.5}")
    options = RandomMMOptions(random_mm_base_items_per_request=2, random_mm_bucket_config=buckets)
    drawn = Counter(size for sizes in draw_image_sizes(options, 5000, seed=7) for size in sizes)
    assert sum(drawn.values()) == 10_000
    for (width, height), p in zip(buckets.sizes(), buckets.probabilities()):
        assert abs(drawn[(width, height)] / 10_000 - p) < 0.025  # about 5 standard errors
    with pytest.raises(ValueError, match="--random-mm-bucket-config: .*video"):
        draw_image_sizes(RandomMMOptions(random_mm_bucket_config={(8, 8, 4): 1.0}), 1, 0)  # type: ignore[arg-type]


def test_random_mm_requests_carry_their_drawn_images(tok: TextTokenizer) -> None:
    spec = parse(
        *("--num-prompts", "12", "--random-input-len", "24", "--random-output-len", "5", "--seed", "5"),
        *("--random-mm-base-items-per-request", "2", "--random-mm-num-mm-items-range-ratio", "0.5"),
        *("--random-mm-bucket-config", SMALL, "--image-format", "jpeg"),
    )
    requests = build_workload(spec, tok)
    sizes = draw_image_sizes(spec.options, 12, seed=5)
    assert [len(r.image_data_urls) for r in requests] == [len(s) for s in sizes]
    assert all(1 <= len(r.image_data_urls) <= 3 for r in requests)
    for r, want in zip(requests, sizes):
        images = [decode_data_url(url) for url in r.image_data_urls]
        assert [img.size for img in images] == want and all(img.format == "JPEG" for img in images)
        assert r.prompt_len == chat_prompt_len(tok, r.prompt, r.image_data_urls)
        assert r.expected_output_len == 5
    # The text is the random dataset's, for the same seed and flags.
    text = sample_random_requests(tok, 12, input_len=24, output_len=5, seed=5)
    assert [r.prompt for r in requests] == [r.prompt for r in text]
    with pytest.raises(ValueError, match="--images-per-request needs"):
        build_workload(parse("--images-per-request", "1"), tok)


def test_the_same_seed_gives_the_same_requests(tok: TextTokenizer) -> None:
    argv = ["--num-prompts", "6", "--random-input-len", "16", "--random-mm-bucket-config", SMALL]
    argv += ["--random-mm-num-mm-items-range-ratio", "1", "--image-reuse", "0.5"]
    first = build_workload(parse(*argv, "--seed", "9"), tok)
    assert build_workload(parse(*argv, "--seed", "9"), tok) == first
    assert build_workload(parse(*argv, "--seed", "10"), tok) != first


# -- --image-reuse ------------------------------------------------------------------------------


@pytest.mark.parametrize("reuse", [0.0, 0.5, 1.0])
def test_the_share_of_repeated_images_is_the_reuse_probability(reuse: float) -> None:
    # 1000 requests of 2 same-sized images: only the first request's two find nothing to repeat.
    plan = plan_reuse([[(8, 8)] * 2] * 1000, reuse, seed=1)
    flat = [image for chosen in plan for image in chosen]
    share = sum(image != slot for slot, image in enumerate(flat)) / len(flat)
    assert abs(share - reuse) < 0.03  # 0.5: about 3 standard errors; 0 and 1: exact but for 2 images
    assert all(len(set(chosen)) == len(chosen) for chosen in plan)  # never twice in one request


@pytest.mark.parametrize("reuse", [0.0, 0.5, 1.0])
def test_repeated_images_are_the_same_bytes_of_an_earlier_request(reuse: float) -> None:
    # Two sizes, as random-mm draws them: an image repeats one of its own size.
    sizes = [[(8, 8), (12, 6)] if i % 2 else [(8, 8)] for i in range(300)]
    urls = draw_image_urls(sizes, "png", seed=4, reuse=reuse)
    assert abs(repeated_share(urls) - reuse) < 0.06
    by_url = {url: decode_data_url(url).size for request in urls for url in request}
    assert all([by_url[u] for u in request] == want for request, want in zip(urls, sizes))
    assert all(len(set(request)) == len(request) for request in urls)
    assert draw_image_urls(sizes, "png", seed=4, reuse=reuse) == urls


def test_sonnet_images_repeat_with_reuse_and_not_without(tok: TextTokenizer) -> None:
    def sonnet(*argv: str) -> list[tuple[str, ...]]:
        spec = WorkloadSpec.from_args(parser().parse_args(["--num-prompts", "40", *argv]))
        return [r.image_data_urls for r in build_workload(spec, tok)]

    images = ("--images-per-request", "2", "--image-width", "8", "--image-height", "8")
    assert repeated_share(sonnet(*images)) == 0
    assert repeated_share(sonnet(*images, "--image-reuse", "1")) == 78 / 80
    # Without reuse an image is what it was before --image-reuse existed: seeded by (seed, request, slot).
    assert make_image_urls(ImageSpec(2, 8, 8, "png"), 3, 0) == draw_image_urls([[(8, 8)] * 2] * 3, "png", 0)
    # --image-reuse alone: sonnet attaches one image a request; a dataset without images refuses it.
    alone = WorkloadSpec.from_args(parser().parse_args(["--num-prompts", "40", "--image-reuse", "0.5"]))
    assert alone.images_per_request == 1 and all(len(r.image_data_urls) == 1 for r in build_workload(alone, tok))
    with pytest.raises(ValueError, match="--image-reuse needs images"):
        argv = ["--dataset-name", "random", "--image-reuse", "0.5"]
        build_workload(WorkloadSpec.from_args(parser().parse_args(argv)), tok)


# -- end to end ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_bench_run_sends_a_random_mm_workload(tmp_path: Path) -> None:
    cmd: list[Any] = [sys.executable, "-m", "harness.cli", "run", "--result-dir", str(tmp_path), "--no-progress"]
    cmd += ["--dataset-name", "random-mm", "--num-prompts", "20", "--request-rate", "40", "--repeat", "1"]
    cmd += ["--random-input-len", "32", "--random-output-len", "4", "--random-mm-bucket-config", SMALL]
    cmd += ["--random-mm-base-items-per-request", "2", "--random-mm-num-mm-items-range-ratio", "0.5"]
    cmd += ["--image-reuse", "0.5"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (summary_file,) = tmp_path.glob("compare-*.json")
    summary = json.loads(summary_file.read_text())
    assert all(r["status"] == "ok" for r in summary["runs"])
    result = json.loads((tmp_path / summary["runs"][0]["result_file"]).read_text())
    assert result["completed"] == 20
    flags = result["metadata"]["flags"]
    assert (flags["dataset_name"], flags["image_reuse"], flags["endpoint"]) == (
        "random-mm",
        0.5,
        "/v1/chat/completions",
    )
