"""Study features the teams' plans need, checked without training: pretrained references and init_from
checkpoints, epochs, byte-level and struct-column data, generated eval corpora, `rayb data prepare`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml
from conftest import tiny_study_dict
from typer.testing import CliRunner

from rayb.cli import app
from rayb.data.cache import epoch_batch
from rayb.data.parallel import parallel_rows, translate
from rayb.data.units import columns, text_values
from rayb.eval.corpora import load_corpus, resolve_corpus
from rayb.models import build_model
from rayb.models.pretrained import (
    Checkpoint,
    count_checkpoint_params,
    hub_checkpoint,
    initialise_from,
    load_model,
)
from rayb.study import StudyError, parse_study


def _study(**changes):
    raw = tiny_study_dict()
    for key, value in changes.items():
        raw[key] = value
    return raw


def _error(raw) -> str:
    with pytest.raises(StudyError) as info:
        parse_study(raw)
    return str(info.value)


@pytest.fixture
def saved_gpt2(tmp_path):
    model = build_model("gpt2", {"d_model": 32, "n_layer": 1, "n_head": 2}, 512, 32)
    model.save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2", model


def test_a_pretrained_reference_is_a_model_without_training(saved_gpt2):
    path, _ = saved_gpt2
    assert "model labels must be unique" in _error(
        _study(models=[*tiny_study_dict()["models"], {"pretrained": str(path)}])
    )
    renamed = parse_study(
        _study(models=[tiny_study_dict()["models"][0], {"pretrained": str(path), "name": "ref"}])
    )
    assert renamed.models[1].label == "ref" and renamed.models[1].architecture == "pretrained"
    assert [m.label for m in renamed.trained_models] == ["gpt2"]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"pretrained": "/no/such/dir"}, "is not a save_pretrained directory"),
        ({"pretrained": "not a hub id!"}, "neither an existing directory"),
        ({"pretrained": "EleutherAI/pythia-14m", "arch": "gpt2"}, "drop arch and preset"),
        ({"pretrained": "EleutherAI/pythia-14m", "size": "1M"}, "evaluated as it is"),
        ({"arch": "gpt2", "name": "arm", "init_from": "study:configs/nope.yaml#gpt2"}, "no such study file"),
        (
            {"arch": "gpt2", "name": "arm", "init_from": "study:configs/smoke.yaml#nobody"},
            "trains no model 'nobody'",
        ),
    ],
)
def test_bad_checkpoint_references_are_refused_naming_the_field(entry, expected):
    message = _error(
        _study(models=[{"arch": "gpt2", "config": {"d_model": 32, "n_layer": 2, "n_head": 2}}, entry])
    )
    assert "models.1" in message and expected in message


def test_a_study_of_only_pretrained_models_is_refused():
    assert "trains at least one model" in _error(_study(models=[{"pretrained": "EleutherAI/pythia-14m"}]))


def test_study_references_that_cycle_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, other in (("a", "b"), ("b", "a")):
        raw = _study(name=name)
        raw["models"] = [raw["models"][0] | {"init_from": f"study:{other}.yaml#gpt2"}]
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["validate", "a.yaml"])
    assert result.exit_code == 2 and "cycle" in result.output


def test_initialise_from_copies_weights_and_refuses_other_shapes(saved_gpt2):
    path, source = saved_gpt2
    checkpoint = Checkpoint(source=str(path), model=str(path), tokenizer=str(path), key=str(path))
    fresh = build_model("gpt2", {"d_model": 32, "n_layer": 1, "n_head": 2}, 512, 32)
    initialise_from(fresh, checkpoint)
    for (name, a), b in zip(fresh.state_dict().items(), source.state_dict().values(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy()), name
    wider = build_model("gpt2", {"d_model": 64, "n_layer": 1, "n_head": 2}, 512, 32)
    with pytest.raises(ValueError, match="does not fit the model: shape mismatch"):
        initialise_from(wider, checkpoint)
    assert count_checkpoint_params(checkpoint)[0] == sum(p.numel() for p in source.parameters())


def test_a_local_save_pretrained_directory_loads_as_saved(saved_gpt2):
    path, source = saved_gpt2
    loaded = load_model(hub_checkpoint(str(path), str(path))).eval()
    ids = torch.randint(0, 512, (2, 16))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, source.eval()(ids).logits)


def test_epochs_reorder_batches_identically_for_every_model():
    first = [epoch_batch(s, 10, seed=7) for s in range(10)]
    second = [epoch_batch(s, 10, seed=7) for s in range(10, 20)]
    assert first == list(range(10))  # epoch 0 in stored order: one-epoch studies are unchanged
    assert sorted(second) == list(range(10)) and second != first  # every batch once, in a new order
    assert second == [epoch_batch(s, 10, seed=7) for s in range(10, 20)]  # a function of the data alone
    assert second != [epoch_batch(s, 10, seed=8) for s in range(10, 20)]
    study = parse_study(_study(train=tiny_study_dict()["train"] | {"epochs": 3}))
    assert study.steps == 3 * study.steps_per_epoch


def test_byte_tokenizer_and_declared_vocabulary():
    data = tiny_study_dict()["data"]
    assert parse_study(_study(data=data | {"tokenizer": "bytes"})).data.nominal_vocab == 257
    assert "contradicts" in _error(_study(data=data | {"vocab_size": 1000}))
    hub = parse_study(_study(data=data | {"tokenizer": "openai-community/gpt2", "vocab_size": 50257}))
    assert hub.data.nominal_vocab == 50257


def test_struct_text_columns_and_the_parallel_stand_in():
    table = parallel_rows(4, seed=0)
    assert columns(table.schema) == ["translation", "translation.en", "translation.fr"]
    english, french = text_values(table, "translation.en"), text_values(table, "translation.fr")
    assert french == [translate(line) for line in english] and french != english
    assert translate("The river") == translate("The river")  # a consistent "language"
    assert text_values(pa.table({"text": ["a"]}), "text") == ["a"]
    assert "pattern" in _error(_study(data={**tiny_study_dict()["data"], "sources": [
        {"name": "x", "uri": "embedded://europarl", "weight": 1.0, "text_column": "translation..fr"}]}))  # fmt: skip


def test_generated_eval_corpora():
    assert resolve_corpus("embedded://web?docs=2&seed=3", Path.cwd()) == "embedded://web?docs=2&seed=3"
    assert load_corpus("embedded://web?docs=2&seed=3") == load_corpus("embedded://web?docs=2&seed=3")
    assert load_corpus("embedded://web?docs=2&seed=3") != load_corpus("embedded://web?docs=2&seed=4")
    with pytest.raises(ValueError, match="text sources"):
        resolve_corpus("embedded://europarl?docs=2", Path.cwd())


@pytest.mark.ray
def test_data_prepare_caches_local_data_and_names_what_it_cannot_fetch(ray_session, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("RAYB_CORPORA", str(tmp_path / "corpora"))
    raw = _study(eval=["lm", "lm:wikitext2", "lm_eval:rayb_facts", "lm_eval:hellaswag", "lm_eval:piqa"])
    raw["models"].append({"pretrained": "EleutherAI/pythia-14m"})
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(
        app, ["data", "prepare", str(tmp_path / "study.yaml"), "-o", str(tmp_path / "out")]
    )
    assert result.exit_code == 1, result.output
    lines = " ".join(result.output.split())
    assert "ok data (tokenize, pack, mix)" in lines and any((tmp_path / "out" / "cache" / "data").iterdir())
    assert "missing corpus wikitext2" in lines and "missing pretrained EleutherAI/pythia-14m" in lines
    assert "missing lm_eval hellaswag" in lines and "missing lm_eval piqa" in lines
    assert "rayb_facts" not in lines  # rayb's own tasks are generated, nothing to fetch


def test_data_prepare_builds_an_lm_eval_task_it_can_reach(tmp_path, monkeypatch):
    """What `rayb data prepare` does for a reachable lm-eval task or group (offline here: rayb's own tasks,
    whose data is local, through lm-eval's TaskManager as the hub's go): builds every task, and so loads
    its data, and counts a group's tasks."""
    from lm_eval.tasks import TaskManager

    from rayb.data import prepare
    from rayb.eval import harness

    for task in ("rayb_facts", "rayb_text"):
        harness.rayb_tasks(tmp_path, task, n_docs=4, fits=lambda _: True)
    (tmp_path / "rayb_both.yaml").write_text("group: rayb_both\ntask: [rayb_facts, rayb_text]\n")
    local = TaskManager(include_path=str(tmp_path), include_defaults=False)
    monkeypatch.setattr(harness, "lm_eval_tasks", lambda: local)
    assert prepare._lm_eval_task("rayb_facts") == "1 task(s) loaded into the datasets cache"
    assert prepare._lm_eval_task("rayb_both") == "2 task(s) loaded into the datasets cache"
