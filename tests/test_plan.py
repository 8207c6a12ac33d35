"""`rayb plan` and the team studies: those of small models pack several trials to a GPU. Pure: no Ray,
no training."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rayb.cli import app
from rayb.study import load_study
from rayb.tune.packs import Capacity, trial_slots

CONFIGS = Path(__file__).parent.parent / "configs"
GATE = CONFIGS / "groundthink-gate.yaml"
runner = CliRunner()


def _plan(*args: str) -> str:
    result = runner.invoke(app, ["plan", *map(str, args)])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


PACKED = {"groundthink-gate": 4, "some-vs-gpt2": 4}  # team studies of small models: trials per GPU


@pytest.mark.parametrize("name", ["groundthink-gate", "some-vs-gpt2", "neuromorphic", "titans", "backpack"])
def test_team_studies_of_small_models_pack_several_trials_to_a_gpu(name):
    if name not in PACKED:  # large models (or backpack's 250K-token head): whole GPUs, as planned
        assert "gpus_per_trial" not in yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["train"]
        return
    study = load_study(CONFIGS / f"{name}.yaml")
    assert study.train.gpus_per_trial == 1 / PACKED[name] and study.train.num_workers == 1
    assert trial_slots(study.train, Capacity.of_gpus(8)) == 8 * PACKED[name]


def test_plan_shows_the_gate_study_four_trials_to_a_gpu():
    text = _plan(GATE)
    assert "0.25 GPUs per trial" in text and "32 groups at once (32 fit, 4 to a GPU)" in text
