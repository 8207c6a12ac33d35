"""Which documents are held out for validation: a seeded random sample, decided one document at a time.

Holding out the first rows of each source would make validation one part of the corpus and training
another wherever a corpus is stored in order (files sorted by topic, date or site). Instead each document
is held out or not by a keyed hash of its text, with probability `val_share / (1 + val_share)`, so held-out
tokens come to about `val_share` of training tokens. The decision is taken before packing: held-out
documents are packed into a source's validation stream and the others into its training stream, so no
document is ever split between the two.

Because a document's fate depends only on (data seed, its text), the split is the same whatever the number
of tasks, their order, the row-group layout of the files or how much of a source was read; the same text
in two places (a duplicated document, or one present in two sources) always lands on the same side, so an
exact duplicate cannot carry validation text into training.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class HeldOutRule:
    seed: int  # the study's data seed: another seed draws another sample
    val_share: float  # held-out tokens / training tokens

    @property
    def probability(self) -> float:
        """The chance that a document is held out: a share s of held-out to training tokens is s/(1+s) of all."""
        return self.val_share / (1 + self.val_share)

    def held(self, text: str) -> bool:
        """Whether a document (its text as packing reads it: a missing text is '') is held out."""
        draw = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), key=self._key, digest_size=8).digest()
        return int.from_bytes(draw, "little") < self.probability * 2**64

    @cached_property
    def _key(self) -> bytes:
        # blake2b keys are at most 64 bytes; a digest of the seed fits whatever the seed's size.
        return hashlib.blake2b(f"rayb-held-out/{self.seed}".encode(), digest_size=32).digest()
