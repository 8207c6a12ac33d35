"""The base of every part of a study file (data, models, training, verdict): strict, frozen, hashable.

Each part's schema lives beside the code that uses it (`rayb/data/spec.py`, `rayb/models/spec.py`,
`rayb/train/spec.py`, `rayb/analysis/spec.py`); `rayb/study.py` composes them. Field validators check only
a value's form. Whatever needs the disk, the network or a built model is checked once, in
`Study.resolve()`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, model_validator

# Marks a field added after study format 1: it enters a hash only when set to something other than its
# default, so adding a setting never renames the outputs of studies that do not use it.
_ADDED = "added_after_v1"


def added_field(default: Any, **kwargs: Any) -> Any:
    """A Field for a setting added after format 1 (see `Spec.hashed`)."""
    return Field(default, json_schema_extra={_ADDED: True}, **kwargs)


class Spec(BaseModel):
    # Unknown keys are errors: a misspelt field silently ignored is a wrong experiment.
    model_config = ConfigDict(extra="forbid", frozen=True)
    # The study file's directory, against which relative paths in it are read (not part of any hash: the
    # same file means the same study wherever it is checked out, e.g. in a `ray job submit` working dir).
    _base_dir: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _remember_base_dir(self, info: ValidationInfo) -> Spec:
        if info.context and info.context.get("base_dir") is not None:
            self._base_dir = Path(info.context["base_dir"])
        return self

    @property
    def base_dir(self) -> Path:
        return (self._base_dir or Path.cwd()).resolve()

    def hashed(self) -> dict[str, Any]:
        """The JSON form that hashes name outputs after: every field, except settings added after format 1
        that still hold their default."""
        return _prune(self, self.model_dump(mode="json"))


def _prune(spec: Spec, dumped: dict[str, Any]) -> dict[str, Any]:
    for name, field in type(spec).model_fields.items():
        value = getattr(spec, name)
        if (field.json_schema_extra or {}).get(_ADDED) and value == field.get_default(
            call_default_factory=True
        ):
            dumped.pop(name, None)
        elif isinstance(value, Spec):
            dumped[name] = _prune(value, dumped[name])
        elif isinstance(value, (list, tuple)):
            dumped[name] = [
                _prune(v, d) if isinstance(v, Spec) else d for v, d in zip(value, dumped[name], strict=True)
            ]
        elif isinstance(value, dict):
            dumped[name] = {
                k: _prune(v, dumped[name][k]) if isinstance(v, Spec) else dumped[name][k]
                for k, v in value.items()
            }
    return dumped
