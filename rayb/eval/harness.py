"""lm-evaluation-harness on any rayb model: `lm_eval:TASK` runs TASK through `RaybLM`.

`RaybLM` is a `lm_eval.api.model.TemplateLM`, so every architecture is evaluated the same way,
including a user's candidate that is not a transformers model; it only needs `model(ids).logits`.
Log-likelihoods come from `scoring.continuation_logprobs`; rolling log-likelihoods use lm-eval's own
window split (`get_rolling_token_windows`), so a test can hold it against rayb's sliding-window
perplexity. Generation is greedy.

Tasks: any name lm-eval knows, when its data can be loaded (the hub, or the HF datasets cache), and
rayb's own tasks, shipped as YAML in rayb/eval/tasks with data generated on the spot (offline):
`rayb_facts` (multiple-choice in-context recall, HellaSwag's shape), `rayb_text` (rolling perplexity)
and `rayb_lambada` (LAMBADA's shape: predict a passage's last word, an answer it stated earlier).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from rayb.data.corpus import generate_document, recall_answers
from rayb.eval.registry import Benchmark, EvalContext, register_benchmark
from rayb.eval.scoring import context_limit, continuation_logprobs, device_of

TASKS_DIR = Path(__file__).parent / "tasks"
HELD_OUT_SEED = 2**31 - 1  # the embedded corpus's seeds are small; these documents are never trained on


class RaybLM(TemplateLM):
    def __init__(self, model: torch.nn.Module, tokenizer, max_length: int, batch_size: int = 16):
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.max_length, self.batch_size = max_length, batch_size

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer(string, add_special_tokens=False)["input_ids"]

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.tokenizer.decode(tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        pairs = [(context, continuation) for _, context, continuation in requests]
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
        out = []
        for context, kwargs in (request.args for request in requests):
            until = kwargs.get("until") or [self.tokenizer.decode([self.eot_token_id])]
            ids = self.tok_encode(context)
            generated: list[int] = []
            for _ in range(kwargs.get("max_gen_toks", 64)):
                window = torch.tensor([(ids + generated)[-self.max_length :]], device=device_of(self.model))
                token = int(self.model(window).logits[0, -1].argmax())
                if token == self.eot_token_id:
                    break
                generated.append(token)
                if any(stop in self.tok_decode(generated) for stop in until):
                    break
            text = self.tok_decode(generated)
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out


def write_rayb_task_data(data_dir: Path, n_docs: int) -> None:
    """The data of rayb's own tasks, generated (deterministically) from held-out documents."""
    facts, texts, lambada = [], [], []
    for i in range(n_docs):
        doc = generate_document("edu", HELD_OUT_SEED, i)
        answers = recall_answers(doc)
        offset, answer = answers[-1]
        others = list(dict.fromkeys(a for _, a in answers if a != answer))[:3]
        choices = sorted([answer, *others])
        facts.append({"context": doc[:offset].rstrip(), "choices": choices, "answer": choices.index(answer)})
        lambada.append({"text": f"{doc[:offset].rstrip()} {answer.split()[0]}"})
        texts.append({"text": generate_document("web" if i % 2 else "edu", HELD_OUT_SEED, n_docs + i)})
    for name, rows in (("rayb_facts", facts), ("rayb_text", texts), ("rayb_lambada", lambada)):
        (data_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def rayb_tasks(include_dir: Path, n_docs: int) -> Path:
    """rayb's task YAMLs, pointed at freshly generated data, in `include_dir` (for TaskManager)."""
    write_rayb_task_data(include_dir, n_docs)
    for yaml in TASKS_DIR.glob("*.yaml"):
        (include_dir / yaml.name).write_text(yaml.read_text().replace("@DATA_DIR@", str(include_dir)))
    return include_dir


@dataclass
class LMEvalOptions:
    num_fewshot: int = 0
    limit: int | None = None  # at most this many examples per task (None: all)
    batch_size: int = 16
    rayb_task_docs: int = 200  # examples in rayb's own generated tasks


def run_lm_eval(ctx: EvalContext, task: str, options: LMEvalOptions) -> dict[str, Any]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    max_length = min(ctx.seq_len, context_limit(ctx.model) or ctx.seq_len)
    with tempfile.TemporaryDirectory(prefix="rayb-lm-eval-") as include:
        results = simple_evaluate(
            model=RaybLM(ctx.model, ctx.tokenizer, max_length, options.batch_size),
            tasks=[task],
            num_fewshot=options.num_fewshot,
            limit=options.limit,
            task_manager=TaskManager(  # indexing lm-eval's thousands of tasks takes seconds: only if needed
                include_path=str(rayb_tasks(Path(include), options.rayb_task_docs)),
                include_defaults=not task.startswith("rayb_"),
            ),
            random_seed=ctx.seed, numpy_random_seed=ctx.seed, torch_random_seed=ctx.seed,
            fewshot_random_seed=ctx.seed, bootstrap_iters=0, verbosity="ERROR",
        )  # fmt: skip
    metrics = {}
    for name, scores in results["results"].items():  # a group task reports each member too
        prefix = "" if name == task else f"{name}."
        for key, value in scores.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[prefix + key.replace(",none", "")] = value
    metrics["task_version"] = str(results.get("versions", {}).get(task, ""))
    return metrics


register_benchmark(
    Benchmark(
        "lm_eval", 1, run_lm_eval, LMEvalOptions,
        "lm-evaluation-harness tasks through rayb's TemplateLM (rayb_facts, rayb_text, or any lm-eval task)",
        argument="lm-eval task name", argument_required=True,
    )
)  # fmt: skip
