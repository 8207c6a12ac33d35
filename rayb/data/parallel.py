"""A generated stand-in for a parallel corpus (Europarl fr–en): rows of {"translation": {"en", "fr"}}.

Europarl on the hub is one struct column, `translation`, holding a sentence and its translation. The
stand-in has that schema, so a study reads it exactly as it would read the real data (`text_column:
translation.fr`). The English side is sentences of rayb's embedded corpus; the "French" side is a
deterministic word-for-word cipher of it into invented words with French-looking endings, keeping
punctuation, numbers and capitals. It is a consistent second language a model can learn, no more.
"""

from __future__ import annotations

import hashlib
import re

import pyarrow as pa

from rayb.data.corpus import generate_document

_STEMS = ("b", "c", "d", "f", "g", "j", "l", "m", "n", "p", "r", "s", "t", "v", "ch", "gr", "pl", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "é", "è", "eu")
_ENDINGS = ("eau", "ique", "ment", "oir", "ette", "elle", "ier", "ais", "on", "ure", "ance", "eur")
_WORD = re.compile(r"[A-Za-z]+")


def cipher_word(word: str) -> str:
    """The same English word always maps to the same invented word, whatever the document."""
    h = hashlib.blake2b(word.lower().encode(), digest_size=8).digest()
    syllables = 1 + h[0] % 2 + (len(word) > 6)
    stem = "".join(
        _STEMS[h[1 + i] % len(_STEMS)] + _VOWELS[h[4 + i] % len(_VOWELS)] for i in range(syllables)
    )
    out = stem + _ENDINGS[h[7] % len(_ENDINGS)]
    return out.capitalize() if word[0].isupper() else out


def translate(sentence: str) -> str:
    return _WORD.sub(lambda m: cipher_word(m.group(0)), sentence)


def parallel_rows(n_docs: int, seed: int) -> pa.Table:
    """Sentence pairs from the first n_docs embedded documents (edu and web alternating)."""
    pairs = []
    for i in range(n_docs):
        document = generate_document("edu" if i % 2 == 0 else "web", seed, i)
        for line in document.splitlines():
            if line.strip():
                pairs.append({"en": line, "fr": translate(line)})
    return pa.table(
        {"translation": pa.array(pairs, type=pa.struct([("en", pa.string()), ("fr", pa.string())]))}
    )
