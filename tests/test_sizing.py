"""Size matching: each architecture's sizes come from one shape family (depth and width never shrink, the
width/depth ratio stays near the architecture's, heads 32 or 64 wide); a target gets the family member
nearest it, within ±2% or saying by how much it misses; models compared unlike in size are flagged."""

from __future__ import annotations

import json
import math
from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayb.cli import app
from rayb.models import count_params
from rayb.models.accounting import build_on_meta, model_cost
from rayb.models.presets import PRESETS
from rayb.models.registry import available, get_arch
from rayb.models.sizing import SizeError, comparability_warnings, family, match, parse_size

ZOO = ["gpt2", "nanogpt", "pythia", "llama", "mamba", "mamba2", "gated_deltanet", "rwkv6"]
SIZES = ["3.5M", "8M", "30M", "125M", "360M", "760M"]
LADDER = ["1M", "3.5M", "8M", "30M", "125M"]


def test_every_builtin_architecture_is_tested():
    assert set(ZOO) == set(available())


@pytest.mark.parametrize("arch", ZOO)
@pytest.mark.parametrize(("by", "vocab"), [("total", 2048), ("non-embedding", 50257)])
def test_depth_and_width_never_shrink_as_the_target_grows(arch, by, vocab):
    shapes = [match(arch, parse_size(size), by, vocab, 1024).config for size in LADDER]
    for smaller, larger in pairwise(shapes):
        assert larger["n_layer"] >= smaller["n_layer"] and larger["d_model"] >= smaller["d_model"], shapes
    # Not only at these five: every target from 1M to 1B, 5% apart.
    fine = [match(arch, round(1e6 * 1.05**i), by, vocab, 1024).config for i in range(0, 142, 3)]
    assert all(b["n_layer"] >= a["n_layer"] and b["d_model"] >= a["d_model"] for a, b in pairwise(fine))


@pytest.mark.parametrize("arch", ZOO)
def test_family_shapes_keep_the_ratio_and_usual_heads(arch):
    spec = get_arch(arch)
    for d_model, n_layer in family(spec, {}):
        if n_layer > 24:
            break
        if n_layer >= 4:  # below, one layer is already a large share of the ratio
            assert 1 / 1.35 <= d_model / n_layer / spec.aspect <= 1.35, (d_model, n_layer)
        config = spec.shape(d_model, n_layer)
        head = config.get("head_size") or config.get("head_dim") or d_model // config.get("n_head", 1)
        assert d_model % 32 == 0 and (head in (32, 64, 128) or arch == "mamba"), config


@pytest.mark.parametrize("arch", ZOO)
@pytest.mark.parametrize("by", ["total", "non-embedding"])
def test_match_is_the_nearest_family_member_and_says_when_it_misses(arch, by):
    spec = get_arch(arch)
    for size in SIZES:
        target = parse_size(size)
        found = match(arch, target, by, vocab_size=32000, seq_len=1024)
        costs = [
            model_cost(arch, spec.shape(d, n), 32000, 1024)
            for d, n in family(spec, {}) if n <= 2 * found.config["n_layer"] and d <= 2 * found.config["d_model"]
        ]  # fmt: skip
        counts = [c.total_params if by == "total" else c.non_embedding_params for c in costs]
        nearest = min(abs(math.log(c / target)) for c in counts)
        assert abs(math.log(found.params / target)) == pytest.approx(nearest), (arch, size)
        assert bool(found.note) == (abs(found.error) > 0.02), (arch, size, found.note)
    # From 360M up one step of the family is small enough for ±2% everywhere.
    assert abs(match(arch, 760_000_000, by, 32000, 1024).error) <= 0.02


def test_a_miss_names_both_neighbours():
    found = match("rwkv6", 3_500_000, "non-embedding")
    assert found.config == {"d_model": 256, "n_layer": 4, "head_size": 64} and found.error > 0.02
    assert "no shape of rwkv6's family is within ±2%" in found.note
    assert "d_model 224 × 4 layers (-14.4%) and d_model 256 × 4 layers (+11.0%)" in found.note


@pytest.mark.parametrize("arch", ZOO)
def test_match_agrees_with_the_built_model(arch):
    found = match(arch, 8_000_000, "total", vocab_size=2048, seq_len=256)
    counted = count_params(build_on_meta(arch, found.config, 2048, 256))
    assert counted.total == found.cost.total_params == found.params


@pytest.mark.parametrize("name", [n for n, p in PRESETS.items() if p.named_size])
def test_presets_are_the_solvers_answer(name):
    preset = PRESETS[name]
    found = match(preset.arch, preset.named_size, preset.sized_by, preset.vocab_size, preset.seq_len)
    assert found.config == preset.config


def test_fixed_keys_are_kept():
    found = match("mamba", 30_000_000, vocab_size=32000, fixed={"d_state": 8, "n_layer": 10})
    assert found.config["d_state"] == 8 and found.config["n_layer"] == 10
    assert abs(found.error) <= 0.02
    # A pinned depth walks width alone, and it stays monotone.
    widths = [
        match("llama", t, "total", 32000, fixed={"n_layer": 6}).config["d_model"] for t in (3e7, 6e7, 1.2e8)
    ]
    assert widths == sorted(widths) and len(set(widths)) == 3


def test_vocabulary_too_large_for_the_target_says_so():
    with pytest.raises(SizeError, match=r"embedding \(vocabulary 50,257"):
        match("gpt2", 1_000_000, "total", vocab_size=50257)
    # By non-embedding parameters the same target is met by the family's nearest shape.
    assert match("gpt2", 1_000_000, "non-embedding", vocab_size=50257).config["d_model"] == 160


def test_beyond_the_family_says_so():
    with pytest.raises(SizeError, match="beyond gpt2's family"):
        match("gpt2", 10**13, "total", fixed={"n_layer": 2})


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
        app, ["match", "--target", "50M,360M", "--archs", "gpt2,llama,mamba2", "--vocab", "32000", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["arch"], r["target"]) for r in rows] == [
        (a, t) for t in (50_000_000, 360_000_000) for a in ("gpt2", "llama", "mamba2")
    ]
    assert all(abs(r["total_params"] / r["target"] - 1) <= 0.02 and not r["note"] for r in rows)
    failed = runner.invoke(app, ["match", "--target", "100K", "--archs", "gpt2", "--json"])
    assert failed.exit_code == 1 and "embedding" in json.loads(failed.output)[0]["error"]
    assert runner.invoke(app, ["match", "--target", "big"]).exit_code == 2


def test_match_cli_depth_like_holds_the_references_depth():
    args = ["match", "--target", "8M,30M", "--by", "non-embedding", "--archs", "gpt2,mamba,rwkv6"]
    rows = json.loads(CliRunner().invoke(app, [*args, "--depth-like", "gpt2", "--json"]).output)
    for target in (8_000_000, 30_000_000):
        depths = {r["arch"]: r["config"]["n_layer"] for r in rows if r["target"] == target}
        assert depths == dict.fromkeys(
            ("gpt2", "mamba", "rwkv6"), match("gpt2", target, "non-embedding").config["n_layer"]
        )
    table = CliRunner().invoke(app, [*args, "--depth-like", "gpt2"])
    assert "n_layer held at gpt2's" in table.output and "no shape of" in table.output
    unknown = CliRunner().invoke(app, [*args, "--depth-like", "gpt5", "--json"])
    assert unknown.exit_code == 1 and "--depth-like gpt5" in json.loads(unknown.output)[0]["error"]


def test_comparability_warnings_say_what_was_matched_and_what_differs():
    models = [
        ("gpt2", 16_287_488, 1.09e8, 4),
        ("rwkv6", 29_615_616, 1.01e8, 4),  # untied head: 1.82× the total parameters
        ("mamba", 16_370_176, 0.99e8, 9),  # 2.25× the depth
        ("llama", 20_359_360, 1.36e8, 8),  # 1.25× exactly and 2× exactly: not flagged
        ("pythia-pretrained", None, None, None),
    ]
    warnings = comparability_warnings(models, "non-embedding parameters", reference="gpt2")
    assert warnings == [
        "rwkv6 vs gpt2, matched by non-embedding parameters, still differ in total parameters 29,615,616 vs "
        "16,287,488 (1.82×, more than 1.25×)",
        "mamba vs gpt2, matched by non-embedding parameters, still differ in depth 9 vs 4 layers (2.25×, "
        "more than 2×)",
    ]
    # Without a reference every pair is compared; FLOPs are flagged too.
    pairs = comparability_warnings(
        [("a", 100, 1e9, 4), ("b", 100, 2e9, 4), ("c", 100, 1e9, 4)], "total parameters"
    )
    assert pairs == [
        "b vs a, matched by total parameters, still differ in training FLOPs per token 2e+09 vs 1e+09 (2.00×, more than 1.25×)",
        "c vs b, matched by total parameters, still differ in training FLOPs per token 1e+09 vs 2e+09 (2.00×, more than 1.25×)",
    ]


def test_validate_prints_misses_and_unlike_comparisons():
    study = Path(__file__).parent.parent / "configs" / "groundthink-gate.yaml"
    result = CliRunner().invoke(app, ["validate", str(study)])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "candidate-3.5m: no shape of rwkv6's family is within ±2% of 3,500,000 non-embedding" in output
    # The gate compares candidate-8m with gpt2-8m only: RWKV-6's untied head makes it 1.55× the total.
    assert (
        "candidate-8m vs gpt2-8m, matched by non-embedding parameters, still differ in total parameters "
        "39,564,160 vs 25,508,736 (1.55×, more than 1.25×)" in output
    )
    assert "candidate-3.5m vs" not in output
