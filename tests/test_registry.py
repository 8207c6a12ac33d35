"""One registry type for architectures, eval suites, data schemes and corpora: duplicates refused, unknown
names answered with the closest ones, built-ins imported only when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rayb.data.sources import SCHEMES, register_scheme
from rayb.eval.corpora import CORPORA, HubCorpus, register_corpus
from rayb.eval.lm import LMOptions, run_lm
from rayb.eval.registry import BENCHMARKS, Benchmark, register_benchmark
from rayb.models.registry import ARCHITECTURES, Architecture, get_arch, register
from rayb.registry import Registry, UnknownName


def test_a_duplicate_name_is_refused_not_overwritten():
    registry = Registry[int]("widget")
    registry.register("one", 1)
    with pytest.raises(ValueError, match="widget 'one' is already registered"):
        registry.register("one", 2)
    assert registry.get("one") == 1


def test_an_unknown_name_gets_the_closest_known_ones():
    registry = Registry[int]("widget")
    for name in ("mamba", "mamba2", "pythia"):
        registry.register(name, 0)
    with pytest.raises(UnknownName, match=r"unknown widget 'mamab'; did you mean 'mamba' or 'mamba2'\?"):
        registry.get("mamab")
    with pytest.raises(UnknownName, match=r"unknown widget 'xyz' \(available: mamba, mamba2, pythia\)"):
        registry.get("xyz")


def test_built_ins_are_imported_on_first_use(tmp_path, monkeypatch):
    (tmp_path / "widgets_builtin.py").write_text(
        "from test_registry_shared import REGISTRY\nREGISTRY.register('made', 42)\nREGISTRY.register('also', 7)\n"
    )
    (tmp_path / "test_registry_shared.py").write_text(
        "from rayb.registry import Registry\nREGISTRY = Registry('widget', builtins={'made': 'widgets_builtin', "
        "'also': 'widgets_builtin'})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from test_registry_shared import REGISTRY

    assert REGISTRY.names() == ["also", "made"] and "made" in REGISTRY
    assert "widgets_builtin" not in sys.modules  # listing names imports nothing
    assert REGISTRY.get("made") == 42 and "widgets_builtin" in sys.modules
    with pytest.raises(ValueError, match="already registered"):  # a user's entry never shadows a built-in
        REGISTRY.register("also", 0)


@pytest.mark.parametrize(
    ("register_again", "registry"),
    [
        (lambda: register(Architecture("gpt2", dict, dict)), ARCHITECTURES),
        (lambda: register_benchmark(Benchmark("lm", 1, run_lm, LMOptions, "again")), BENCHMARKS),
        (lambda: register_scheme("embedded")(lambda uri, root: None), SCHEMES),
        (lambda: register_corpus("wikitext2", HubCorpus("x", None, "test", "text")), CORPORA),
    ],
    ids=["architecture", "benchmark", "scheme", "corpus"],
)
def test_every_registry_refuses_duplicates(register_again, registry):
    before = registry.items()
    with pytest.raises(ValueError, match="already registered"):
        register_again()
    assert registry.items() == before


def test_unknown_architecture_suggests_and_mentions_import_paths():
    with pytest.raises(
        ValueError, match=r"did you mean 'mamba' or 'mamba2'.*or an import path 'pkg.module:build'"
    ):
        get_arch("mamba3")


def test_validating_a_study_without_lm_eval_suites_does_not_import_lm_eval():
    code = (
        "import sys\nfrom rayb.study import load_study\nload_study('configs/titans.yaml')\n"
        "print(sorted(m for m in ('lm_eval', 'rayb.eval.harness', 'rayb.eval.speed') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    # titans evaluates speed (imported to check its options), never an lm-eval task
    assert out.stdout.split("\n")[-2] == "['rayb.eval.speed']", out.stdout + out.stderr
