"""Saving and loading models that transformers does not ship, as safetensors (never pickle).

Trained weights come out of DeepSpeed as views into one flat buffer, and tied weights (an output head
sharing the embedding) appear under two names; safetensors refuses both. So each distinct tensor is
copied out once, under its first name, and loading restores the aliases through the model's own tying.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

WEIGHTS = "model.safetensors"


def save_weights(model: nn.Module, out_dir: Path) -> Path:
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        if key not in seen:
            seen.add(key)
            tensors[name] = tensor.detach().to("cpu").clone().contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / WEIGHTS))
    return out_dir / WEIGHTS


def load_weights(model: nn.Module, model_dir: Path) -> nn.Module:
    from safetensors.torch import load_file

    missing, unexpected = model.load_state_dict(load_file(str(Path(model_dir) / WEIGHTS)), strict=False)
    state = model.state_dict()
    loaded_ptrs = {state[n].data_ptr() for n in state if n not in missing}
    untied = [n for n in missing if state[n].data_ptr() not in loaded_ptrs]
    if untied or unexpected:
        raise ValueError(
            f"{model_dir}: weights do not fit the model (missing {untied}, unexpected {unexpected})"
        )
    return model


def load_trained(model_dir: Path, arch: str, config: dict, vocab_size: int, seq_len: int) -> nn.Module:
    """A trained model from its safetensors directory: transformers' `save_pretrained` layout (built
    as `build_model` builds it, CPU paths included) or rayb's own weights file."""
    from rayb.models.registry import build_model

    model_dir = Path(model_dir)
    if (model_dir / "config.json").exists():
        from transformers import AutoModelForCausalLM

        return as_rayb_runs(AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True))
    return load_weights(build_model(arch, config, vocab_size, seq_len), model_dir)


def as_rayb_runs(model: nn.Module) -> nn.Module:
    """A transformers model loaded from files or the hub, as `build_model` builds rayb's: Mamba's CPU
    mixers, and no cache unless decoding asks for one."""
    from rayb.models.mamba_cpu import use_cpu_mixers
    from rayb.models.registry import without_default_cache

    return without_default_cache(use_cpu_mixers(model))
