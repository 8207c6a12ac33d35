"""BABILong: bAbI reasoning questions whose supporting facts are scattered through long distractor text.

After Kuratov et al. 2024. A short story of `facts` sentences (seeded by task, length and the trial's
seed; people from rayb's corpus lexicon, rooms and objects from the fixed lists below) is hidden, in
order, at random sentence boundaries of filler text (documents from rayb's generator, which never
mentions these rooms), and a question follows. The model must find the facts and combine them:

* `qa1`, single supporting fact: people move between rooms; "Where is X?" is the last room X went to;
* `qa2`, two supporting facts: people also pick up and put down objects; "Where is the lantern?" is
  where its holder went last, or the room where it was put down;
* `qa3`, three supporting facts: "Where was the lantern before the attic?", the room the object was
  in just before it was carried into the attic.

Scored by log-likelihood: the right room must out-score every other room the story mentions (chance,
the mean of 1 / number of choices, is reported with the accuracies). A length counts every token the
model sees, context plus the longest choice, so nothing is ever truncated; lengths beyond the
architecture's position table are skipped and listed. Perplexity shows whether a model reads long
text; this shows whether it can still find and use two or three facts in 64K tokens of it.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

from rayb.data.corpus import generate_document, lexicon
from rayb.eval.registry import Benchmark, EvalContext, register_benchmark
from rayb.eval.scoring import choose, context_limit

FILLER_SEED = 2**31 - 2  # documents no study trains on
TASKS = ("qa1", "qa2", "qa3")
ROOMS = tuple("kitchen hallway cellar attic office bedroom workshop pantry bathroom porch".split())
OBJECTS = ("lantern", "umbrella", "parcel", "violin", "compass", "teapot")
MOVE = ("went to", "walked to", "travelled to", "ran to")
TAKE = ("picked up", "took", "grabbed")
DROP = ("put down", "dropped", "discarded")
OBJECTS_PER_STORY = 3
MAX_ATTEMPTS = 1000  # stories drawn before giving up on one with a valid question


@dataclass
class BabilongOptions:
    tasks: list[str] = field(default_factory=lambda: ["qa1", "qa2"])
    lengths: list[int] = field(default_factory=lambda: [4096, 8192, 16384, 32768, 65536])  # tokens
    examples: int = 20  # per (task, length)
    facts: int = 10  # story sentences: the supporting facts and the distractor facts around them
    people: int = 4  # people per story
    places: int = 6  # rooms a story's people move between
    batch_size: int = 1  # contexts are long: one sequence at a time

    def validate(self) -> None:
        unknown = sorted(set(self.tasks) - set(TASKS))
        if unknown or not self.tasks:
            raise ValueError(f"tasks must be a non-empty list of {', '.join(TASKS)}; got {self.tasks}")
        if not self.lengths or any(n <= 0 for n in self.lengths):
            raise ValueError(f"lengths must be positive token counts, got {self.lengths}")
        for name, low, high in (
            ("examples", 1, None),
            ("facts", 4, None),
            ("people", 1, len(lexicon("given"))),
            ("places", 2, len(ROOMS)),
            ("batch_size", 1, None),
        ):
            value = getattr(self, name)
            if value < low or (high is not None and value > high):
                raise ValueError(f"{name} must be in {low}..{high or 'any'}, got {value}")


@dataclass(frozen=True)
class Story:
    task: str
    facts: tuple[str, ...]  # sentences, in story order
    question: str  # "Where is Mira?"
    lead: str  # the start of the answer, which the room completes: "Mira is in the"
    choices: tuple[str, ...]  # every room the story mentions, shuffled
    answer: int  # index of the right room in `choices`


@dataclass(frozen=True)
class Item:
    story: Story
    context: list[int]  # filler with the facts hidden in it, then the question and the lead
    choices: list[list[int]]  # token ids of " <room>" per choice


class _World:
    """Where everyone and everything is, as the story so far tells it."""

    def __init__(self, people: list[str], rooms: list[str], objects: list[str]):
        self.rooms = rooms
        self.at: dict[str, str | None] = dict.fromkeys(people)
        self.holder: dict[str, str | None] = dict.fromkeys(objects)
        self.trail: dict[str, list[str]] = {o: [] for o in objects}  # rooms each object has been in

    def move(self, rng: random.Random, person: str) -> str:
        room = rng.choice([r for r in self.rooms if r != self.at[person]])
        self.at[person] = room
        for thing, holder in self.holder.items():
            if holder == person:
                self.trail[thing].append(room)
        return f"{person} {rng.choice(MOVE)} the {room}."

    def takeable(self) -> list[tuple[str, str]]:
        """(person, object) pairs: a placed person and a free object in the same room (or not yet seen)."""
        return [
            (p, o)
            for p, room in self.at.items()
            if room is not None
            for o, holder in self.holder.items()
            if holder is None and (not self.trail[o] or self.trail[o][-1] == room)
        ]

    def take(self, rng: random.Random, person: str, thing: str) -> str:
        self.holder[thing] = person
        if not self.trail[thing]:
            self.trail[thing].append(self.at[person])
        return f"{person} {rng.choice(TAKE)} the {thing}."

    def drop(self, rng: random.Random, thing: str) -> str:
        person, self.holder[thing] = self.holder[thing], None
        return f"{person} {rng.choice(DROP)} the {thing}."


def _events(rng: random.Random, world: _World, task: str, n: int) -> list[str]:
    """`n` story sentences: moves only for qa1; moves, pick-ups and put-downs otherwise."""
    facts = []
    for _ in range(n):
        held = [o for o, holder in world.holder.items() if holder is not None]
        takeable = world.takeable() if task != "qa1" else []
        kind = rng.choices(("move", "take", "drop"), (5, 3 if takeable else 0, 2 if held else 0))[0]
        if kind == "take":
            facts.append(world.take(rng, *rng.choice(takeable)))
        elif kind == "drop":
            facts.append(world.drop(rng, rng.choice(held)))
        else:
            facts.append(world.move(rng, rng.choice(list(world.at))))
    return facts


def _question(rng: random.Random, world: _World, task: str) -> tuple[str, str, str] | None:
    """(question, lead, answer) the story so far can answer, or None."""
    if task == "qa1":
        people = [p for p, room in world.at.items() if room is not None]
        if not people:
            return None
        person = rng.choice(people)
        return f"Where is {person}?", f"{person} is in the", world.at[person]
    if task == "qa2":
        seen = [o for o, trail in world.trail.items() if trail]
        if not seen:
            return None
        thing = rng.choice(seen)
        return f"Where is the {thing}?", f"The {thing} is in the", world.trail[thing][-1]
    asks = [
        (o, i) for o, trail in world.trail.items() for i in range(1, len(trail)) if trail.count(trail[i]) == 1
    ]
    if not asks:
        return None
    thing, i = rng.choice(asks)
    later, earlier = world.trail[thing][i], world.trail[thing][i - 1]
    return (
        f"Where was the {thing} before the {later}?",
        f"Before the {later}, the {thing} was in the",
        earlier,
    )


def make_story(rng: random.Random, task: str, options: BabilongOptions) -> Story:
    for _ in range(MAX_ATTEMPTS):
        people = rng.sample(lexicon("given"), options.people)
        world = _World(people, rng.sample(ROOMS, options.places), rng.sample(OBJECTS, OBJECTS_PER_STORY))
        facts = _events(rng, world, task, options.facts)
        mentioned = [r for r in world.rooms if any(f.endswith(f" the {r}.") for f in facts)]
        if len(mentioned) < 2 or (asked := _question(rng, world, task)) is None:
            continue
        question, lead, right = asked
        rng.shuffle(mentioned)
        return Story(task, tuple(facts), question, lead, tuple(mentioned), mentioned.index(right))
    raise RuntimeError(f"no {task} story with a question in {MAX_ATTEMPTS} tries; raise `facts`")


def _sentences(text: str) -> list[str]:
    return [s for line in text.splitlines() for s in re.split(r"(?<=[.!?])\s+", line.strip()) if s]


def _filler(encode, rng: random.Random, budget: int) -> list[list[int]]:
    """Encoded filler sentences of exactly `budget` tokens in all (the last one cut)."""
    pieces, total, doc = [], 0, rng.randrange(1 << 30)
    while total < budget:
        text = generate_document("edu" if doc % 2 else "web", FILLER_SEED, doc)
        for ids in encode([" " + s for s in _sentences(text)]):
            if total < budget:
                pieces.append(ids[: budget - total])
                total += len(pieces[-1])
        doc += 1
    return pieces


def make_item(tokenizer, story: Story, length: int, rng: random.Random) -> Item:
    """The story's facts at random sentence boundaries of filler, so that context + longest choice
    is exactly `length` tokens."""
    encode = lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"]  # noqa: E731
    facts = encode([" " + f for f in story.facts])
    (question,) = encode([f"\nQuestion: {story.question}\nAnswer: {story.lead}"])
    choices = encode([" " + c for c in story.choices])
    needed = sum(map(len, facts)) + len(question) + max(map(len, choices))
    if needed > length:
        raise ValueError(
            f"length {length} is too short for a {story.task} story of {needed} tokens; lower `facts`"
        )
    filler = _filler(encode, rng, length - needed)
    slots = sorted(rng.randint(0, len(filler)) for _ in facts)
    context: list[int] = []
    for i, piece in enumerate(filler + [[]]):
        context += [t for fact, slot in zip(facts, slots, strict=True) if slot == i for t in fact] + piece
    return Item(story, context + question, choices)


def babilong_items(tokenizer, task: str, length: int, options: BabilongOptions, seed: int) -> list[Item]:
    rng = random.Random(f"babilong-{task}-{length}-{seed}")
    return [
        make_item(tokenizer, make_story(rng, task, options), length, rng) for _ in range(options.examples)
    ]


def accuracy(model, items: list[Item], length: int, batch_size: int) -> float:
    picks = choose(model, [(item.context, item.choices) for item in items], length, batch_size)
    return sum(pick == item.story.answer for pick, item in zip(picks, items, strict=True)) / len(items)


def run_babilong(ctx: EvalContext, _: str | None, options: BabilongOptions) -> dict[str, Any]:
    limit = context_limit(ctx.model)
    lengths = [n for n in options.lengths if limit is None or n <= limit]
    mean = lambda xs: sum(xs) / len(xs) if xs else math.nan  # noqa: E731
    metrics: dict[str, Any] = {}
    chances: list[float] = []
    for length in lengths:
        for task in options.tasks:
            items = babilong_items(ctx.tokenizer, task, length, options, ctx.seed)
            metrics[f"acc.{task}.len{length}"] = accuracy(ctx.model, items, length, options.batch_size)
            chances += [1 / len(item.choices) for item in items]
        metrics[f"acc.len{length}"] = mean([metrics[f"acc.{task}.len{length}"] for task in options.tasks])
    metrics["accuracy"] = mean([metrics[f"acc.len{length}"] for length in lengths])
    metrics["lengths"] = lengths
    metrics["skipped_lengths"] = [n for n in options.lengths if n not in lengths]
    metrics["chance"] = mean(chances)
    return metrics


register_benchmark(
    Benchmark(
        "babilong", 1, run_babilong, BabilongOptions,
        "BABILong: bAbI questions (qa1-qa3) with their facts hidden in 4K-64K tokens of filler",
    )
)  # fmt: skip
