"""The study file's `tracking:` part: which experiment trackers mirror a study's trials.

Tracking never changes a result, so it enters no trial key and no study hash (`Study.fingerprint`): turning
a tracker on or off reuses every finished trial and writes the same study directory.
"""

from __future__ import annotations

import importlib.util
import re

from pydantic import Field, field_validator

from rayb.spec import Spec

EXTRA = "pip install 'rayb[track]'"  # the extra that installs every tracker's client library

# What MLflow itself accepts as a tracking URI, without its database stores (they need SQLAlchemy, which
# the light mlflow-skinny client leaves out).
_MLFLOW_SCHEMES = ("http", "https", "file", "databricks")


class WandbSpec(Spec):
    project: str = Field(min_length=1, description="the W&B project every trial's run is logged to")
    entity: str | None = Field(
        default=None, description="the W&B team or user (default: your default entity)"
    )


class TrackingSpec(Spec):
    tensorboard: bool = Field(
        default=False, description="write TensorBoard event files per trial, under <study dir>/tensorboard"
    )
    mlflow: str | None = Field(
        default=None,
        description="an MLflow tracking URI: http(s)://HOST[:PORT], file:///ABS/DIR, a directory, or databricks",
    )
    wandb: WandbSpec | None = Field(
        default=None, description="{project: NAME[, entity: TEAM]}; WANDB_MODE=offline keeps runs local"
    )

    @field_validator("mlflow")
    @classmethod
    def _mlflow_uri(cls, value: str | None) -> str | None:
        if value is None:
            return value
        scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", value)
        if scheme and len(scheme.group(1)) > 1 and scheme.group(1).lower() not in _MLFLOW_SCHEMES:
            raise ValueError(
                f"'{value}' is not an MLflow tracking URI rayb can use; give http(s)://HOST[:PORT] (a tracking "
                "server), file:///ABS/DIR or a directory (a local file store), or databricks"
            )
        if (
            scheme
            and scheme.group(1).lower() in ("http", "https")
            and not re.match(r"^https?://[^/\s]+", value)
        ):
            raise ValueError(f"'{value}': an MLflow server URI is http(s)://HOST[:PORT]")
        return value

    @field_validator("wandb", mode="before")
    @classmethod
    def _wandb_project(cls, value):
        if value is True or isinstance(value, str):  # `wandb: true` or `wandb: NAME`: say the form wanted
            raise ValueError("give the project as a mapping: `wandb: {project: NAME}`")
        return value

    @property
    def enabled(self) -> list[str]:
        """The trackers turned on, by name (rayb/track TRACKERS)."""
        return [name for name in ("tensorboard", "mlflow", "wandb") if getattr(self, name)]

    def problems(self) -> list[tuple[str, str]]:
        """(field, message) for each tracker turned on whose client library is not installed: found before
        Ray starts, and without importing the library."""
        modules = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
        return [
            (name, f"needs the {modules[name]} package, which is not installed: {EXTRA}")
            for name in self.enabled
            if importlib.util.find_spec(modules[name]) is None
        ]
