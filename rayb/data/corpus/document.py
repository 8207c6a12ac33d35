"""A document under construction, and the pieces every generator shares: fact paragraphs that register
(question, answer) pairs, and the quizzes that ask them back."""

from __future__ import annotations

import random
from collections.abc import Sequence

from rayb.data.corpus.invented import LEX
from rayb.data.corpus.vocabulary import (
    ONES,
    TENS,
)

ANSWER_PREFIX = "Answer: "
QUESTION_PREFIX = "Question: "


# Document length in words: a triangular law from 80 to 600 with mode 90 has a mean near 257, a long tail of
# long documents (where recall distances are largest) and many short ones.
MIN_WORDS, MAX_WORDS, MODE_WORDS = 80, 600, 90


WORDS_PER_QA = 11  # rough size of one Question/Answer pair, reserved before the final quiz
OVERSHOOT = 20  # the block that crosses the body target runs past it by about this much


MIN_FACTS = 2  # even the shortest document asks at least two questions


class Exhausted(Exception):
    """A small pool (events, pets, ...) has no unused member left; the caller picks another kind of block."""


class Doc:
    """Blocks of one document, a running word count, and the (question, answer) facts stated so far."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.blocks: list[str] = []
        self.words = 0
        self.facts: list[tuple[str, str]] = []
        self.refs: list[
            tuple[str, str]
        ] = []  # web: (author, a later post by someone else that repeats a fact)
        self.asked: set[int] = set()
        self.last_was_fact = False
        self._used: set[str] = set()

    def add(self, block: str, is_fact: bool = False) -> None:
        self.blocks.append(block)
        self.words += len(block.split())
        self.last_was_fact = is_fact

    def fact(self, question: str, answer: str) -> None:
        self.facts.append((question, answer))

    def unique(self, pool: Sequence[str]) -> str:
        """A member of `pool` not yet used in this document, so that every question has exactly one answer."""
        for _ in range(32):  # pools are much larger than one document's needs, so this nearly always hits
            word = self.rng.choice(pool)
            if word not in self._used:
                self._used.add(word)
                return word
        left = [word for word in pool if word not in self._used]
        if not left:
            raise Exhausted
        word = self.rng.choice(left)
        self._used.add(word)
        return word

    def person(self) -> str:
        return f"{self.unique(LEX['given'])} {self.unique(LEX['family'])}"

    def text(self) -> str:
        return "\n\n".join(self.blocks)


def state(d: Doc, first: str, options: list[tuple[str, list[tuple[str, str]]]], low: int) -> None:
    """Say `first` and `low`..all of `options` (sentence, facts) in their order; register only facts said."""
    r = d.rng
    keep = sorted(r.sample(range(len(options)), r.randint(low, len(options))))
    sentences = [first]
    for i in keep:
        sentence, facts = options[i]
        sentences.append(sentence)
        for question, answer in facts:
            d.fact(question, answer)
    d.add(" ".join(sentences), is_fact=True)


def quiz(d: Doc, header: str, n: int) -> None:
    """Ask `n` facts back, preferring ones not asked yet; each answer was stated verbatim earlier."""
    r = d.rng
    fresh = [i for i in range(len(d.facts)) if i not in d.asked]
    r.shuffle(fresh)
    picks = fresh[:n]
    if len(picks) < n and d.asked:
        stale = sorted(d.asked)
        picks += r.sample(stale, min(n - len(picks), len(stale)))
    lines = [header]
    for i in picks:
        question, answer = d.facts[i]
        lines += [QUESTION_PREFIX + question, f"{ANSWER_PREFIX}{answer}."]
    d.asked.update(picks)
    d.add("\n".join(lines))


def target_words(r: random.Random) -> int:
    return int(r.triangular(MIN_WORDS, MAX_WORDS, MODE_WORDS))


def question_count(target: int) -> int:
    return 2 + target // 150


def number_words(n: int) -> str:
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    rest = n % 100
    return ONES[n // 100] + " hundred" + ("" if rest == 0 else " and " + number_words(rest))
