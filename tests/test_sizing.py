"""Size matching: every architecture hits every plan size within ±2%, or says why not."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rayb.cli import app
from rayb.models import count_params
from rayb.models.accounting import build_on_meta
from rayb.models.sizing import SizeError, match, parse_size

ZOO = ["gpt2", "nanogpt", "pythia", "llama", "mamba", "mamba2", "gated_deltanet", "rwkv6"]
SIZES = ["3.5M", "8M", "30M", "125M", "360M", "760M"]


@pytest.mark.parametrize("arch", ZOO)
@pytest.mark.parametrize("by", ["total", "non-embedding"])
def test_match_hits_every_size_within_two_percent(arch, by):
    for size in SIZES:
        found = match(arch, parse_size(size), by, vocab_size=32000, seq_len=1024)
        assert abs(found.error) <= 0.02, (arch, size, found.config)


@pytest.mark.parametrize("arch", ZOO)
def test_match_agrees_with_the_built_model(arch):
    found = match(arch, 8_000_000, "total", vocab_size=2048, seq_len=256)
    counted = count_params(build_on_meta(arch, found.config, 2048, 256))
    assert counted.total == found.cost.total_params
    assert abs(counted.total / 8_000_000 - 1) <= 0.02


def test_fixed_keys_are_kept():
    found = match("mamba", 30_000_000, vocab_size=32000, fixed={"d_state": 8, "n_layer": 10})
    assert found.config["d_state"] == 8 and found.config["n_layer"] == 10
    assert abs(found.error) <= 0.02


def test_vocabulary_too_large_for_the_target_says_so():
    with pytest.raises(SizeError, match=r"embedding \(vocabulary 50,257"):
        match("gpt2", 1_000_000, "total", vocab_size=50257)
    # By non-embedding parameters the same target is fine.
    assert abs(match("gpt2", 1_000_000, "non-embedding", vocab_size=50257).error) <= 0.02


def test_unmatchable_user_model_says_why():
    with pytest.raises(SizeError, match="no shape rules"):
        match("examples.moe:build", 1_000_000)


@pytest.mark.parametrize(("text", "value"), [("30M", 30_000_000), ("3.5m", 3_500_000), ("1.3B", 1_300_000_000),
                                             ("760000", 760_000), (125_000_000, 125_000_000)])  # fmt: skip
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["thirty", "30X", "-5M", "0", ""])
def test_parse_size_rejects(bad):
    with pytest.raises(SizeError):
        parse_size(bad)


def test_match_cli_json_and_failure():
    runner = CliRunner()
    result = runner.invoke(
        app, ["match", "--target", "30M", "--archs", "gpt2,llama,mamba2", "--vocab", "32000", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["arch"] for r in rows] == ["gpt2", "llama", "mamba2"]
    assert all(abs(r["total_params"] / 30e6 - 1) <= 0.02 and "d_model" in r["config"] for r in rows)
    failed = runner.invoke(app, ["match", "--target", "100K", "--archs", "gpt2", "--json"])
    assert failed.exit_code == 1 and "embedding" in json.loads(failed.output)[0]["error"]
    assert runner.invoke(app, ["match", "--target", "big"]).exit_code == 2
