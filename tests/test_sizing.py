"""Size matching: each architecture's sizes come from one shape family (depth and width never shrink, the
width/depth ratio stays near the architecture's, heads 32 or 64 wide); a target gets the family member
nearest it, within ±2% or saying by how much it misses; models compared unlike in size are flagged."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayb.analysis.comparability import Counted, comparability_warnings
from rayb.cli import app
from rayb.models import count_params
from rayb.models.accounting import build_on_meta, model_cost
from rayb.models.presets import PRESETS
from rayb.models.registry import available, get_arch
from rayb.models.sizing import SizeError, family, match, parse_size

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


# Every match that still misses ±2% (arch, size, by, vocabulary), and why: anything else is within, and each
# of these misses (a test fails if one comes within, so this list stays true).
KNOWN_MISSES = {
    # 3 layers: one layer is a third of the model, and d_ffn ±30% moves only ±13% of it (the fixed-rank
    # LoRAs and the time mix take the rest).
    ("rwkv6", "1M", "non-embedding", 50257),
    # Small totals: the knobs move only the non-embedding part, a half (30M, 32,000 vocabulary) or an eighth
    # (3.5M) of the total, too little to close the gap between the shapes around the target. At the
    # defaults → with the knobs turned to their band's end, the shape below and the shape above:
    ("mamba", "1M", "total", 2048),  # d128 × 5 -15.5% → -7.3%, d160 × 5 +21.7% → +16.2%
    ("mamba", "3.5M", "total", 32000),  # d96 × 3 -6.4% → -5.4%, d128 × 3 +27.0% → +26.3%
    ("mamba", "30M", "total", 32000),  # d416 × 13 -6.8% → -3.1%, d448 × 13 +4.3% → +2.3%
    ("mamba2", "3.5M", "total", 32000),  # d96 × 3 -5.1% → -2.9%, d128 × 3 +28.6% → +27.1%
    *((arch, "3.5M", "total", 32000) for arch in ("pythia", "llama", "gated_deltanet", "rwkv6")),
    *((arch, "8M", "total", 32000) for arch in ("pythia", "llama", "rwkv6")),
}


def _misses(arch: str, sizes: list[str], by: str, vocab: int) -> set[tuple]:
    """The (arch, size, by, vocab) of each size `arch` misses ±2% at; each one's note must say so."""
    missed = set()
    for size in sizes:
        found = match(arch, parse_size(size), by, vocab, 1024)
        assert bool(found.note) == (abs(found.error) > 0.02), (size, found.note)  # a miss always says so
        if found.note:
            missed.add((arch, size, by, vocab))
    return missed


def _known(arch: str, by: str, vocab: int) -> set[tuple]:
    return {miss for miss in KNOWN_MISSES if miss[0] == arch and miss[2:] == (by, vocab)}


@pytest.mark.parametrize("arch", ZOO)
@pytest.mark.parametrize(("by", "vocab"), [("total", 2048), ("non-embedding", 50257)])
def test_the_ladder_is_matched_within_two_percent(arch, by, vocab):
    assert _misses(arch, LADDER, by, vocab) == _known(arch, by, vocab)


@pytest.mark.parametrize("arch", ZOO)
def test_every_family_meets_the_plans_sizes(arch):
    """Issue 32: every built-in family within ±2% at 3.5M, 8M and 30M non-embedding parameters."""
    for size in ("3.5M", "8M", "30M"):
        found = match(arch, parse_size(size), "non-embedding", 50257, 1024)
        assert abs(found.error) <= 0.02 and not found.note, (size, found.config, found.error)


@pytest.mark.parametrize("arch", ZOO)
@pytest.mark.parametrize("by", ["total", "non-embedding"])
def test_match_is_a_neighbouring_family_member_with_only_its_knobs_moved(arch, by):
    spec = get_arch(arch)
    for size in SIZES:
        target = parse_size(size)
        found = match(arch, target, by, vocab_size=32000, seq_len=1024)
        d_model, n_layer = found.config["d_model"], found.config["n_layer"]
        shapes = list(family(spec, {}))
        place = shapes.index((d_model, n_layer))
        counts = [
            model_cost(arch, spec.shape(*shape), 32000, 1024).total_params
            if by == "total" else model_cost(arch, spec.shape(*shape), 32000, 1024).non_embedding_params
            for shape in shapes[place - 1 : place + 2]
        ]  # fmt: skip
        assert counts[0] <= target <= counts[-1], (arch, size)  # one of the two around the target
        moved = {k: v for k, v in found.config.items() if spec.shape(d_model, n_layer).get(k) != v}
        knobs = {knob.key: knob for knob in spec.knobs}
        for key, value in moved.items():
            knob = knobs[key]
            low, high = (knob.default(d_model) * end for end in knob.band)
            assert value % knob.step == 0 and low <= value <= high, (key, value)
    assert _misses(arch, SIZES, by, 32000) == _known(arch, by, 32000)
    # From 360M up one step of the family is small enough for ±2% everywhere.
    assert abs(match(arch, 760_000_000, by, 32000, 1024).error) <= 0.02


def test_the_knobs_turn_only_when_the_defaults_miss():
    assert "d_ff" not in match("gpt2", 124_000_000, "total").config  # GPT-2 small's shape, -0.4%
    tuned = match("gpt2", 3_500_000, "non-embedding")
    assert tuned.config == {"d_model": 256, "n_layer": 4, "n_head": 4, "d_ff": 1184} and not tuned.note
    # A pinned inner width is kept, and the family alone then misses.
    pinned = match("gpt2", 3_500_000, "non-embedding", fixed={"d_ff": 1024})
    assert pinned.config["d_ff"] == 1024 and "within ±2%" in pinned.note


def test_mamba_turns_its_state_size_then_its_delta_rank():
    """transformers takes Mamba's inner width only as an integer expand: d_state turns first (Mamba-2's
    alone), and Mamba's Δ rank only where d_state's band cannot reach ±2%."""
    assert match("mamba", 3_500_000, "non-embedding").config == {"d_model": 256, "n_layer": 8}  # +0.13%
    assert match("mamba2", 3_500_000, "non-embedding").config == {
        "d_model": 256, "n_layer": 8, "head_dim": 64, "d_state": 80  # +6.4% at d_state 128
    }  # fmt: skip
    d_state_alone = match("mamba", 125_000_000, "non-embedding")  # +2.9% at d_state 16, +1.9% at 8
    assert d_state_alone.config == {"d_model": 864, "n_layer": 27, "d_state": 8}
    # d_state 32 leaves -2.9%; the Δ rank (20 by default) takes the rest.
    eight = match("mamba", 8_000_000, "non-embedding")
    assert eight.config == {"d_model": 320, "n_layer": 11, "d_state": 32, "time_step_rank": 36}
    assert abs(eight.error) <= 0.02
    # A pinned d_state stays, and the Δ rank alone turns.
    pinned = match("mamba", 8_000_000, "non-embedding", fixed={"d_state": 16})
    assert pinned.config["d_state"] == 16 and "time_step_rank" in pinned.config
    assert "even with time_step_rank from 0.5× to 2× its default;" in pinned.note


def test_a_miss_names_both_neighbours():
    found = match("mamba", 1_000_000, "total", vocab_size=2048)
    assert found.config == {"d_model": 128, "n_layer": 5, "d_state": 32, "time_step_rank": 16}
    assert "no shape of mamba's family is within ±2%" in found.note
    both = "d_state from 0.5× to 2× its default and time_step_rank from 0.5× to 2× its default"
    assert f"even with {both};" in found.note
    assert (
        "d_model 128 × 5 layers, d_state 32, time_step_rank 16 (-7.3%) and "
        "d_model 160 × 5 layers, d_state 8, time_step_rank 5 (+16.2%)" in found.note
    )
    short = match("rwkv6", 1_000_000, "non-embedding")
    assert "even with d_ffn within ±30% of its default" in short.note
    assert (
        "d_model 160 × 2 layers, d_ffn 704 (-9.3%) and d_model 160 × 3 layers, d_ffn 384 (+5.3%)"
        in short.note
    )


@pytest.mark.parametrize("arch", ZOO)
@pytest.mark.parametrize(("by", "vocab"), [("total", 2048), ("non-embedding", 50257)])
def test_match_agrees_with_the_built_model(arch, by, vocab):
    """The second turns Mamba's and Mamba-2's knobs: the closed form must count them as the model does."""
    found = match(arch, 8_000_000, by, vocab_size=vocab, seq_len=256)
    counted = count_params(build_on_meta(arch, found.config, vocab, 256))
    assert counted.total == found.cost.total_params
    assert counted.non_embedding == found.cost.non_embedding_params


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
    args = ["match", "--target", "1M,8M,30M", "--by", "non-embedding", "--archs", "gpt2,mamba,rwkv6"]
    rows = json.loads(CliRunner().invoke(app, [*args, "--depth-like", "gpt2", "--json"]).output)
    for target in (1_000_000, 8_000_000, 30_000_000):
        depths = {r["arch"]: r["config"]["n_layer"] for r in rows if r["target"] == target}
        assert depths == dict.fromkeys(
            ("gpt2", "mamba", "rwkv6"), match("gpt2", target, "non-embedding").config["n_layer"]
        )
    table = CliRunner().invoke(app, [*args, "--depth-like", "gpt2"])
    # RWKV-6 at gpt2's 3 layers for 1M misses (+5.3%), and says so.
    assert "n_layer held at gpt2's" in table.output and "no shape of rwkv6's family" in table.output
    unknown = CliRunner().invoke(app, [*args, "--depth-like", "gpt5", "--json"])
    assert unknown.exit_code == 1 and "--depth-like gpt5" in json.loads(unknown.output)[0]["error"]


def _counted(arch: str, total: int | None, flops: float | None, n_layer: int | None) -> Counted:
    return Counted(arch, {"n_layer": n_layer} if n_layer else {}, total, None, flops)


def test_comparability_warnings_say_what_was_matched_and_what_differs():
    counts = {
        "gpt2": _counted("gpt2", 16_287_488, 1.09e8, 4),
        "rwkv6": _counted("rwkv6", 29_615_616, 1.01e8, 4),  # untied head: 1.82× the total parameters
        "llama": _counted("llama", 20_359_360, 1.36e8, 9),  # 2.25× the depth
        "gdn": _counted("gated_deltanet", 20_359_360, 1.36e8, 8),  # 1.25× exactly and 2× exactly: not flagged
        "pythia-pretrained": _counted("pretrained", None, None, None),
    }
    warnings = comparability_warnings(counts, "non-embedding parameters", reference="gpt2")
    assert warnings == [
        "rwkv6 vs gpt2, matched by non-embedding parameters, still differ in total parameters 29,615,616 vs "
        "16,287,488 (1.82×, more than 1.25×)",
        "llama vs gpt2, matched by non-embedding parameters, still differ in depth 9 layers vs 4 layers (2.25×, "
        "more than 2×)",
    ]
    # Without a reference every pair is compared; FLOPs are flagged too.
    pairs = comparability_warnings(
        {name: _counted("gpt2", 100, flops, 4) for name, flops in (("a", 1e9), ("b", 2e9), ("c", 1e9))},
        "total parameters",
    )
    assert pairs == [
        "b vs a, matched by total parameters, still differ in training FLOPs per token 2e+09 vs 1e+09 (2.00×, more than 1.25×)",
        "c vs b, matched by total parameters, still differ in training FLOPs per token 1e+09 vs 2e+09 (2.00×, more than 1.25×)",
    ]


def test_depth_is_compared_in_blocks():
    """A Mamba layer is one mixer without an MLP, about half a transformer block: 2 layers make a block."""
    assert (get_arch("mamba").layers_per_block, get_arch("mamba2").layers_per_block) == (2, 2)
    assert all(get_arch(a).layers_per_block == 1 for a in ZOO if a not in ("mamba", "mamba2"))
    reference = {"gpt2": _counted("gpt2", 100, 1e9, 4)}
    assert not comparability_warnings(
        reference | {"mamba": _counted("mamba", 100, 1e9, 16)}, "total parameters"
    )
    assert comparability_warnings(
        reference | {"mamba": _counted("mamba", 100, 1e9, 18)}, "total parameters"
    ) == [
        "mamba vs gpt2, matched by total parameters, still differ in depth 18 layers (9 blocks) vs 4 layers "
        "(2.25×, more than 2×)"
    ]


def _validate(name: str) -> str:
    result = CliRunner().invoke(app, ["validate", str(Path(__file__).parent.parent / "configs" / name)])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_validate_prints_a_size_the_family_misses():
    # (test_team_studies.py checks the unlike comparisons validate prints for the full-size team studies.)
    # zoo sizes Mamba at 1M total parameters with a 2,048 vocabulary, where its family has no shape near.
    assert "mamba: 927,232 total parameters, -7.3% from the 1M it was sized to" in _validate("zoo.yaml")
