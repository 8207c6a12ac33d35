"""BABILong on tiny models and hand-built readers, without Ray: the stories obey bAbI's semantics, the
facts are really in the context, a model that reads them scores 1 and one that cannot scores chance."""

from __future__ import annotations

import json
import math
import random
import re
from collections import defaultdict

import pytest
import torch
from torch import nn

import rayb.eval.babilong  # noqa: F401  (registers the benchmark)
from rayb.data.cache import TokenCache
from rayb.data.corpus import generate_document
from rayb.data.tokenizer import load_tokenizer, train_bpe
from rayb.eval.babilong import OBJECTS, ROOMS, BabilongOptions, babilong_items, make_story, run_babilong
from rayb.eval.registry import EvalContext, make_options, parse_suite
from rayb.models import build_model
from rayb.models.common import LMOutput

MOVE = r"([A-Z]\w*) (?:went|walked|travelled|ran) to the (\w+)\."
TAKE = r"([A-Z]\w*) (?:picked up|took|grabbed) the (\w+)\."
DROP = r"([A-Z]\w*) (?:put down|dropped|discarded) the (\w+)\."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = (generate_document("edu" if i % 2 else "web", 5, i) for i in range(200))
    return load_tokenizer(train_bpe(texts, 512, tmp_path_factory.mktemp("babilong") / "tokenizer"))


def context(model, tokenizer, tmp_path, seed: int = 0) -> EvalContext:
    (tmp_path / "manifest.json").write_text(json.dumps({"seq_len": 64, "vocab_size": len(tokenizer)}))
    return EvalContext(model, tokenizer, TokenCache(tmp_path), seed=seed)


def replay(facts: list[str], question: str) -> tuple[str, dict[str, list[str]]]:
    """bAbI's answer, worked out afresh from the story's sentences: who is where, who holds what,
    and every room each object has been in (returned too)."""
    room: dict[str, str] = {}
    holder: dict[str, str | None] = {}
    trail: dict[str, list[str]] = defaultdict(list)
    for fact in facts:
        if m := re.fullmatch(MOVE, fact):
            person, room[person] = m[1], m[2]
            trail.update({thing: trail[thing] + [m[2]] for thing, who in holder.items() if who == person})
        elif m := re.fullmatch(TAKE, fact):
            person, thing = m[1], m[2]
            assert person in room and holder.get(thing) is None, f"{fact}: nobody can take that now"
            assert trail[thing][-1:] in ([], [room[person]]), f"{fact}: the {thing} is elsewhere"
            trail[thing] = trail[thing] or [room[person]]
            holder[thing] = person
        elif m := re.fullmatch(DROP, fact):
            assert holder.get(m[2]) == m[1], f"{fact}: {m[1]} does not hold the {m[2]}"
            holder[m[2]] = None
        else:
            raise AssertionError(f"not a bAbI fact: {fact!r}")
    if m := re.fullmatch(r"Where is the (\w+)\?", question):
        return trail[m[1]][-1], trail
    if m := re.fullmatch(r"Where is ([A-Z]\w*)\?", question):
        return room[m[1]], trail
    m = re.fullmatch(r"Where was the (\w+) before the (\w+)\?", question)
    assert m and trail[m[1]].count(m[2]) == 1, f"ambiguous or unknown question {question!r}"
    return trail[m[1]][trail[m[1]].index(m[2]) - 1], trail


class StoryReader(nn.Module):
    """Reads its input as text, picks out the bAbI sentences hidden in the filler, works out the
    answer with `replay` and puts its logits on the answer's tokens: it can only be right if the
    facts and the question are really in the context."""

    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer
        self.fact = re.compile(f"{MOVE}|{TAKE}|{DROP}")

    def facts(self, text: str) -> list[str]:
        """The story's sentences: bAbI sentences about the benchmark's rooms and objects."""
        words = set(ROOMS) | set(OBJECTS)
        return [m[0] for m in self.fact.finditer(text) if m[0][:-1].rsplit(" ", 1)[-1] in words]

    def forward(self, input_ids: torch.Tensor) -> LMOutput:
        logits = torch.zeros(*input_ids.shape, len(self.tokenizer))
        for b, row in enumerate(input_ids.tolist()):
            text = self.tokenizer.decode(row)
            question = re.findall(r"Question: (.*)\n", text)[-1]
            answer, _ = replay(self.facts(text), question)
            logits[b, :, self.tokenizer(" " + answer, add_special_tokens=False)["input_ids"]] = 10.0
        return LMOutput(logits=logits)


class Uniform(nn.Module):
    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, input_ids: torch.Tensor) -> LMOutput:
        return LMOutput(logits=torch.zeros(*input_ids.shape, self.vocab_size))


@pytest.mark.parametrize("task", ["qa1", "qa2", "qa3"])
def test_every_answer_follows_from_the_story_as_babi_defines_it(task):
    options = BabilongOptions(facts=10)
    rng = random.Random(f"test-{task}")
    stories = [make_story(rng, task, options) for _ in range(300)]
    carried = 0  # stories whose object was carried away from where it was picked up
    for story in stories:
        answer, trails = replay(list(story.facts), story.question)
        assert answer == story.choices[story.answer]
        rooms = {m[2] for f in story.facts if (m := re.fullmatch(MOVE, f))}
        assert sorted(story.choices) == sorted(rooms) and len(story.choices) >= 2
        if thing := re.match(r"Where (?:is|was) the (\w+)", story.question):
            carried += len(trails[thing[1]]) > 1
    # Not degenerate: the answer is not simply the room of the story's last move, nor always in one slot.
    last_move = [[m[2] for f in s.facts if (m := re.fullmatch(MOVE, f))][-1] for s in stories]
    assert 0.1 < sum(s.choices[s.answer] != r for s, r in zip(stories, last_move, strict=True)) / 300
    assert len({s.answer for s in stories}) >= 3
    if task != "qa1":  # the object was moved by its holder: the answer needs the pick-up and a move
        assert carried > 50


def test_stories_are_seeded_by_task_length_and_seed(tokenizer):
    options = BabilongOptions(examples=4)
    first = babilong_items(tokenizer, "qa2", 256, options, seed=0)
    again = babilong_items(tokenizer, "qa2", 256, options, seed=0)
    assert [(i.story, i.context, i.choices) for i in first] == [
        (i.story, i.context, i.choices) for i in again
    ]
    for other in (
        babilong_items(tokenizer, "qa2", 256, options, seed=1),
        babilong_items(tokenizer, "qa2", 300, options, seed=0),
        babilong_items(tokenizer, "qa1", 256, options, seed=0),
    ):
        assert [i.story for i in other] != [i.story for i in first]
        assert [i.context for i in other] != [i.context for i in first]


@pytest.mark.parametrize("length", [256, 512, 2048])
def test_contexts_have_the_length_asked_for_and_hide_every_fact_in_order(tokenizer, length):
    items = babilong_items(tokenizer, "qa3", length, BabilongOptions(examples=6), seed=3)
    depths = []
    for item in items:
        total = len(item.context) + max(map(len, item.choices))
        assert 0.97 * length <= total <= length  # nothing the model is shown is ever cut
        text = tokenizer.decode(item.context)
        at = 0
        for fact in item.story.facts:
            at = text.index(" " + fact, at) + len(fact)
        assert text.endswith(f"\nQuestion: {item.story.question}\nAnswer: {item.story.lead}")
        depths.append(text.index(item.story.facts[0]) / len(text))
    if length >= 512:  # hidden at random depths, not all at the start
        assert max(depths) - min(depths) > 0.2
    with pytest.raises(ValueError, match="length 64 is too short"):
        babilong_items(tokenizer, "qa1", 64, BabilongOptions(examples=1), seed=0)


def test_a_reader_of_the_story_scores_one_and_a_uniform_model_about_chance(tokenizer, tmp_path):
    options = BabilongOptions(
        tasks=["qa1", "qa2", "qa3"], lengths=[256, 320], examples=8, facts=6, batch_size=4
    )
    oracle = run_babilong(context(StoryReader(tokenizer), tokenizer, tmp_path), None, options)
    uniform = run_babilong(context(Uniform(len(tokenizer)), tokenizer, tmp_path), None, options)
    assert oracle["accuracy"] == 1.0 and oracle["lengths"] == [256, 320] and oracle["skipped_lengths"] == []
    assert all(oracle[f"acc.{t}.len{n}"] == 1.0 for t in options.tasks for n in (256, 320))
    assert 0.15 < oracle["chance"] < 0.5 and oracle["chance"] == uniform["chance"]
    assert abs(uniform["accuracy"] - uniform["chance"]) < 0.2
    assert uniform["acc.len256"] == pytest.approx(sum(uniform[f"acc.{t}.len256"] for t in options.tasks) / 3)


def test_lengths_beyond_the_context_limit_are_skipped_and_listed(tokenizer, tmp_path):
    reader = StoryReader(tokenizer)
    reader.max_context = 320
    options = BabilongOptions(lengths=[256, 512, 320], examples=2, facts=6)
    metrics = run_babilong(context(reader, tokenizer, tmp_path), None, options)
    assert metrics["lengths"] == [256, 320] and metrics["skipped_lengths"] == [512]
    assert "acc.len512" not in metrics and metrics["accuracy"] == 1.0
    reader.max_context = 100
    nothing = run_babilong(context(reader, tokenizer, tmp_path), None, options)
    assert nothing["lengths"] == [] and math.isnan(nothing["accuracy"]) and math.isnan(nothing["chance"])


def test_suite_runs_end_to_end_on_a_tiny_gpt2(tokenizer, tmp_path):
    benchmark, argument = parse_suite("babilong")
    assert benchmark.name == "babilong" and benchmark.version == 1 and argument is None
    options = make_options(
        benchmark, {"lengths": [256, 384, 1024], "examples": 2, "facts": 6, "batch_size": 4}
    )
    torch.manual_seed(0)
    model = build_model("gpt2", {"d_model": 32, "n_layer": 1, "n_head": 2}, len(tokenizer), 512).eval()
    metrics = benchmark.run(context(model, tokenizer, tmp_path, seed=1), argument, options)
    assert metrics["lengths"] == [256, 384] and metrics["skipped_lengths"] == [1024]  # 512 positions
    expected = {f"acc.{t}.len{n}" for t in ("qa1", "qa2") for n in (256, 384)} | {"acc.len256", "acc.len384"}
    assert expected | {"accuracy", "lengths", "skipped_lengths", "chance"} == set(metrics)
    assert all(0 <= metrics[k] <= 1 for k in expected) and 0 < metrics["chance"] < 1
    assert metrics["accuracy"] == pytest.approx((metrics["acc.len256"] + metrics["acc.len384"]) / 2)
    assert json.loads(json.dumps(metrics)) == metrics


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"tasks": ["qa1", "qa9"]}, "tasks"),
        ({"tasks": []}, "tasks"),
        ({"lengths": [4096, 0]}, "lengths"),
        ({"lengths": [-5]}, "lengths"),
        ({"examples": 0}, "examples"),
        ({"facts": 2}, "facts"),
        ({"places": 1}, "places"),
        ({"places": len(ROOMS) + 1}, "places"),
        ({"batch_size": 0}, "batch_size"),
        ({"length": [128]}, r"unknown option\(s\) \['length'\]"),
    ],
)
def test_bad_options_are_refused_naming_the_option(values, named):
    with pytest.raises(ValueError, match=named):
        make_options(parse_suite("babilong")[0], values)
    assert make_options(parse_suite("babilong")[0], None) == BabilongOptions()
