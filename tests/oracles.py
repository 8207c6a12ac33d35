"""A hand-built "perfect recaller" for testing recall benchmarks without training one.

`InductionOracle` predicts, at each position, the token that followed the most recent earlier
occurrence of the longest suffix (up to 8 tokens) of the text so far: the induction-head mechanism
in its pure form. It solves MQAR and passkey retrieval exactly and most recall probes, and knows
nothing else, so a benchmark that cannot tell it from an untrained model is broken. Suffixes of 8 tokens
and not 3: a place name split into sub-word tokens shares its first two or three with names that come
later in a chat ("in L-e-..."), and a 3-token suffix then follows the later name; the recall probe at
distance 6 then scored 7 of 8 on a float-rounding tie between the right name and a wrong one.
"""

from __future__ import annotations

import torch
from torch import nn

from rayb.models.common import LMOutput


class InductionOracle(nn.Module):
    def __init__(self, vocab_size: int, longest: int = 8):
        super().__init__()
        self.vocab_size, self.longest = vocab_size, longest

    def forward(self, input_ids: torch.Tensor) -> LMOutput:
        logits = torch.zeros(*input_ids.shape, self.vocab_size)
        for b, row in enumerate(input_ids.tolist()):
            seen: dict[tuple[int, ...], int] = {}  # n-gram -> position of its last token
            for t in range(len(row)):
                for n in range(min(self.longest, t + 1), 0, -1):
                    if (s := seen.get(tuple(row[t - n + 1 : t + 1]))) is not None:
                        logits[b, t, row[s + 1]] = 10.0
                        break
                for n in range(1, min(self.longest, t + 1) + 1):
                    seen[tuple(row[t - n + 1 : t + 1])] = t
        return LMOutput(logits=logits)
