"""Statefulness probes: does the model keep what it was told as a conversation goes on?

Every probe is a generated chat (seeded; names and places from rayb's corpus lexicon) ending in a
question, scored by log-likelihood: the right answer must out-score the wrong ones, which are drawn
from words the same chat mentions, so "repeat something from the context" is not enough.

* `recall`: a fact, then 5/10/20/50 distractor turns, then the question (accuracy per distance);
* `correction`: "I like X. Actually, I prefer Y." — the answer is Y, X is among the choices;
* `composition`: two people's ages, "who is older?";
* `interrupted`: a number, an unrelated exchange, "back to my order";
* `persona`: a persona set once, then topic switches, then "what is your name?".

The state persistence score is the largest recall distance up to which accuracy stays at or above
`threshold` (0 if it fails at the shortest).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from rayb.data.corpus import lexicon
from rayb.eval.registry import Benchmark, EvalContext, register_benchmark
from rayb.eval.scoring import choose, context_limit

THINGS = ("key", "bike", "boat", "book", "bag", "coat", "hat", "lamp")
FRUITS = ("apples", "pears", "plums", "oranges", "lemons", "figs", "grapes", "cherries")
JOBS = ("sailor", "baker", "teacher", "painter", "farmer", "doctor", "miller", "weaver")


@dataclass(frozen=True)
class Probe:
    kind: str
    distance: int  # distractor turns between the fact and the question
    context: str
    choices: tuple[str, ...]
    answer: int


@dataclass
class ProbeOptions:
    distances: list[int] = field(default_factory=lambda: [5, 10, 20, 50])
    examples: int = 20  # per distance and per kind
    other_kinds_distance: int = 3  # distractor turns in the correction/composition/... probes
    threshold: float = 0.5  # recall accuracy that counts as "kept" (chance is 0.25)


def _turn(rng: random.Random) -> tuple[str, str]:
    """One distractor exchange, and the place it mentions (a wrong choice for place questions)."""
    place, river = rng.choice(lexicon("places")), rng.choice(lexicon("rivers"))
    person = f"{rng.choice(lexicon('given'))} {rng.choice(lexicon('family'))}"
    return rng.choice(
        (
            f"User: Have you been to {place}?\nReply: Yes, {place} lies on the river {river}.\n",
            f"User: Who did you meet today?\nReply: I met {person} near {place}.\n",
            f"User: What is the weather like in {place}?\nReply: It is {rng.choice(('wet', 'dry', 'cold', 'warm'))} there.\n",
            f"User: Tell me about {river}.\nReply: The {river} runs past {place}.\n",
        )
    ), place


def _distractors(rng: random.Random, n: int) -> tuple[str, list[str]]:
    turns = [_turn(rng) for _ in range(n)]
    return "".join(t for t, _ in turns), [p for _, p in turns]


def _choices(rng: random.Random, right: str, wrong: list[str], k: int = 4) -> tuple[tuple[str, ...], int]:
    pool = list(dict.fromkeys(w for w in wrong if w != right))
    rng.shuffle(pool)
    options = [right, *pool[: k - 1]]
    rng.shuffle(options)
    return tuple(options), options.index(right)


def recall_probe(rng: random.Random, distance: int) -> Probe:
    thing, place = rng.choice(THINGS), rng.choice(lexicon("places"))
    chat, mentioned = _distractors(rng, distance)
    wrong = mentioned + list(rng.sample(lexicon("places"), 3))
    choices, answer = _choices(rng, place, wrong)
    context = f"User: Please remember that my {thing} is in {place}.\nReply: Noted.\n{chat}"
    context += f"User: Where is my {thing}?\nReply: Your {thing} is in"
    return Probe("recall", distance, context, choices, answer)


def correction_probe(rng: random.Random, distance: int) -> Probe:
    first, second, *others = rng.sample(FRUITS, 4)
    chat, _ = _distractors(rng, distance)
    context = (
        f"User: I like {first}. Actually, I prefer {second}.\nReply: Noted.\n{chat}"
        "User: Which fruit do I prefer?\nReply: You prefer"
    )
    return Probe("correction", distance, context, *_choices(rng, second, [first, *others]))


def composition_probe(rng: random.Random, distance: int) -> Probe:
    a, b = rng.sample(lexicon("given"), 2)
    age_a, age_b = rng.sample(range(18, 80), 2)
    chat, _ = _distractors(rng, distance)
    context = (
        f"User: {a} is {age_a} years old. {b} is {age_b} years old.\nReply: Noted.\n{chat}"
        f"User: Who is older, {a} or {b}?\nReply:"
    )
    return Probe("composition", distance, context, *_choices(rng, a if age_a > age_b else b, [a, b], k=2))


def interrupted_probe(rng: random.Random, distance: int) -> Probe:
    number, *others = (str(n) for n in rng.sample(range(1000, 10000), 4))
    chat, _ = _distractors(rng, distance)
    context = (
        f"User: My order number is {number}.\nReply: Let me look.\nUser: Wait, something else first.\n"
        f"{chat}User: Back to my order. What is my order number?\nReply: Your order number is"
    )
    return Probe("interrupted", distance, context, *_choices(rng, number, others))


def persona_probe(rng: random.Random, distance: int) -> Probe:
    name, *others = rng.sample(lexicon("given"), 4)
    job, place = rng.choice(JOBS), rng.choice(lexicon("places"))
    chat, _ = _distractors(rng, distance)
    context = (
        f"System: You are {name}, a {job} from {place}.\n{chat}"
        "User: Let us change the subject. What is your name?\nReply: My name is"
    )
    return Probe("persona", distance, context, *_choices(rng, name, others))


OTHER_KINDS = {
    "correction": correction_probe,
    "composition": composition_probe,
    "interrupted": interrupted_probe,
    "persona": persona_probe,
}


def make_probes(options: ProbeOptions, seed: int) -> list[Probe]:
    rng = random.Random(f"statefulness-{seed}")
    probes = [recall_probe(rng, d) for d in options.distances for _ in range(options.examples)]
    for build in OTHER_KINDS.values():
        probes += [build(rng, options.other_kinds_distance) for _ in range(options.examples)]
    return probes


def score_probes(model, tokenizer, probes: list[Probe], max_length: int) -> list[bool]:
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    items = [(encode(p.context), [encode(" " + c) for c in p.choices]) for p in probes]
    return [pick == p.answer for pick, p in zip(choose(model, items, max_length), probes, strict=True)]


def persistence(accuracy_by_distance: dict[int, float], threshold: float) -> int:
    """The largest distance up to which every accuracy is at least `threshold` (0 if none)."""
    kept = 0
    for distance in sorted(accuracy_by_distance):
        if accuracy_by_distance[distance] < threshold:
            break
        kept = distance
    return kept


def run_statefulness(ctx: EvalContext, _: str | None, options: ProbeOptions) -> dict[str, Any]:
    probes = make_probes(options, ctx.seed)
    max_length = context_limit(ctx.model) or 1 << 20
    right = score_probes(ctx.model, ctx.tokenizer, probes, max_length)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    by_distance = {
        d: mean([r for p, r in zip(probes, right, strict=True) if p.kind == "recall" and p.distance == d])
        for d in options.distances
    }
    metrics: dict[str, Any] = {f"recall_acc.d{d}": acc for d, acc in by_distance.items()}
    for kind in OTHER_KINDS:
        metrics[f"{kind}_acc"] = mean([r for p, r in zip(probes, right, strict=True) if p.kind == kind])
    metrics["accuracy"] = mean(right)
    metrics["state_persistence"] = persistence(by_distance, options.threshold)
    return metrics


register_benchmark(
    Benchmark(
        "statefulness", 1, run_statefulness, ProbeOptions,
        "fact recall after 5-50 distractor turns, correction, composition, interruption, persona",
    )
)  # fmt: skip
