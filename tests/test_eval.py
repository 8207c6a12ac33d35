"""Every benchmark family on tiny models, without Ray: each test can tell a good model from a bad one."""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from lm_eval.api.instance import Instance
from oracles import InductionOracle

from rayb.data.corpus import generate_document
from rayb.data.tokenizer import load_tokenizer
from rayb.eval.decoding import Decoder
from rayb.eval.harness import LMEvalOptions, RaybLM, recall_sample, run_lm_eval, study_task_problems
from rayb.eval.lm import LMOptions, run_lm
from rayb.eval.long_context import LongContextOptions, run_long_context
from rayb.eval.probes import ProbeOptions, persistence, run_statefulness
from rayb.eval.recall import RecallOptions, mqar_accuracy, run_recall
from rayb.eval.registry import EvalContext, check_suite_argument, make_options, parse_suite
from rayb.eval.scoring import sliding_window_nll
from rayb.eval.speed import PeakMemory, SpeedOptions, growth_exponent, run_speed
from rayb.models import build_model
from rayb.models.registry import get_arch

ZOO = ["gpt2", "nanogpt", "pythia", "llama", "mamba", "mamba2", "gated_deltanet", "rwkv6"]


@pytest.fixture(scope="module")
def tokenizer(tiny_cache):
    return load_tokenizer(tiny_cache.tokenizer_dir)


def tiny(arch: str, cache, **config) -> torch.nn.Module:
    torch.manual_seed(0)
    shape = get_arch(arch).shape(32, 2) | config
    return build_model(arch, shape, cache.manifest["vocab_size"], cache.seq_len).eval()


def context(model, cache, tokenizer) -> EvalContext:
    return EvalContext(model, tokenizer, cache)


def test_rayb_perplexity_agrees_with_lm_eval_loglikelihood_rolling(tiny_cache, tokenizer):
    model, window = tiny("llama", tiny_cache), 24
    text = generate_document("edu", 99, 0) + "\n" + generate_document("web", 99, 1)
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(tokens) > 5 * window  # several windows, the last one partial
    ours, count = sliding_window_nll(model, tokens, window, window, tokenizer.eos_token_id)
    request = Instance("loglikelihood_rolling", doc={}, arguments=(text,), idx=0)
    (theirs,) = RaybLM(model, tokenizer, max_length=window).loglikelihood_rolling([request])
    assert count == len(tokens)
    assert abs(-theirs - ours) / count < 1e-4 and math.isclose(-theirs, ours, rel_tol=1e-4)


def test_a_model_scores_the_same_bits_per_byte_through_the_reference_path(tiny_cache, tokenizer):
    """A pretrained reference reads the held-out rows as text in its own tokens; a trained model reads them
    in study tokens. Given the study's tokenizer, the reference path must score exactly the same tokens
    over the same bytes: the comparison favours neither."""
    from rayb.eval.lm import own_token_rows

    model = tiny("llama", tiny_cache)
    own = run_lm(context(model, tiny_cache, tokenizer), None, LMOptions())
    as_reference = run_lm(EvalContext(model, tokenizer, tiny_cache, study_tokens=False), None, LMOptions())
    assert math.isclose(own["val_bpb"], as_reference["val_bpb"], rel_tol=1e-6)
    assert as_reference["val_tokens"] == own["val_tokens"]  # positions 1..T-1 of every row
    rows = own_token_rows(tokenizer, tiny_cache.held_out)
    assert [ids for ids, _ in rows] == tiny_cache.val.tolist() and {first for _, first in rows} == {1}


def test_the_held_out_record_is_the_text_behind_every_validation_row(tiny_cache, tokenizer):
    held = tiny_cache.held_out
    assert len(held.rows) == len(tiny_cache.val) and (held.scored_bytes > 0).all()
    for row, items, end in zip(tiny_cache.val, held.rows, held.context_end, strict=True):
        text = "".join(held.documents[d][s:e] for d, s, e in items if d >= 0)
        scored = tokenizer.decode([t for t in row[1:] if t != tokenizer.eos_token_id])
        assert text.endswith(scored)  # the scored tokens are the text after the first token's
        assert (items[0][0] < 0) == (end < 0)  # no context span when the row opens with end-of-text


def test_sliding_window_on_a_corpus_file(tiny_cache, tokenizer, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(generate_document("edu", 7, i) for i in range(3)))
    ctx = context(tiny("gpt2", tiny_cache), tiny_cache, tokenizer)  # learned positions: 32 at most
    wide = run_lm(ctx, str(corpus), make_options(parse_suite("lm")[0], {"window": 64}))
    assert (wide["window"], wide["stride"]) == (32, 16)  # capped at the position table
    tokens = len(tokenizer(corpus.read_text(), add_special_tokens=False)["input_ids"])
    assert wide["tokens"] == tokens and wide["ppl"] == pytest.approx(math.exp(wide["loss"]))
    assert wide["bpb"] == pytest.approx(wide["loss"] * tokens / math.log(2) / len(corpus.read_bytes()))
    disjoint = run_lm(ctx, str(corpus), LMOptions(window=32, stride=32))
    assert disjoint["loss"] != wide["loss"]  # the stride changes what context each token gets
    with pytest.raises(ValueError, match="unknown evaluation corpus 'no-such-corpus'"):
        check_suite_argument("lm:no-such-corpus")


def test_lm_eval_task_runs_through_rayb_template_lm(tiny_cache, tokenizer, monkeypatch, caplog):
    reports = []  # torch's environment report, which lm-eval adds to its results: subprocesses, seconds
    monkeypatch.setattr("torch.utils.collect_env.get_pretty_env_info", lambda: reports.append(1) or "")
    ctx = context(tiny("mamba2", tiny_cache), tiny_cache, tokenizer)
    with caplog.at_level(logging.INFO):
        metrics = run_lm_eval(ctx, "rayb_text", LMEvalOptions(limit=6, rayb_task_docs=12))
    assert reports == []  # rayb keeps none of it
    # Nor lm-eval's lines below an error (its seeds, its notices), in an eval actor's log or here.
    assert [r.getMessage() for r in caplog.records if r.name.startswith("lm_eval")] == []
    assert metrics["sample_len"] == 6 and metrics["bits_per_byte"] > 0 and metrics["task_version"] == "1"
    assert metrics["truncated"] == 0  # rolling windows score every token with no cut context


def test_lm_eval_indexes_its_own_tasks_once_per_process(tiny_cache, tokenizer, monkeypatch):
    """lm-eval's task index reads every task file it ships (seconds): an actor scoring one task on many
    checkpoints builds it once. Here a task lm-eval lacks, asked for twice: each time the error names it."""
    import lm_eval.tasks

    from rayb.eval import harness

    indexed = []
    init = lm_eval.tasks.TaskManager.__init__
    monkeypatch.setattr(
        lm_eval.tasks.TaskManager, "__init__", lambda self, *a, **k: indexed.append(k) or init(self, *a, **k)
    )
    harness.lm_eval_tasks.cache_clear()
    ctx = context(tiny("gpt2", tiny_cache), tiny_cache, tokenizer)
    for _ in range(2):
        with pytest.raises(KeyError, match="no_such_task"):
            run_lm_eval(ctx, "no_such_task", LMEvalOptions(limit=2))
    assert indexed == [{}]  # lm-eval's own tasks, once
    run_lm_eval(ctx, "rayb_text", LMEvalOptions(limit=2, rayb_task_docs=2))  # rayb's alone: a small index
    assert indexed[1:] == [{"include_path": indexed[1]["include_path"], "include_defaults": False}]


def test_lm_eval_task_index_is_kept_on_disk_as_lm_eval_builds_it_and_rebuilt_when_a_task_changes(
    tmp_path, monkeypatch
):
    """lm-eval's task index (11 s for its own tasks) is read back from disk in later processes, equal to
    the one lm-eval builds; a task file edited, added or a cache file cut short is indexed afresh, only
    the latest index of a set of paths is kept, processes asking at once build it once, and where
    nothing can be written each builds its own."""
    from lm_eval.tasks._index import TaskIndex

    from rayb.eval import harness

    monkeypatch.setattr(harness, "TASK_INDEX_DIR", tmp_path / "index")
    tasks = tmp_path / "tasks"
    (tasks / "family").mkdir(parents=True)
    (tasks / "family" / "_base.yaml").write_text("output_type: loglikelihood\ndataset_path: x\n")
    (tasks / "family" / "one.yaml").write_text("include: _base.yaml\ntask: one\ntag: old_tag\n")
    (tasks / "group.yaml").write_text("group: both\ntask: [one]\n")
    builds = []

    def build(paths, **options):
        builds.append(paths)
        time.sleep(0.2)  # as lm-eval's own takes seconds: the processes below overlap it
        return TaskIndex.build(paths, **options)

    def index() -> dict:
        return harness.cached_task_index(build, [tasks])

    first = index()
    assert first == TaskIndex.build([tasks]) and {"one", "both", "old_tag"} <= set(first)
    assert index() == first and len(builds) == 1  # read back
    (tasks / "family" / "one.yaml").write_text("include: _base.yaml\ntask: one\ntag: a_new_tag\n")
    assert "a_new_tag" in index() and "old_tag" not in index() and len(builds) == 2
    (tasks / "two.yaml").write_text("include: family/_base.yaml\ntask: two\n")
    assert index() == TaskIndex.build([tasks]) and "two" in index() and len(builds) == 3
    (kept,) = (tmp_path / "index").glob("*.pickle")
    kept.write_bytes(kept.read_bytes()[:100])
    assert index() == TaskIndex.build([tasks]) and len(builds) == 4
    assert len(list((tmp_path / "index").glob("*.pickle"))) == 1
    # Processes that start together build it once: the others wait for it.
    kept.unlink()
    with ThreadPoolExecutor(3) as pool:
        indexes = list(pool.map(lambda _: index(), range(3)))
    assert indexes == [indexes[0]] * 3 and len(builds) == 5
    # Where no cache can be written (a read-only home), each process indexes for itself.
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(harness, "TASK_INDEX_DIR", tmp_path / "a-file" / "index")
    assert index() == indexes[0] and len(builds) == 6


def test_a_recall_task_the_context_cannot_hold_refuses_before_training(tiny_cache, tokenizer):
    """At 32 tokens no quiz question fits with the facts it asks about: scoring the rest would measure
    chance. The study stops before training; at 256 tokens every task fits."""
    suites = ["lm", "lm_eval:rayb_facts", "lm_eval:rayb_lambada", "lm_eval:rayb_text"]
    problems = study_task_problems(suites, {"limit": 20}, tokenizer, tiny_cache.seq_len)
    assert [p.split(":")[1] for p in problems] == ["rayb_facts", "rayb_lambada"]
    assert "fit in the model's context" in problems[0] and "raise data.seq_len" in problems[0]
    assert study_task_problems(suites, {"limit": 20}, tokenizer, 256) == []


def test_recall_contexts_keep_the_facts_they_ask_about(tokenizer):
    """Sized to a context, a rayb_facts sample loses filler first, never a paragraph stating a choice."""
    lm = RaybLM(torch.nn.Identity(), tokenizer, max_length=160)
    samples = [recall_sample(generate_document("edu", 5, i), lm.fits, keep_choices=True) for i in range(30)]
    assert sum(s is not None for s in samples) >= 3
    for context, answer, choices in filter(None, samples):
        assert lm.fits(context) and context.endswith("Answer:") and answer in choices
        stated = context.rsplit("\n\n", 1)[0]  # the paragraphs before the quiz
        assert all(choice in stated for choice in choices)


def test_mqar_and_passkey_separate_a_perfect_recaller_from_an_untrained_model(tiny_cache, tokenizer):
    options = RecallOptions(
        kv_counts=[4, 8], mqar_lengths=[64], mqar_examples=8, passkey_lengths=[200], passkey_examples=5
    )
    oracle = run_recall(
        context(InductionOracle(tiny_cache.manifest["vocab_size"]), tiny_cache, tokenizer), None, options
    )
    untrained = run_recall(context(tiny("llama", tiny_cache), tiny_cache, tokenizer), None, options)
    assert oracle["mqar_acc.kv4.len64"] == oracle["mqar_acc.kv8.len64"] == 1.0
    assert untrained["mqar_acc"] < 0.1  # chance is about 2/vocabulary
    assert oracle["passkey_acc.len200"] == 1.0 and untrained["passkey_acc.len200"] <= 0.6
    gpt2 = run_recall(context(tiny("gpt2", tiny_cache), tiny_cache, tokenizer), None, options)
    assert (
        gpt2["passkey_skipped_lengths"] == [200] and "mqar_acc.kv4.len64" not in gpt2
    )  # beyond 32 positions


def test_mqar_accuracy_counts_only_queried_positions():
    class Echo(torch.nn.Module):  # always predicts the token it sees: right nowhere
        def forward(self, ids):
            return type("Out", (), {"logits": torch.nn.functional.one_hot(ids, 64).float()})

    assert mqar_accuracy(Echo(), 4, 32, 64, 4, seed=0) == 0.0
    assert mqar_accuracy(InductionOracle(64), 4, 32, 64, 4, seed=0) == 1.0


def test_statefulness_probes(tiny_cache, tokenizer):
    options = ProbeOptions(distances=[2, 6], examples=8, other_kinds_distance=2)
    oracle = run_statefulness(
        context(InductionOracle(tiny_cache.manifest["vocab_size"]), tiny_cache, tokenizer), None, options
    )
    untrained = run_statefulness(context(tiny("rwkv6", tiny_cache), tiny_cache, tokenizer), None, options)
    assert oracle["recall_acc.d2"] >= 0.9 and oracle["recall_acc.d6"] >= 0.9
    assert oracle["state_persistence"] == 6 and 0 <= oracle["persona_acc"] <= 1
    assert untrained["accuracy"] < 0.6 and untrained["state_persistence"] < 6
    assert persistence({5: 0.9, 10: 0.4, 20: 0.8}, 0.5) == 5 and persistence({5: 0.3}, 0.5) == 0


def test_long_context_curve(tiny_cache, tokenizer):
    options = LongContextOptions(multiples=[1, 2, 4], buckets=4, max_windows=2)
    recurrent = run_long_context(
        context(tiny("gated_deltanet", tiny_cache), tiny_cache, tokenizer), None, options
    )
    assert recurrent["multiples"] == [1, 2, 4] and len(recurrent["loss_by_position@4x"]) == 4
    assert all(math.isfinite(recurrent[f"ppl@{m}x"]) for m in (1, 2, 4))
    assert recurrent["useful_context_tokens"] == recurrent["useful_context_multiple"] * tiny_cache.seq_len
    learned_positions = run_long_context(
        context(tiny("gpt2", tiny_cache), tiny_cache, tokenizer), None, options
    )
    assert learned_positions["multiples"] == [1] and learned_positions["skipped_multiples"] == [2, 4]
    with pytest.raises(ValueError, match="multiples must include 1"):
        make_options(parse_suite("long_context")[0], {"multiples": [2, 4]})


def test_speed_protocol(tiny_cache, tokenizer):
    options = SpeedOptions(prefill_tokens=64, gen_tokens=8, lengths=[16, 32, 64], warmup=0, repeats=1)
    recurrent = run_speed(context(tiny("rwkv6", tiny_cache), tiny_cache, tokenizer), None, options)
    assert recurrent["decoding_memory"] == "state" and recurrent["gen_tokens"] == 8
    assert recurrent["scaling_lengths"] == [16, 32, 64] and math.isfinite(recurrent["time_exponent"])
    assert recurrent["prefill_peak_bytes"] > 64 * 32 * 4  # at least one activation of the prompt
    assert recurrent["scaling_peak_bytes"][-1] > recurrent["scaling_peak_bytes"][0]
    gpt2 = run_speed(context(tiny("gpt2", tiny_cache), tiny_cache, tokenizer), None, options)
    assert (
        gpt2["prefill_tokens"] == 32
        and gpt2["skipped_lengths"] == [64]
        and gpt2["decoding_memory"] == "cache"
    )
    assert growth_exponent([256, 512, 1024], [1.0, 2.0, 4.0]) == pytest.approx(1.0)
    assert growth_exponent([256, 512, 1024], [1.0, 4.0, 16.0]) == pytest.approx(2.0)


def test_peak_memory_sees_a_cpu_allocation():
    with PeakMemory(torch.device("cpu")) as memory:
        block = torch.ones(40_000_000)  # 160 MB
        del block
    assert memory.peak > 120e6


def op_events_peak(profiler: torch.profiler.profile) -> int:
    """The reference: torch.profiler's own op events (each op's allocations net of its frees, and
    "[memory]" events for those outside any op), their running total in time order."""
    total = peak = 0
    for event in sorted(profiler.events(), key=lambda e: e.time_range.start):
        total += event.self_cpu_memory_usage
        peak = max(peak, total)
    return peak


@pytest.mark.parametrize("arch", ["gpt2", "mamba", "gated_deltanet"])
@torch.no_grad()
def test_the_allocation_peak_is_at_least_torch_profilers_op_level_peak(tiny_cache, arch):
    model = tiny(arch, tiny_cache)
    decoder = Decoder(model)
    ids = torch.randint(0, tiny_cache.manifest["vocab_size"], (2, tiny_cache.seq_len))

    def generate():
        logits = decoder.prefill(ids[:, :4])
        for _ in range(8):
            logits = decoder.step(logits.argmax(-1))

    for run in (lambda: model(ids), generate):
        with PeakMemory(torch.device("cpu")) as memory:
            run()
        assert memory.peak >= op_events_peak(memory.profiler) > 0


def test_the_allocation_peak_sees_a_buffer_an_op_frees_before_it_ends():
    with PeakMemory(torch.device("cpu")) as memory, torch.profiler.record_function("an op"):
        buffer = torch.ones(10_000_000)  # 40 MB, freed within the op
        del buffer
    assert op_events_peak(memory.profiler) < 1e6 < 40e6 <= memory.peak


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy continuation through the Decoder: (tokens [batch, new], logits [batch, new, vocab])."""
    decoder = Decoder(model)
    logits = decoder.prefill(prompt)
    tokens, scores = [], []
    for i in range(new_tokens):
        scores.append(logits)
        tokens.append(logits.argmax(-1))
        if i + 1 < new_tokens:
            logits = decoder.step(tokens[-1])
    return torch.stack(tokens, 1), torch.stack(scores, 1)


@pytest.mark.parametrize("arch", ZOO)
def test_cached_or_recurrent_generation_matches_full_sequence_logits(arch):
    torch.manual_seed(0)
    model = build_model(arch, get_arch(arch).shape(64, 2), 256, 128).eval()
    prompt = torch.randint(0, 256, (2, 20))
    tokens, scores = greedy(model, prompt, 8)
    with torch.no_grad():
        full = model(torch.cat([prompt, tokens], 1)).logits[:, prompt.shape[1] - 1 : -1]
    torch.testing.assert_close(scores, full.float(), rtol=1e-4, atol=1e-4)
    expected = {"nanogpt": "recompute", "gated_deltanet": "state", "rwkv6": "state"}.get(arch, "cache")
    assert Decoder(model).memory == expected


def test_suite_and_option_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown eval suite 'perplexity'"):
        parse_suite("perplexity")
    with pytest.raises(ValueError, match="needs an argument"):
        parse_suite("lm_eval")
    with pytest.raises(ValueError, match="takes no argument"):
        parse_suite("speed:fast")
    with pytest.raises(ValueError, match="does not exist"):  # checked when a study is resolved (disk)
        check_suite_argument("lm:/no/such/file.txt")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['repeat'\]"):
        make_options(parse_suite("speed")[0], {"repeat": 3})


def test_an_error_that_breaks_cuda_for_good_retires_its_eval_actor():
    """A faulted kernel leaves the process's CUDA context unusable: such an error (as PyTorch and Triton word
    it) retires the eval actor, so its job runs again on a fresh one; any other error, CUDA's running out of
    memory included, is the benchmark's own and the actor goes on to the next job."""
    from rayb.eval.actors import sticky_cuda_error

    for error in (
        "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...",
        "RuntimeError: CUDA error: device-side assert triggered",
        "RuntimeError: CUDA error: unspecified launch failure",
        "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered",
        "RuntimeError: CUDA error: misaligned address",
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    ):
        assert sticky_cuda_error(error), error
    for error in (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "ValueError: the overfit protocol needs training rows, and the cache has none",
        "RuntimeError: CUDA error: invalid device ordinal",
        "",
    ):
        assert not sticky_cuda_error(error), error
