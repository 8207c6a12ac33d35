"""The baseline zoo: presets reproduce published counts, the closed forms agree with the built models,
and every architecture builds, runs and learns through the same interface."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from rayb.cli import app
from rayb.eval.decoding import CACHE_NAMES, Decoder
from rayb.models import available, build_model, count_params
from rayb.models.accounting import build_on_meta, measured_forward_flops, model_cost
from rayb.models.checkpoint import load_trained
from rayb.models.presets import PRESETS
from rayb.models.registry import get_arch

ZOO = ["gpt2", "nanogpt", "pythia", "llama", "mamba", "mamba2", "gated_deltanet", "rwkv6"]
TINY = {"d_model": 64, "n_layer": 2}

PUBLISHED = {  # the official checkpoints' parameter counts
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "pythia-70m": 70_426_624,
    "pythia-160m": 162_322_944,
    "pythia-410m": 405_334_016,
    "mamba-130m": 129_135_360,
    "mamba-370m": 371_516_416,
}


def test_every_zoo_architecture_is_registered():
    assert set(ZOO) <= set(available())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_counts_equal_the_published_checkpoint(name):
    preset = PRESETS[name]
    model = build_on_meta(preset.arch, preset.config, preset.vocab_size, preset.seq_len)
    assert count_params(model).total == PUBLISHED[name] == preset.published_params
    assert (
        model_cost(preset.arch, preset.config, preset.vocab_size, preset.seq_len).total_params
        == PUBLISHED[name]
    )


SCALES = {  # the plans' named sizes: exact counts, pinned
    "gpt2-3.5m": 3_487_872, "gpt2-8m": 8_021_824, "gpt2-30m": 29_861_440, "gpt2-125m": 124_439_808,
    "llama-50m": 49_692_768, "llama-360m": 360_436_832, "llama-760m": 763_153_440,
    "mamba2-50m": 50_261_571, "mamba2-360m": 362_557_931, "mamba2-760m": 752_070_912,
    "gated_deltanet-50m": 50_107_520, "gated_deltanet-360m": 366_809_940, "gated_deltanet-760m": 769_292_526,
    "pythia-d768-l12-32k": 134_208_000, "mamba-d768-l24-32k": 115_096_320,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SCALES))
def test_plan_scales_are_reproduced(name):
    preset = PRESETS[name]
    counted = count_params(build_on_meta(preset.arch, preset.config, preset.vocab_size, preset.seq_len))
    measure = counted.total if preset.sized_by == "total" else counted.non_embedding
    assert measure == SCALES[name]
    # The size matcher's own answer (tests/test_sizing.py holds each preset to it).
    assert abs(measure / preset.named_size - 1) <= 0.02


def test_backpack_plan_standard_model_count():
    # The backpack plan's standard transformer: vocabulary 250,002, 6 layers, 6 heads, width 384.
    config = {"d_model": 384, "n_layer": 6, "n_head": 6, "bias": False, "tie_embeddings": False}
    assert count_params(build_on_meta("nanogpt", config, 250_002, 512)).total == 202_819_968


def test_nanogpt_with_biases_and_tied_head_is_gpt2():
    config = {"d_model": 768, "n_layer": 12, "n_head": 12}
    assert count_params(build_on_meta("nanogpt", config, 50257, 1024)).total == 124_439_808


CONFIGS = {
    "gpt2": [{"d_model": 96, "n_layer": 3, "n_head": 3}, {"d_model": 64, "n_layer": 2, "n_head": 2, "d_ff": 100}],
    "nanogpt": [{"d_model": 64, "n_layer": 2, "n_head": 2, "bias": False, "tie_embeddings": False}],
    "pythia": [{"d_model": 96, "n_layer": 3, "n_head": 3}, {"d_model": 64, "n_layer": 2, "n_head": 2, "attention_bias": False}],
    "llama": [{"d_model": 128, "n_layer": 2, "n_head": 4, "n_kv_head": 2}, {"d_model": 64, "n_layer": 2, "n_head": 2, "tie_word_embeddings": False}],
    "mamba": [{"d_model": 64, "n_layer": 2, "d_state": 8}, {"d_model": 96, "n_layer": 3}],
    "mamba2": [{"d_model": 64, "n_layer": 2, "d_state": 16}, {"d_model": 128, "n_layer": 2, "n_groups": 2}],
    "gated_deltanet": [{"d_model": 128, "n_layer": 2}],
    "rwkv6": [{"d_model": 128, "n_layer": 2}],
}  # fmt: skip


@pytest.mark.parametrize(("arch", "config"), [(a, c) for a, cs in CONFIGS.items() for c in cs])
def test_closed_form_agrees_with_the_built_model(arch, config):
    vocab, seq_len = 1000, 256
    model = build_on_meta(arch, config, vocab, seq_len)
    cost = model_cost(arch, config, vocab, seq_len)
    counted = count_params(model)
    assert (cost.total_params, cost.embedding_params) == (counted.total, counted.embedding)
    measured = measured_forward_flops(model, seq_len)
    if arch == "mamba":
        # torch counts Mamba's matrix products only; the selective scan is elementwise (9·d_inner·N per
        # token in the closed form), so the two differ by at most that term.
        spec = get_arch(arch)
        cfg = spec.configure(dict(config), vocab, seq_len)
        scan = cfg.num_hidden_layers * 9 * cfg.intermediate_size * cfg.state_size
        assert cost.forward_flops_per_token - scan <= measured <= cost.forward_flops_per_token
    else:
        assert measured == pytest.approx(cost.forward_flops_per_token, rel=0.02)
    assert cost.train_flops_per_token == 3 * cost.forward_flops_per_token


def test_attention_flops_grow_with_context_and_recurrent_state_does_not():
    short, long = (model_cost("llama", TINY | {"n_head": 1}, 1000, t) for t in (256, 2048))
    assert long.forward_flops_per_token - short.forward_flops_per_token == 2 * 4 * (2048 - 256) * 64
    assert short.kv_cache_per_token == 2 * 2 * 64 and short.state_size == 0
    for arch in ("mamba", "rwkv6", "gated_deltanet"):
        cost = model_cost(arch, TINY, 1000, 256)
        assert cost.kv_cache_per_token == 0 and cost.state_size > 0


@pytest.mark.parametrize("arch", ZOO)
def test_every_architecture_trains_on_cpu(arch):
    torch.manual_seed(0)
    config = get_arch(arch).shape(64, 2)
    model = build_model(arch, config, 256, 32)
    ids = torch.randint(0, 256, (4, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert logits.shape == (4, 32, 256)
    assert losses[-1] < losses[0] - 0.5, losses  # memorising one batch: the loss must fall


def _cache(output) -> object | None:
    return next((c for name in CACHE_NAMES if (c := getattr(output, name, None)) is not None), None)


@pytest.mark.parametrize("arch", ZOO)
def test_no_forward_builds_a_cache_unless_decoding_asks_for_it(arch, tmp_path):
    """transformers' attention models default to building a cache on every forward, training included
    (each layer's keys and values copied into it at every step); rayb's models build one only where
    decoding asks, and a checkpoint saved with the default on loads with it off."""
    model = build_model(arch, get_arch(arch).shape(64, 2), 256, 32)
    ids = torch.randint(0, 256, (2, 16))
    assert _cache(model(ids)) is None  # a training forward
    with torch.no_grad():
        assert _cache(model.eval()(ids)) is None  # scoring
    if Decoder(model).memory == "cache":  # decoding passes use_cache=True
        assert _cache(model(ids, use_cache=True)) is not None
    if hasattr(model, "save_pretrained"):
        model.config.use_cache = True  # as transformers' own checkpoints have it
        model.save_pretrained(tmp_path, safe_serialization=True)
        loaded = load_trained(tmp_path, arch, get_arch(arch).shape(64, 2), 256, 32)
        assert _cache(loaded(ids)) is None


def test_params_cli_json():
    result = CliRunner().invoke(app, ["params", "pythia-70m", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["total_params"] == info["counted_total_params"] == 70_426_624
    assert info["non_embedding_params"] == 70_426_624 - 2 * 50304 * 512
    assert info["flops_per_token"] > 2 * info["non_embedding_params"]


def test_params_cli_overrides_and_bad_input():
    runner = CliRunner()
    result = runner.invoke(
        app, ["params", "gpt2", "--vocab", "2048", "--seq-len", "128", "--set", "n_layer=2", "--json"]
    )
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert (info["vocab_size"], info["seq_len"], info["config"]["n_layer"]) == (2048, 128, 2)
    assert runner.invoke(app, ["params", "no-such-model"]).exit_code == 2
    assert runner.invoke(app, ["params", "gpt2", "--set", "n_layer"]).exit_code == 2
    assert "pythia-160m" in runner.invoke(app, ["params", "--list"]).output


def test_user_model_by_import_path_is_counted_the_same_way():
    cost = model_cost(
        "examples.backpack:build", {"d_model": 64, "n_layer": 2, "n_head": 2, "n_senses": 4}, 512, 64
    )
    base = model_cost("nanogpt", {"d_model": 64, "n_layer": 2, "n_head": 2}, 512, 64)
    assert cost.embedding_params == base.embedding_params  # the same embeddings
    assert cost.non_embedding_params > base.non_embedding_params  # plus the sense network
    assert cost.forward_flops_per_token > base.forward_flops_per_token
