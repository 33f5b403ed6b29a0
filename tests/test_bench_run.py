"""bench run's pure parts: codec lists, forwarded flags, the table and its verdicts."""

import argparse

import pytest

from harness.bench_run import add_arguments, changes_vs_baseline, format_table, parse_codecs, server_flags
from wirecodecs import available_codecs


def cell(*values: float) -> dict:
    ordered = sorted(values)
    return {"median": ordered[len(ordered) // 2], "spread_pct": None, "values": list(values)}


def row(**cells: dict) -> dict:
    return {"runs": 3, "measured": 3, "status": "ok", "message": "", **cells}


def test_parse_codecs():
    assert parse_codecs("all") == available_codecs()
    assert parse_codecs("msgspec, pickle,msgspec") == ["msgspec", "pickle"]
    with pytest.raises(ValueError, match="unknown codec"):
        parse_codecs("pickle,nope")


def test_server_flags_forward_only_changed_model_settings():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--codec", "all", "--max-num-seqs", "8", "--mm-payload", "tensor", "--seed", "3"])
    flags = server_flags(args)
    assert flags[:2] == ["--seed", "3"]
    assert "--max-num-seqs" in flags and flags[flags.index("--max-num-seqs") + 1] == "8"
    assert "--mm-payload" in flags and "--model-preset" not in flags  # left at its default
    assert "--codec" not in flags and "--request-rate" not in flags  # not server flags


def test_changes_are_judged_against_round_to_round_noise():
    table = {
        "pickle": row(mean_ttft_ms=cell(99, 100, 101), mean_tpot_ms=cell(2.0, 2.0, 2.0)),
        "msgspec": row(mean_ttft_ms=cell(89, 90, 91), mean_tpot_ms=cell(1.99, 2.01, 2.02)),
    }
    changes = changes_vs_baseline(table)["msgspec"]
    assert changes["mean_ttft_ms"]["change_pct"] == pytest.approx(-10.0)
    assert changes["mean_ttft_ms"]["significant"] is True
    assert changes["mean_tpot_ms"]["significant"] is False


def test_one_round_cannot_be_judged():
    table = {"a": row(mean_ttft_ms=cell(100)), "b": row(mean_ttft_ms=cell(50))}
    assert changes_vs_baseline(table)["b"]["mean_ttft_ms"]["significant"] is None
    assert "no spread to judge" in format_table(table, 1)


def test_table_with_only_unsupported_codecs():
    table = {"msgspec": {"runs": 1, "measured": 0, "status": "unsupported", "message": "cannot carry images"}}
    text = format_table(table, 1)
    assert "msgspec  unsupported: cannot carry images" in text
    assert changes_vs_baseline(table) == {}
