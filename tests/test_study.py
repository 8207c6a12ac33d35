"""The study schema: valid files load, invalid ones fail before Ray starts and name the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from conftest import tiny_study_dict
from typer.testing import CliRunner

from rayb.cli import app
from rayb.study import StudyError, load_study, parse_study

CONFIGS = Path(__file__).parent.parent / "configs"


def test_shipped_smoke_study_is_valid():
    study = load_study(CONFIGS / "smoke.yaml")
    assert {m.arch for m in study.models} >= {"gpt2", "llama", "mamba"}
    assert len(study.seeds) >= 2
    assert study.steps == study.data.token_budget // (study.data.seq_len * study.train.global_batch)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_study_is_valid(path):
    study = load_study(path)
    for model in study.trained_models:  # every size resolves, every budget fits the data
        study.model_steps(model, study.data.nominal_vocab)


def test_defaults_and_normalisation():
    study = parse_study(tiny_study_dict(seeds=3))
    assert study.seeds == [0, 1, 2]
    assert study.train.lr == [3e-3]  # a scalar lr becomes a one-point sweep
    assert study.reference == "gpt2"  # the first model when none is named
    assert study.train.resolved_precision == "fp32"  # auto on CPU


def _broken(path: tuple, value):
    raw = copy.deepcopy(tiny_study_dict())
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("data", "sources", 0, "weight"), 0.7, "data: source weights must sum to 1"),
        (("models", 1, "arch"), "transformer9000", "models.1.arch: unknown architecture 'transformer9000'"),
        (
            ("models", 0, "arch"),
            "no_such_pkg.mod:build",
            "models.0.arch: cannot import 'no_such_pkg.mod:build'",
        ),
        (("train", "global_batch"), 6, "train: global_batch (6) must be a multiple of micro_batch"),
        (("train", "zero_stage"), 3, "train.zero_stage"),
        (("train", "lr"), -1.0, "train.lr: learning rates must be in (0, 1)"),
        (("data", "sources", 0, "uri"), "/nonexistent/shards", "data.sources.0.uri: no parquet files at"),
        (("data", "sources", 0, "uri"), "embedded://wiki", "unknown embedded source 'wiki'"),
        (("data", "sources", 0, "uri"), "ftp://x/y", "unknown data scheme 'ftp://'"),
        (("data", "tokenizer"), "bpe:lots", "data.tokenizer: 'bpe:lots': use bpe:<vocab size>"),
        (("data", "token_budget"), 100, "less than one optimizer step"),
        (("data", "seq_len"), "long", "data.seq_len"),
        (("seeds",), [1, 1], "seeds: seeds must be distinct"),
        (("eval",), ["lm", "vibes"], "eval: unknown eval suite 'vibes'"),
        (("eval_options",), {"speed": {"repeat": 3}}, "eval_options: unknown option(s) ['repeat']"),
        (("verdict",), {"reference": "gpt3"}, "verdict.reference 'gpt3' is not a model label"),
        (("trian",), {}, "trian: unknown field; remove it or check its spelling"),
        (
            ("output_dir",),
            "s3:/bucket/out",
            "output_dir: 's3:/bucket/out': write an object-storage output as s3://bucket/prefix",
        ),
        (
            ("output_dir",),
            "ftp2://bucket/out",
            "output_dir: 'ftp2://bucket/out': unknown storage scheme 'ftp2://'",
        ),
    ],
)
def test_invalid_fields_are_named(path, value, expected):
    with pytest.raises(StudyError) as err:
        parse_study(_broken(path, value))
    assert expected in str(err.value)


def test_missing_required_field():
    raw = tiny_study_dict()
    del raw["data"]["token_budget"]
    with pytest.raises(StudyError, match=r"data.token_budget: required field is missing"):
        parse_study(raw)


def test_duplicate_model_labels_need_names():
    raw = tiny_study_dict()
    raw["models"].append(dict(raw["models"][0]))
    with pytest.raises(StudyError, match="model labels must be unique"):
        parse_study(raw)
    raw["models"][-1]["name"] = "gpt2-b"
    assert parse_study(raw).models[-1].label == "gpt2-b"


def test_trial_keys_separate_what_matters():
    study = parse_study(tiny_study_dict())
    gpt2 = study.models[0]
    key = study.trial_key(gpt2, 3e-3, 0, "data1")
    assert key == study.trial_key(gpt2, 3e-3, 0, "data1")
    assert (
        len(
            {
                key,
                study.trial_key(gpt2, 3e-3, 1, "data1"),
                study.trial_key(gpt2, 1e-3, 0, "data1"),
                study.trial_key(gpt2, 3e-3, 0, "data2"),
                study.trial_key(study.models[1], 3e-3, 0, "data1"),
            }
        )
        == 5
    )
    # Scheduling does not change results, so it does not change the key.
    raw = tiny_study_dict()
    raw["train"]["max_concurrent_trials"] = 1
    assert parse_study(raw).trial_key(gpt2, 3e-3, 0, "data1") == key


def test_a_sized_models_key_follows_the_shape_its_size_resolves_to():
    """`size: 1M` is whatever rayb's solver makes of it: if the solver changes, so does the trial."""
    study = parse_study(tiny_study_dict(models=[{"arch": "gpt2", "size": "1M"}]))
    (sized,) = study.models
    config = study.model_steps(sized, 512)[0]
    key = study.trial_key(sized, 3e-3, 0, "data1", config=config)
    assert key == study.trial_key(sized, 3e-3, 0, "data1", config=dict(config))
    assert key != study.trial_key(sized, 3e-3, 0, "data1", config=config | {"n_layer": config["n_layer"] + 1})
    explicit = study.models[0].model_copy(update={"size": None, "config": config})
    assert study.trial_key(explicit, 3e-3, 0, "data1", config=config) == study.trial_key(
        explicit, 3e-3, 0, "data1"
    )


def test_cli_validate(tmp_path, monkeypatch):
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(CONFIGS / "smoke.yaml")])
    assert ok.exit_code == 0 and "6 trials" in ok.output
    assert "gpt2: gpt2" in ok.output and "1,071,872 parameters" in ok.output  # each model's counted size

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_broken(("models", 1, "arch"), "gpt5")))
    # An invalid study must fail before any cluster work: make starting Ray an error.
    monkeypatch.setattr("rayb.runtime.init_ray", lambda: pytest.fail("Ray started for an invalid study"))
    for command in ("validate", "run"):
        result = runner.invoke(app, [command, str(bad)])
        assert result.exit_code == 2
        assert "models.1.arch" in result.output and "gpt5" in result.output


def test_unreadable_files(tmp_path):
    with pytest.raises(StudyError, match="no such study file"):
        load_study(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed")
    with pytest.raises(StudyError, match="not valid UTF-8 YAML"):
        load_study(broken)


def test_size_and_preset_resolve_with_the_study_vocabulary():
    models = [
        # Sizes the shape family meets within ±2% at this vocabulary (tests/test_sizing.py has the misses).
        {"arch": "llama", "size": "270K", "name": "llama-270k"},
        {"arch": "mamba", "size": "320K", "size_by": "non-embedding", "config": {"d_state": 4}},
        {"preset": "pythia-70m", "config": {"n_layer": 1}},
    ]
    study = parse_study(tiny_study_dict(models=models))
    vocab = study.data.nominal_vocab
    assert vocab == 512
    llama, mamba, pythia = (study.model_steps(m, vocab) for m in study.models)
    assert abs(llama[1].total_params / 270_000 - 1) <= 0.02
    assert abs(mamba[1].non_embedding_params / 320_000 - 1) <= 0.02 and mamba[0]["d_state"] == 4
    assert pythia[0] == {"d_model": 512, "n_layer": 1, "n_head": 8}  # the preset's shape, study's vocabulary
    assert [m.label for m in study.models] == ["llama-270k", "mamba", "pythia-70m"]
    assert study.models[2].architecture == "pythia"


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"arch": "gpt2", "size": "10K"}, "too small for gpt2"),
        ({"arch": "gpt2", "size": "1T", "config": {"n_layer": 2}}, "beyond gpt2's family"),
        ({"arch": "gpt2", "size": "lots"}, "not a size"),
        ({"preset": "gpt2-huge"}, "unknown preset"),
        ({"preset": "gpt2", "size": "30M"}, "fixes the size"),
        ({"config": {"d_model": 32}}, "models.0.arch: required field is missing"),
        ({"arch": "gpt2", "preset": "gpt2"}, "not both"),
    ],
)
def test_impossible_or_ambiguous_sizes_fail_naming_the_model(model, message):
    with pytest.raises(StudyError, match=message):
        parse_study(tiny_study_dict(models=[model]))


def test_matched_compute_gives_each_model_the_same_flops():
    models = [
        {"arch": "gpt2", "config": {"d_model": 32, "n_layer": 2, "n_head": 2}},
        {"arch": "gpt2", "name": "wide", "config": {"d_model": 64, "n_layer": 2, "n_head": 2}},
    ]
    raw = tiny_study_dict(models=models)
    raw["train"]["flops_budget"] = 1e9
    study = parse_study(raw)
    (small_cfg, small, small_steps), (_, wide, wide_steps) = (study.model_steps(m, 512) for m in study.models)
    assert wide_steps < small_steps <= study.steps
    tokens_per_step = study.train.global_batch * study.data.seq_len
    for cost, steps in ((small, small_steps), (wide, wide_steps)):
        spent = steps * tokens_per_step * cost.train_flops_per_token
        assert 1e9 - cost.train_flops_per_token * tokens_per_step < spent <= 1e9
    raw["train"]["flops_budget"] = 1e13  # more tokens than the data holds
    with pytest.raises(StudyError, match="more than data.token_budget"):
        parse_study(raw)


# Hashes name every output directory. The trial keys were computed by rayb before its study schema was split
# by component (commit 1eef507): a refactor that changes one would orphan every finished trial. The study
# hashes changed once since, on purpose: the gate's `significance` replaced `significance_alpha`, so every
# study's verdict is a new one (its trials are reused). some-vs-gpt2's and groundthink-gate's files changed
# their training on purpose (one worker per trial, four trials to a GPU, smaller micro-batches), before any
# of their trials had run: their hashes are those of the new files.
STORED_HASHES = {
    "smoke.yaml": ("e2d27f713dde", {"gpt2": "754ef53e377f", "llama": "86eb31db125f", "mamba": "8a52a3d615b3"}),
    "some-vs-gpt2.yaml": ("e95241e99aa2", {"gelu-mlp": "651e8c478f01", "some": "696afd593752"}),
    "titans.yaml": ("c78b0eaa5a9e", {"transformerpp-50m": "fd35da1d24ce", "mamba2-360m": "b956cf6205ba",
                                     "gdn-760m": "740e20f5a71f"}),
    "groundthink-gate.yaml": ("55e507a2f9fb", {"gpt2-125m": "1aff48772837", "candidate-3.5m": "1d84aa2ef933"}),
    "zoo.yaml": ("3a7e4a62914e", {"nanogpt": "bcd30101f0b9", "rwkv6": "016c4e3ad326", "moe": "f85321a71061"}),
}  # fmt: skip
SMOKE_DATA_KEY = "1500b9d67438"  # format 2: a random held-out sample


@pytest.mark.parametrize("name", sorted(STORED_HASHES))
def test_study_and_trial_hashes_are_those_stored(name):
    study = load_study(CONFIGS / name)
    fingerprint, trial_keys = STORED_HASHES[name]
    assert study.fingerprint() == fingerprint
    models = {m.label: m for m in study.models}
    for label, key in trial_keys.items():
        assert study.trial_key(models[label], study.train.lr[0], study.seeds[0], "datakey0") == key, label


def test_the_data_key_is_the_one_stored():
    from rayb.data import corpus
    from rayb.data.pipeline import data_key
    from rayb.data.sources import ResolvedSource, embedded_args

    spec = load_study(CONFIGS / "smoke.yaml").data
    content = {
        s.name: ResolvedSource([], None, [*embedded_args(s.uri), corpus.GENERATOR_VERSION])
        for s in spec.sources
    }
    assert data_key(spec, content) == SMOKE_DATA_KEY


def test_a_setting_added_later_enters_hashes_only_when_used():
    raw = tiny_study_dict()
    plain = parse_study(raw)
    raw["train"]["allow_slow_kernels"] = True
    allowed = parse_study(raw)
    assert "allow_slow_kernels" not in plain.train.hashed() and allowed.train.hashed()["allow_slow_kernels"]
    assert plain.fingerprint() != allowed.fingerprint()


def test_relative_paths_are_read_from_the_study_files_directory(tmp_path, monkeypatch):
    """`cd configs && rayb run backpack.yaml`: study references, local data, tokenizer directories and
    corpus files all resolve against the file, not the current directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayb.data.tokenizer import load_tokenizer, train_bpe

    study_dir = tmp_path / "studies"
    (study_dir / "data").mkdir(parents=True)
    pq.write_table(
        pa.table({"text": ["a document", "another one"] * 50}), study_dir / "data" / "part.parquet"
    )
    train_bpe(["a document", "another one"] * 50, 300, study_dir / "tok")
    (study_dir / "eval.txt").write_text("held-out text to score")
    raw = tiny_study_dict()
    raw["data"] |= {"sources": [{"name": "local", "uri": "data/", "weight": 1.0}], "tokenizer": "tok"}
    raw["eval"] = ["lm", "lm:eval.txt"]
    (study_dir / "study.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)  # anywhere but the study's directory
    study = load_study(study_dir / "study.yaml")
    assert study.data.sources[0].location == str(study_dir / "data")
    assert study.data.tokenizer_location == str(study_dir / "tok")
    assert study.data.nominal_vocab == len(load_tokenizer(study_dir / "tok"))  # read from there, not from cwd
    from rayb.eval.registry import check_suite_argument

    assert check_suite_argument("lm:eval.txt", study.base_dir) == str(study_dir / "eval.txt")
    monkeypatch.chdir(CONFIGS)
    backpack = load_study("backpack-tiny.yaml")  # names study:backpack-pretrain-tiny.yaml#transformer
    assert backpack.models[2].checkpoint.location == str(CONFIGS / "backpack-pretrain-tiny.yaml")
    result = CliRunner().invoke(app, ["validate", "backpack-tiny.yaml"])
    assert result.exit_code == 0, result.output


def test_a_relative_path_that_names_nothing_is_refused_with_where_it_looked(tmp_path):
    raw = tiny_study_dict()
    raw["data"]["sources"][0]["uri"] = "shards/"
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(
        StudyError, match=rf"data.sources.0.uri: no parquet files at 'shards/' \(looked in {tmp_path}/shards"
    ):
        load_study(tmp_path / "study.yaml")


def test_a_study_without_lm_is_refused_before_any_work(tmp_path):
    """It would train every trial and then have no val_loss to compare: `rayb validate` says so."""
    raw = tiny_study_dict(eval=["long_context"])
    with pytest.raises(StudyError, match="eval: add lm to eval: the verdict compares"):
        parse_study(raw)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "study.yaml")])
    assert result.exit_code == 2 and "eval: add lm to eval" in result.output


def test_a_pretrained_model_is_never_the_reference(saved_checkpoint):
    raw = tiny_study_dict()
    raw["models"] = [{"pretrained": str(saved_checkpoint), "name": "ref"}, *raw["models"]]
    assert parse_study(raw).reference == "gpt2"  # by default the first trained model
    raw["verdict"] = {"reference": "ref"}
    with pytest.raises(
        StudyError, match="verdict.reference 'ref' is a pretrained model, scored in its own tokens"
    ):
        parse_study(raw)


@pytest.fixture
def saved_checkpoint(tmp_path):
    from rayb.models import build_model

    model = build_model("gpt2", {"d_model": 32, "n_layer": 1, "n_head": 2}, 300, 32)
    model.save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_a_bug_in_a_users_builder_keeps_its_cause_and_place(tmp_path, monkeypatch):
    (tmp_path / "buggy_model.py").write_text("def build(config, vocab_size, seq_len):\n    return 1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from rayb.models import build_model
    from rayb.models.registry import ModelBuildError

    with pytest.raises(ModelBuildError) as caught:
        build_model("buggy_model:build", {}, 300, 32)
    assert isinstance(caught.value.__cause__, ZeroDivisionError)  # the user's traceback is kept
    assert f"raised at {tmp_path / 'buggy_model.py'}:2" in str(caught.value)
