"""rayb: fair, seeded, matched-compute comparisons of language-model architectures on Ray."""

__version__ = "0.1.0"
