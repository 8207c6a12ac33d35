"""lm-evaluation-harness on any rayb model: `lm_eval:TASK` runs TASK through `RaybLM`.

`RaybLM` is a `lm_eval.api.model.TemplateLM`, so every architecture is evaluated the same way,
including a user's candidate that is not a transformers model; it only needs `model(ids).logits`.
It follows lm-eval's `HFLM` wherever a score depends on it (start tokens, truncation, generation), and
tests/test_lm_eval_parity.py holds every per-sample score equal to HFLM's on a saved checkpoint.
Log-likelihoods come from `scoring.continuation_logprobs`; rolling log-likelihoods use lm-eval's own
window split (`get_rolling_token_windows`). Generation is greedy.

Tasks: any name lm-eval knows, when its data can be loaded (the hub, or the HF datasets cache), and
rayb's own tasks, shipped as YAML in rayb/eval/tasks with data generated on the spot (offline):
`rayb_facts` (multiple-choice in-context recall, HellaSwag's shape), `rayb_answer` (the same questions,
answered by greedy generation), `rayb_lambada` (LAMBADA's shape: predict a passage's last word, an
answer it stated earlier) and `rayb_text` (rolling perplexity). The recall tasks are sized to the
model's context: a question always sees the facts it asks about.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import pickle
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import (
    handle_stop_sequences,
    has_bos_prefix,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from rayb.data.corpus import QUESTION_PREFIX, generate_document, recall_answers
from rayb.eval.registry import BENCHMARKS, Benchmark, EvalContext, make_options, register_benchmark
from rayb.eval.scoring import context_limit, continuation_logprobs, device_of
from rayb.files import digest, one_at_a_time, write_atomic

if TYPE_CHECKING:  # imported only where an evaluation runs
    from lm_eval.tasks import TaskManager

TASKS_DIR = Path(__file__).parent / "tasks"
# Where lm-eval's task index is kept between processes (cached_task_index).
TASK_INDEX_DIR = Path.home() / ".cache" / "rayb" / "lm_eval"
HFLM_MAX_GEN_TOKS = 256  # lm-eval's default for a task that does not set max_gen_toks
HELD_OUT_SEED = 2**31 - 1  # the embedded corpus's seeds are small; these documents are never trained on


class RaybLM(TemplateLM):
    """lm-eval's `HFLM` rules on any rayb model: the tokenizer adds its own start token and that token is
    the prefix of an empty context; generation is greedy, stops as HFLM's stop criteria do, and sees the
    context left-truncated to `max_length - max_gen_toks`. Contexts cut to fit are counted in
    `truncated` (one entry per distinct context), so a report can say how many samples lost text."""

    def __init__(self, model: torch.nn.Module, tokenizer, max_length: int, batch_size: int = 16):
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.max_length, self.batch_size = max_length, batch_size
        self.truncated: set[str] = set()

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return self.eot_token_id if bos is None else bos

    @property
    def max_gen_toks(self) -> int:
        return HFLM_MAX_GEN_TOKS

    def fits(self, context: str) -> bool:
        """Whether a recall task's context leaves room for its answer (rayb_answer's max_gen_toks)."""
        return len(self.tok_encode(context)) + ANSWER_TOKENS <= self.max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            add_special_tokens = False  # the text already starts with it
        flag = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.tokenizer(string, **flag)["input_ids"]

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        pairs = [(context, continuation) for _, context, continuation in requests]
        for (text, _), context, continuation in requests:
            if len(context) + len(continuation) > self.max_length + 1:
                self.truncated.add(text)
        return continuation_logprobs(self.model, pairs, self.max_length, self.batch_size)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (text,) in (request.args for request in requests):
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1,
            )  # fmt: skip
            pairs = [make_disjoint_window(window) for window in windows]
            out.append(sum(lp for lp, _ in continuation_logprobs(self.model, pairs, self.max_length)))
        return out

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        return [
            self._generate(context, gen_kwargs, eos) for context, gen_kwargs in (r.args for r in requests)
        ]

    def _generate(self, context: str, gen_kwargs: dict, eos: str) -> str:
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        if kwargs.get("do_sample"):
            raise ValueError("rayb generates greedily; this task samples (do_sample: true)")
        until, max_gen_toks = handle_stop_sequences(kwargs["until"], eos=eos), kwargs["max_gen_toks"]
        room = self.max_length - max_gen_toks
        if room <= 0:
            raise ValueError(
                f"the task generates up to {max_gen_toks} tokens, which leaves no room for a context in "
                f"this model's {self.max_length}; set generation_kwargs.max_gen_toks below {self.max_length}"
            )
        ids = self.tok_encode(context)
        if len(ids) > room:
            self.truncated.add(context)
            ids = ids[-room:]
        lookback = {stop: len(self.tok_encode(stop, add_special_tokens=False)) + 2 for stop in until}
        device, generated = device_of(self.model), []
        for _ in range(max_gen_toks):
            logits = self.model(torch.tensor([ids + generated], device=device)).logits
            generated.append(int(logits[0, -1].argmax()))
            if any(
                stop in self.tok_decode(generated[-n:], skip_special_tokens=False)
                for stop, n in lookback.items()
            ):
                break
        return postprocess_generated_text(self.tok_decode(generated), until, think_end_token=None)


def recall_sample(
    doc: str, fits: Callable[[str], bool], keep_choices: bool
) -> tuple[str, str, list[str]] | None:
    """(context, answer, choices) for a document's last quiz question: the context runs up to its
    `Answer:`, and the choices are the answers the document gives to its other questions. Where the whole
    document does not `fit`, paragraphs go from the start, then the earlier quiz lines, until it does;
    the paragraphs stating the answer (with `keep_choices`, every choice) always stay whole, so each
    fact keeps its subject. None if even that does not fit."""
    offset, answer = recall_answers(doc)[-1]
    choices = sorted([answer, *list(dict.fromkeys(a for _, a in recall_answers(doc) if a != answer))[:3]])
    kept_facts = choices if keep_choices else [answer]
    *body, quiz = doc[:offset].rstrip().split("\n\n")
    header, *asked = quiz.split("\n" + QUESTION_PREFIX)
    units = [(i, text, any(fact in text for fact in kept_facts)) for i, text in enumerate(body)]
    units += [(len(units) + i, QUESTION_PREFIX + q, False) for i, q in enumerate(asked[:-1])]
    droppable = [i for i, (_, _, needed) in enumerate(units) if not needed]

    def context(dropped: set[int]) -> str:
        kept = [(i, text) for i, text, _ in units if i not in dropped]
        quiz = "\n".join([header, *(t for i, t in kept if i >= len(body)), QUESTION_PREFIX + asked[-1]])
        return "\n\n".join([*(t for i, t in kept if i < len(body)), quiz])

    if not fits(context(set(droppable))):  # the shortest it can be: most documents stop here
        return None
    n = next(n for n in range(len(droppable) + 1) if fits(context(set(droppable[:n]))))
    return context(set(droppable[:n])), answer, choices


def rayb_task_rows(task: str, n_docs: int, fits: Callable[[str], bool]) -> list[dict]:
    """`task`'s rows, generated (deterministically) from held-out documents; the recall tasks take the
    first `n_docs` documents whose quiz question and the facts it asks about `fit` the model's context,
    and refuse (ValueError) where too few do."""
    if task == "rayb_text":
        return [
            {"text": generate_document("web" if i % 2 else "edu", HELD_OUT_SEED, n_docs + i)}
            for i in range(n_docs)
        ]
    docs = (generate_document("edu", HELD_OUT_SEED, i) for i in range(SCAN * n_docs))
    samples = (recall_sample(doc, fits, keep_choices=task == "rayb_facts") for doc in docs)
    rows = list(islice((RECALL_ROWS[task](*sample) for sample in samples if sample is not None), n_docs))
    if len(rows) < n_docs:
        raise ValueError(
            f"lm_eval:{task}: only {len(rows)} of {n_docs} questions fit in the model's context with the facts "
            f"they ask about, so it would score truncated text; raise data.seq_len or drop the suite"
        )
    return rows


def study_task_problems(suites: list[str], options: dict, tokenizer, max_length: int) -> list[str]:
    """Why a study's rayb recall tasks cannot run at its context length (checked before training)."""
    n_docs = make_options(BENCHMARKS.get("lm_eval"), options).task_docs
    lm = RaybLM(torch.nn.Identity(), tokenizer, max_length)
    problems = []
    for task in (
        s.partition(":")[2] for s in suites if s.startswith("lm_eval:rayb_") and s != "lm_eval:rayb_text"
    ):
        try:
            rayb_task_rows(task, n_docs, lm.fits)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


SCAN = 20  # documents looked at per sample wanted, before a task says its questions do not fit
ANSWER_TOKENS = 16  # room after every recall context: the longest answer, and rayb_answer's max_gen_toks
RECALL_ROWS: dict[str, Callable[[str, str, list[str]], dict]] = {
    "rayb_facts": lambda context, answer, choices: {
        "context": context,
        "choices": choices,
        "answer": choices.index(answer),
    },
    "rayb_lambada": lambda context, answer, _: {"text": f"{context} {answer.split()[0]}"},
    "rayb_answer": lambda context, answer, _: {"context": context, "answer": answer},
}


def rayb_tasks(include_dir: Path, task: str, n_docs: int, fits: Callable[[str], bool]) -> Path:
    """rayb's task YAMLs in `include_dir` (for TaskManager), and the data of `task` (one of rayb's tasks)."""
    rows = rayb_task_rows(task, n_docs, fits)
    (include_dir / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for yaml in TASKS_DIR.glob("*.yaml"):
        (include_dir / yaml.name).write_text(yaml.read_text().replace("@DATA_DIR@", str(include_dir)))
    return include_dir


@dataclass
class LMEvalOptions:
    num_fewshot: int = 0
    limit: int | None = None  # at most this many examples per task (None: all)
    batch_size: int = 16
    rayb_task_docs: int = 200  # examples in rayb's own generated tasks

    @property
    def task_docs(self) -> int:
        """Examples to generate for rayb's own tasks: no more than lm-eval will read."""
        return min(self.rayb_task_docs, self.limit or self.rayb_task_docs)


def _no_environment_report(results: dict[str, Any]) -> None:
    """Stands in for lm-eval's `add_env_info`, which ends every `simple_evaluate` by adding torch's
    environment report to its results: `pip list`, `nvidia-smi` and more as subprocesses, 0.6-2.4 s per
    evaluation on 2 cores, more than a small model's task takes. rayb keeps none of lm-eval's
    results beyond its scores and task versions: a study's provenance records its packages and cluster."""


@functools.cache
def lm_eval_tasks() -> TaskManager:
    """lm-eval's own tasks, indexed once per process, from an index kept on disk once per machine
    (`cached_task_index`): indexing reads all their files (about 15,000 tasks: 11 s of an idle core, 16.5 s
    beside training on 2 cores), which every eval actor and drained worker paid again, and `rayb data
    prepare` too. Each evaluation still builds its tasks anew from the index."""
    from unittest import mock

    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import TaskIndex

    cached_build = functools.partial(cached_task_index, TaskIndex.build)
    with mock.patch.object(TaskIndex, "build", staticmethod(cached_build)):
        return TaskManager()


def cached_task_index(build: Callable, paths, **options) -> dict:
    """lm-eval's task index of `paths` (`build`: its TaskIndex.build), read from TASK_INDEX_DIR where built
    before from the same task files. Keyed by lm-eval's version, the paths, and each YAML file's path, size
    and modification time (a tenth of a second for lm-eval's own), so a task file edited or added, as in
    an editable lm-eval, is indexed afresh; one index is kept per lm-eval version and set of paths."""
    from importlib.metadata import version

    roots = [str(path) for path in paths]
    where = digest([version("lm_eval"), roots, options])
    files = [_yaml_files(root) for root in roots]
    cached = TASK_INDEX_DIR / f"index-{where}-{digest(files)}.pickle"
    if (index := _read_index(cached)) is not None:
        return index
    # One process builds it; the others on the machine (eval actors starting together) wait to read it.
    with one_at_a_time(TASK_INDEX_DIR / f"index-{where}.lock"):
        if (index := _read_index(cached)) is not None:
            return index
        index = build(paths, **options)
        with contextlib.suppress(OSError):  # a full disk or a read-only home costs the next process a build
            for stale in TASK_INDEX_DIR.glob(f"index-{where}-*.pickle"):
                stale.unlink(missing_ok=True)
            write_atomic(cached, pickle.dumps(index))
    return index


def _read_index(cached: Path) -> dict | None:
    """A task index written by cached_task_index (rayb's own file, in the user's own cache), or None."""
    with contextlib.suppress(Exception):  # missing, cut short, or unreadable however: built again
        return pickle.loads(cached.read_bytes())
    return None


def _yaml_files(root: str) -> list[tuple[str, int, int]]:
    """Each YAML file under `root`, as its path, size and modification time (os.walk: pathlib's glob took
    six times as long over lm-eval's 14,000 files)."""
    files = []
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".yaml"):
                stat = os.stat(path := os.path.join(folder, name))
                files.append((path, stat.st_size, stat.st_mtime_ns))
    return sorted(files)


def run_lm_eval(ctx: EvalContext, task: str, options: LMEvalOptions) -> dict[str, Any]:
    from lm_eval import evaluator, simple_evaluate
    from lm_eval.tasks import TaskManager

    evaluator.add_env_info = _no_environment_report
    # lm-eval logs its errors only: rayb reports the evaluation itself. simple_evaluate's `verbosity`,
    # which once set this, now does nothing but log that it is deprecated.
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    max_length = min(ctx.seq_len, context_limit(ctx.model) or ctx.seq_len)
    lm = RaybLM(ctx.model, ctx.tokenizer, max_length, options.batch_size)
    with tempfile.TemporaryDirectory(prefix="rayb-lm-eval-") as include:
        if task.startswith("rayb_"):  # rayb's own tasks alone, their data generated for this model
            rayb_tasks(Path(include), task, options.task_docs, lm.fits)
            tasks = TaskManager(include_path=include, include_defaults=False)
        else:
            tasks = lm_eval_tasks()
        results = simple_evaluate(
            model=lm,
            tasks=[task],
            num_fewshot=options.num_fewshot,
            limit=options.limit,
            task_manager=tasks,
            random_seed=ctx.seed, numpy_random_seed=ctx.seed, torch_random_seed=ctx.seed,
            fewshot_random_seed=ctx.seed, bootstrap_iters=0,
        )  # fmt: skip
    metrics = {}
    for name, scores in results["results"].items():  # a group task reports each member too
        prefix = "" if name == task else f"{name}."
        for key, value in scores.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[prefix + key.replace(",none", "")] = value
    metrics["task_version"] = str(results.get("versions", {}).get(task, ""))
    metrics["truncated"] = len(lm.truncated)  # samples whose context lost its start to fit max_length
    return metrics


register_benchmark(
    Benchmark(
        "lm_eval", 2, run_lm_eval, LMEvalOptions,
        "lm-evaluation-harness tasks through rayb's TemplateLM (rayb_facts, rayb_text, or any lm-eval task)",
        argument="lm-eval task name", argument_required=True,
    )
)  # fmt: skip
