"""Named configurations: the official checkpoints' shapes, and the scales the teams' plans ask for.

A preset is an architecture, a config, and the vocabulary and context it was defined with; `rayb
params NAME` counts it, and a study can use one as `preset: NAME`. Counts for the official
checkpoints are their published totals (tests build each preset on the meta device and pin them).
The plans' scales are the member of each architecture's shape family (rayb/models/sizing.py) nearest
the named size, its inner width (or state size) tuned to land within ±2%, as `rayb match` solves it,
frozen here so a named size means the same model in every study (a test holds them to the solver).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Preset:
    name: str
    arch: str
    config: dict[str, Any]
    vocab_size: int
    seq_len: int
    about: str
    published_params: int | None = None  # the official checkpoint's count, where there is one
    hub_id: str | None = None
    named_size: int | None = None  # the plan's size this preset stands for
    sized_by: str = "total"


GPT2_VOCAB, NEOX_VOCAB, MAMBA_VOCAB, LLAMA2_VOCAB = 50257, 50304, 50280, 32000


def _gpt2(name, d, n_layer, n_head, published, hub_id) -> Preset:
    return Preset(name, "gpt2", {"d_model": d, "n_layer": n_layer, "n_head": n_head}, GPT2_VOCAB, 1024,
                  f"OpenAI {name}", published, hub_id)  # fmt: skip


def _pythia(name, d, n_layer, n_head, published) -> Preset:
    return Preset(name, "pythia", {"d_model": d, "n_layer": n_layer, "n_head": n_head}, NEOX_VOCAB, 2048,
                  f"EleutherAI {name} (GPT-NeoX)", published, f"EleutherAI/{name}")  # fmt: skip


def _mamba(name, d, n_layer, published) -> Preset:
    return Preset(name, "mamba", {"d_model": d, "n_layer": n_layer}, MAMBA_VOCAB, 2048,
                  f"state-spaces {name}", published, f"state-spaces/{name}-hf")  # fmt: skip


def _scale(name, arch, config, vocab, seq_len, size, by, about) -> Preset:
    return Preset(name, arch, config, vocab, seq_len, about, named_size=size, sized_by=by)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        # Official checkpoints
        _gpt2("gpt2", 768, 12, 12, 124_439_808, "openai-community/gpt2"),
        _gpt2("gpt2-medium", 1024, 24, 16, 354_823_168, "openai-community/gpt2-medium"),
        _gpt2("gpt2-large", 1280, 36, 20, 774_030_080, "openai-community/gpt2-large"),
        _pythia("pythia-70m", 512, 6, 8, 70_426_624),
        _pythia("pythia-160m", 768, 12, 12, 162_322_944),
        _pythia("pythia-410m", 1024, 24, 16, 405_334_016),
        _mamba("mamba-130m", 768, 24, 129_135_360),
        _mamba("mamba-370m", 1024, 48, 371_516_416),
        # GPT-2 at the small scales (GPT-2 tokenizer). Sized by non-embedding parameters: a
        # 50,257-token embedding alone is 3.2M at width 64, so "3.5M total" leaves no model. One
        # layer or 32 of width is a 12-25% step at these sizes: d_ff lands the count within ±2%.
        _scale("gpt2-3.5m", "gpt2", {"d_model": 256, "n_layer": 4, "n_head": 4, "d_ff": 1184}, GPT2_VOCAB,
               1024, 3_500_000, "non-embedding", "GPT-2 at 3.5M non-embedding parameters"),
        _scale("gpt2-8m", "gpt2", {"d_model": 352, "n_layer": 5, "n_head": 11, "d_ff": 1568}, GPT2_VOCAB,
               1024, 8_000_000, "non-embedding", "GPT-2 at 8M non-embedding parameters"),
        _scale("gpt2-30m", "gpt2", {"d_model": 544, "n_layer": 8, "n_head": 17, "d_ff": 2336}, GPT2_VOCAB,
               1024, 30_000_000, "non-embedding", "GPT-2 at 30M non-embedding parameters"),
        _scale("gpt2-125m", "gpt2", {"d_model": 768, "n_layer": 12, "n_head": 12}, GPT2_VOCAB, 1024,
               125_000_000, "total", "GPT-2 small's shape"),
        # Transformer++ / Mamba-2 / Gated DeltaNet at ~50M/360M/760M total with the Llama-2 32K
        # vocabulary, as in the Gated DeltaNet and Titans papers' comparisons.
        _scale("llama-50m", "llama", {"d_model": 544, "n_layer": 9, "n_head": 17}, LLAMA2_VOCAB, 2048,
               50_000_000, "total", "Transformer++ at ~50M"),
        _scale("llama-360m", "llama", {"d_model": 1184, "n_layer": 19, "n_head": 37}, LLAMA2_VOCAB, 2048,
               360_000_000, "total", "Transformer++ at ~360M"),
        _scale("llama-760m", "llama", {"d_model": 1568, "n_layer": 24, "n_head": 49}, LLAMA2_VOCAB, 2048,
               760_000_000, "total", "Transformer++ at ~760M"),
        _scale("mamba2-50m", "mamba2", {"d_model": 544, "n_layer": 17, "head_dim": 64}, LLAMA2_VOCAB, 2048,
               50_000_000, "total", "Mamba-2 at ~50M"),
        _scale("mamba2-360m", "mamba2", {"d_model": 1184, "n_layer": 37, "head_dim": 64}, LLAMA2_VOCAB, 2048,
               360_000_000, "total", "Mamba-2 at ~360M"),
        _scale("mamba2-760m", "mamba2", {"d_model": 1536, "n_layer": 48, "head_dim": 64}, LLAMA2_VOCAB, 2048,
               760_000_000, "total", "Mamba-2 at ~760M"),
        _scale("gated_deltanet-50m", "gated_deltanet", {"d_model": 544, "n_layer": 8, "head_dim": 64, "n_head": 6},
               LLAMA2_VOCAB, 2048, 50_000_000, "total", "Gated DeltaNet at ~50M"),
        _scale("gated_deltanet-360m", "gated_deltanet", {"d_model": 1152, "n_layer": 18, "head_dim": 64, "n_head": 13},
               LLAMA2_VOCAB, 2048, 360_000_000, "total", "Gated DeltaNet at ~360M"),
        _scale("gated_deltanet-760m", "gated_deltanet", {"d_model": 1504, "n_layer": 23, "head_dim": 64, "n_head": 17},
               LLAMA2_VOCAB, 2048, 760_000_000, "total", "Gated DeltaNet at ~760M"),
        # The neuromorphic plan's from-scratch baselines (32K vocabulary).
        _scale("pythia-d768-l12-32k", "pythia", {"d_model": 768, "n_layer": 12, "n_head": 12},
               LLAMA2_VOCAB, 2048, 134_200_000, "total", "Pythia-style D768 L12, 32K vocabulary (134.2M)"),
        _scale("mamba-d768-l24-32k", "mamba", {"d_model": 768, "n_layer": 24},
               LLAMA2_VOCAB, 2048, 115_100_000, "total", "Mamba-style D768 L24, 32K vocabulary (115.1M)"),
    ]
}  # fmt: skip


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset '{name}'; available: {', '.join(PRESETS)}")
    return PRESETS[name]
