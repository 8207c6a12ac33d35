"""rayb's lm-eval scores equal lm-eval's own `HFLM` on one saved checkpoint, sample by sample: one task of
each output type, with the study's tokenizer and with a copy of it that prepends a start token (as
Llama's, TinyLlama's and Mistral's do)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
from tokenizers import processors
from transformers import PreTrainedTokenizerFast

from rayb.data.tokenizer import load_tokenizer
from rayb.eval.harness import HFLM_MAX_GEN_TOKS, RaybLM, rayb_tasks
from rayb.models import build_model
from rayb.models.checkpoint import load_trained
from rayb.models.selfcheck import perturb

MAX_LENGTH = 320  # above lm-eval's default max_gen_toks (256), so a task may leave it unset
TASKS = {"rayb_facts": 6, "rayb_lambada": 6, "rayb_text": 4, "rayb_answer": 6}  # task: samples
START = "<s>"


def with_start_token(tokenizer: PreTrainedTokenizerFast, out: Path) -> PreTrainedTokenizerFast:
    """A copy of `tokenizer` whose encodings begin with a start token of their own."""
    copy = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer.__class__.from_str(
        tokenizer.backend_tokenizer.to_str()), eos_token=tokenizer.eos_token)  # fmt: skip
    copy.add_special_tokens({"bos_token": START})
    copy.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{START} $A", pair=f"{START} $A {START} $B", special_tokens=[(START, copy.bos_token_id)]
    )
    copy.save_pretrained(out)
    return load_tokenizer(out)


@pytest.fixture(scope="module", params=["study tokenizer", "start-token tokenizer"])
def checkpoint(request, tiny_cache, tmp_path_factory) -> tuple[Path, PreTrainedTokenizerFast]:
    """A saved gpt2 checkpoint and its tokenizer, the way a study saves a trained trial."""
    out = tmp_path_factory.mktemp("checkpoint")
    tokenizer = load_tokenizer(tiny_cache.tokenizer_dir)
    if request.param == "start-token tokenizer":
        tokenizer = with_start_token(tokenizer, out)
        assert tokenizer("a b")["input_ids"][0] == tokenizer.bos_token_id != tokenizer.eos_token_id
    torch.manual_seed(0)
    config = {"d_model": 64, "n_layer": 2, "n_head": 2}
    model = build_model("gpt2", config, len(tokenizer), MAX_LENGTH)
    perturb(model, seed=0).save_pretrained(out)  # every weight carries signal, so every score differs
    tokenizer.save_pretrained(out)
    return out, tokenizer


def both(checkpoint) -> tuple[RaybLM, HFLM]:
    path, tokenizer = checkpoint
    ours = RaybLM(load_trained(path, "gpt2", {}, len(tokenizer), MAX_LENGTH).eval(), tokenizer, MAX_LENGTH)
    theirs = HFLM(pretrained=str(path), tokenizer=tokenizer, max_length=MAX_LENGTH, batch_size=1,
                  device="cpu", dtype="float32")  # fmt: skip
    return ours, theirs


def per_sample(lm, task: str, include: Path) -> list[list]:
    results = simple_evaluate(
        model=lm, tasks=[task], limit=TASKS[task], log_samples=True, bootstrap_iters=0, verbosity="ERROR",
        task_manager=TaskManager(include_path=str(include), include_defaults=False),
    )  # fmt: skip
    return [sample["resps"] for sample in sorted(results["samples"][task], key=lambda s: s["doc_id"])]


def assert_same(ours, theirs) -> None:
    if isinstance(ours, str):
        assert ours == theirs
    elif isinstance(ours, bool):
        assert ours == theirs
    elif isinstance(ours, float):
        assert math.isclose(ours, theirs, rel_tol=1e-5, abs_tol=1e-4)
    else:
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert_same(a, b)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_sample_scores_as_lm_eval_scores_it(checkpoint, task, tmp_path):
    ours, theirs = both(checkpoint)
    include = rayb_tasks(tmp_path, task, TASKS[task], ours.fits)
    mine = per_sample(ours, task, include)
    assert len(mine) == TASKS[task]
    assert_same(mine, per_sample(theirs, task, include))


def test_generation_stops_and_truncates_as_lm_eval_does(checkpoint, tiny_cache):
    """A string `until` is one stop sequence, not its characters; a task without max_gen_toks generates
    up to lm-eval's 256; the context is left-truncated to leave room for them."""
    ours, theirs = both(checkpoint)
    tokenizer = checkpoint[1]
    context = tokenizer.decode(tiny_cache.train[:8].reshape(-1).tolist(), skip_special_tokens=True)
    assert len(ours.tok_encode(context)) > MAX_LENGTH - HFLM_MAX_GEN_TOKS  # so it must be truncated
    free = ours.generate_until(
        [Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 40}), 0)]
    )
    stop = next(
        text[k : k + 2]
        for text in free
        for k in range(1, len(text) - 1)
        if text.find(text[k : k + 2]) == k and text.find(text[k]) < k
    )  # fmt: skip  two characters whose first appears earlier alone: a per-character stop ends sooner
    requests = [Instance("generate_until", {}, (context, {"until": stop}), 0)]
    mine = ours.generate_until(requests)
    assert mine == theirs.generate_until(requests)
    assert len(mine[0]) > free[0].find(stop[0]) and context in ours.truncated
