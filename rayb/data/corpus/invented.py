"""The corpus's invented lexicon (names, places, rivers, species, substances, terms), built once from a fixed
seed, and the two helpers its word lists are written with. Part of the corpus definition: a change here
changes the documents, and must bump GENERATOR_VERSION."""

from __future__ import annotations

import random
from collections.abc import Sequence


def words(text: str) -> tuple[str, ...]:
    """A word list written as one string."""
    return tuple(text.split())


def phrases(text: str) -> tuple[str, ...]:
    """A list of short phrases written as one string, separated by commas (a phrase may wrap a line)."""
    return tuple(" ".join(phrase.split()) for phrase in text.split(",") if phrase.strip())


def lines(text: str) -> tuple[str, ...]:
    """A phrase list written as one string, a phrase per line."""
    return tuple(line.strip() for line in text.strip().splitlines())


ONSETS = words(
    """
    b br d dr f g gr h k kr l m n p r s sh st t th tr v z
    """
)


NUCLEI = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou")
CODAS = ("", "", "", "n", "r", "l", "s", "k", "m", "th", "nd", "rk")


def _make_pool(
    rng: random.Random,
    n: int,
    syllables: Sequence[int],
    suffixes: Sequence[str],
    seen: set[str],
    capital: bool = True,
) -> tuple[str, ...]:
    """n distinct invented words; `seen` keeps the pools disjoint so a name has one role across the corpus."""
    out: list[str] = []
    while len(out) < n:
        word = "".join(
            rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(CODAS) for _ in range(rng.choice(syllables))
        ) + rng.choice(suffixes)
        if not 4 <= len(word) <= 11 or word in seen:
            continue
        seen.add(word)
        out.append(word.capitalize() if capital else word)
    return tuple(out)


def _build_lexicon() -> dict[str, tuple[str, ...]]:
    rng, seen = random.Random(0x5EED_C0DE), set()
    return {
        "countries": _make_pool(rng, 40, (2, 3), ("ia", "and", "esh", "um", "ar"), seen),
        "places": _make_pool(rng, 300, (2, 2, 3), ("", "a", "or", "en", "ost", "ith"), seen),
        "rivers": _make_pool(rng, 120, (2,), ("", "ek", "in", "ay"), seen),
        "given": _make_pool(rng, 240, (1, 2, 2), ("", "a", "o", "an", "is"), seen),
        "family": _make_pool(rng, 240, (2, 2, 3), ("", "el", "ov", "en", "ard"), seen),
        "species": _make_pool(rng, 150, (2,), ("", "et", "un", "ix"), seen, capital=False),
        "substances": _make_pool(rng, 100, (1, 2), ("ite", "ium", "ine", "ar"), seen, capital=False),
        "terms": _make_pool(rng, 100, (2,), ("", "el", "oon", "ack"), seen, capital=False),
    }


LEX = _build_lexicon()


def lexicon(kind: str) -> tuple[str, ...]:
    """The corpus's invented words of one kind (places, given, family, rivers, ...), so evaluation
    probes can be written in the corpus's own vocabulary."""
    return LEX[kind]
