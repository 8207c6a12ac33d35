"""The `models:` entries of a study: an architecture and its shape (by config, size or preset), a pretrained
reference that is only evaluated, or a finetuning arm that starts from a checkpoint."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rayb.models.registry import ARCHITECTURES, get_arch, is_import_path
from rayb.spec import Spec

PRETRAINED_ARCH = "pretrained"  # a `pretrained:` reference's architecture: whatever its checkpoint holds
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
STUDY_REF = re.compile(r"^study:(?P<file>[^#]+)#(?P<model>[A-Za-z0-9_.-]+)$")
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class CheckpointRef:
    """Where a `pretrained:` or `init_from:` value points, its relative paths read from the study file's
    directory: a save_pretrained directory, a hub id, or MODEL's final weights in another study."""

    source: str  # as the study wrote it
    kind: Literal["directory", "hub", "study"]
    location: str  # the absolute directory or study file; the hub id
    model: str | None = None  # for a study reference


def checkpoint_ref(source: str, base_dir: Path) -> CheckpointRef:
    """Parse a checkpoint reference; ValueError when it names nothing (checks the disk, not the hub)."""
    if ref := STUDY_REF.match(source):
        return CheckpointRef(source, "study", str(base_dir / Path(ref["file"]).expanduser()), ref["model"])
    path = base_dir / Path(source).expanduser()
    if path.exists() or source.startswith(("/", ".", "~")):
        if not (path / "config.json").is_file():
            raise ValueError(
                f"'{source}' is not a save_pretrained directory (no config.json in {path}); give such a "
                "directory, a hub id like EleutherAI/pythia-160m, or study:FILE#MODEL"
            )
        return CheckpointRef(source, "directory", str(path.resolve()))
    if not HUB_ID.match(source):
        raise ValueError(
            f"'{source}' is neither an existing directory, a hub id like EleutherAI/pythia-160m, "
            "nor study:FILE#MODEL"
        )
    return CheckpointRef(source, "hub", source)


class ModelSpec(Spec):
    pretrained: str | None = Field(
        default=None,
        description="evaluate this checkpoint as a reference point and never train it, with its own "
        "tokenizer: a local save_pretrained directory, a hub id, or study:FILE#MODEL (MODEL's final "
        "weights in that study, which rayb runs first); paths are relative to the study file",
    )
    preset: str | None = Field(default=None, description="a named configuration (`rayb params --list`)")
    arch: str | None = Field(
        default=None,
        validate_default=True,
        description="a registered architecture name or an import path 'pkg.module:build'",
    )
    size: str | int | None = Field(
        default=None, description="solve the shape for this many parameters, e.g. 30M (instead of a config)"
    )
    size_by: Literal["total", "non-embedding"] = "total"
    name: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.-]+$", description="label in reports; defaults to the arch name"
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="architecture keyword arguments (with size: the keys to keep fixed)"
    )
    init_from: str | None = Field(
        default=None,
        description="start training from these weights instead of a fresh initialisation (a finetuning "
        "arm): a save_pretrained directory, a hub id or study:FILE#MODEL, of the same architecture and shape",
    )

    @field_validator("pretrained", "init_from")
    @classmethod
    def _checkpoint_form(cls, source: str | None) -> str | None:
        if source is not None and source.startswith("study:") and not STUDY_REF.match(source):
            raise ValueError(f"'{source}': write a study reference as study:FILE#MODEL")
        return source

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str | None) -> str | None:
        from rayb.models.presets import get_preset

        if preset is not None:
            get_preset(preset)
        return preset

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, arch: str | None, info: ValidationInfo) -> str | None:
        if "preset" not in info.data or "pretrained" not in info.data:  # invalid, and already reported
            return arch
        if info.data["pretrained"] is not None:
            if arch is not None or info.data["preset"] is not None:
                raise ValueError("a pretrained model brings its own architecture; drop arch and preset")
            return arch
        if arch is None and info.data["preset"] is None:
            raise ValueError("required field is missing (or give preset: NAME instead)")
        if arch is not None and info.data["preset"] is not None:
            raise ValueError("give arch or preset, not both")
        if arch is not None and is_import_path(arch):
            if not IMPORT_PATH.match(arch):
                raise ValueError(f"'{arch}': write an import path as pkg.module:build")
        elif arch is not None:
            ARCHITECTURES.get(arch)  # an unknown name says which are known, and which is closest
        return arch

    @field_validator("size")
    @classmethod
    def _size_form(cls, size: str | int | None) -> str | int | None:
        from rayb.models.sizing import parse_size

        if size is not None:
            parse_size(size)
        return size

    @model_validator(mode="after")
    def _size_needs_arch(self) -> ModelSpec:
        if self.preset and self.size is not None:
            raise ValueError(f"preset '{self.preset}' fixes the size; drop size, or use arch with size")
        if self.pretrained and (self.size is not None or self.config or self.init_from):
            raise ValueError("a pretrained model is evaluated as it is; drop size, config and init_from")
        return self

    def problems(self) -> Iterator[tuple[str, str]]:
        """What only the disk can tell: a checkpoint that names nothing, a user's model that does not
        import. (location, message) pairs, as `Study.resolve` reports them."""
        for field in ("pretrained", "init_from"):
            if (source := getattr(self, field)) is not None:
                try:
                    checkpoint_ref(source, self.base_dir)
                except ValueError as exc:
                    yield field, str(exc)
        if self.arch is not None and is_import_path(self.arch):
            try:
                get_arch(self.arch)
            except ValueError as exc:
                yield "arch", str(exc)

    @property
    def checkpoint(self) -> CheckpointRef | None:
        """The checkpoint this entry evaluates or starts from."""
        source = self.pretrained or self.init_from
        return None if source is None else checkpoint_ref(source, self.base_dir)

    @property
    def architecture(self) -> str:
        from rayb.models.presets import get_preset

        if self.pretrained:
            return PRETRAINED_ARCH
        return self.arch or get_preset(self.preset).arch

    @property
    def label(self) -> str:
        # Labels name trial directories, so an import path's ':' becomes '.'.
        if self.pretrained:
            ref = STUDY_REF.match(self.pretrained)
            return self.name or (ref["model"] if ref else Path(self.pretrained.rstrip("/")).name)
        return self.name or self.preset or self.arch.replace(":", ".")

    def resolve(self, vocab_size: int, seq_len: int, device: str) -> dict[str, Any]:
        """The architecture config this entry trains with on `device` ("cpu" or "cuda"): the study's
        vocabulary and context, and every default that differs by device pinned, so the model that
        trains is the model whose FLOPs were counted."""
        from rayb.models.presets import get_preset
        from rayb.models.sizing import match, parse_size

        if self.preset:
            config = get_preset(self.preset).config | self.config
        elif self.size is None:
            config = dict(self.config)
        else:
            config = match(
                self.arch, parse_size(self.size), self.size_by, vocab_size, seq_len, self.config
            ).config
        return get_arch(self.architecture).pinned(device) | config


class ChecksSpec(Spec):
    """The `checks:` part: models whose failed self-check (rayb/models/selfcheck.py) may be overridden.
    Every score such a check affects is marked in the report with the error measured."""

    allow_decoding_mismatch: list[str] = Field(
        default=[],
        description="models whose decoding may differ from their full forward pass; their speed scores are "
        "marked in the report",
    )
    allow_fast_path_mismatch: list[str] = Field(
        default=[],
        description="models whose fast path (fused scan, chunked or GPU kernel) may differ from its reference; "
        "all their scores are marked in the report",
    )

    def allowed(self, model: str, check: str) -> bool:
        return model in getattr(self, f"allow_{check.replace(' ', '_')}_mismatch")
