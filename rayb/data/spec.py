"""The `data:` part of a study: the weighted source mix, the tokenizer, the packing and the token budget."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from rayb.data.sources import check_uri, local_uri
from rayb.data.split import HeldOutRule
from rayb.spec import Spec

BYTES_TOKENIZER, BYTE_VOCAB = "bytes", 257  # 256 byte tokens and the end-of-text token


class SourceSpec(Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    uri: str = Field(
        description="embedded://<source>, a local parquet file/dir/glob (relative to the study file), hf://..., "
        "s3://..., gs://..."
    )
    weight: float = Field(gt=0, le=1)
    text_column: str = Field(
        default="text",
        pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$",
        description="the text column; a dotted path reads a struct field (Europarl: translation.fr)",
    )

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, uri: str) -> str:
        check_uri(uri)
        return uri

    @property
    def location(self) -> str:
        """The URI to read: a local path made absolute against the study file's directory (ValueError when it
        holds no parquet file); any other URI as written."""
        return local_uri(self.uri, self.base_dir)


class DataSpec(Spec):
    sources: list[SourceSpec] = Field(min_length=1)
    tokenizer: str = Field(
        default="bpe:2048",
        description="'bpe:<vocab>' trains a byte-level BPE on the mix; 'bytes' is byte-level with no merges "
        "(256 bytes + end of text); otherwise a local tokenizer dir (relative to the study file) or hub id",
    )
    vocab_size: int | None = Field(
        default=None,
        ge=2,
        description="a hub tokenizer's vocabulary size, so models are sized and planned before it is fetched "
        "(checked against the tokenizer once it is)",
    )
    seq_len: int = Field(default=128, ge=8, le=1 << 20)
    token_budget: int = Field(gt=0, description="training tokens every model sees")
    val_share: float = Field(
        default=0.05,
        gt=0,
        lt=0.5,
        description="held-out tokens / training tokens: val.bin holds round(val_share × training rows) rows, "
        "packed from a seeded random sample of whole documents (never one a training row holds)",
    )
    seed: int = Field(default=0, description="the order of the training rows and the sample held out")

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_form(cls, value: str) -> str:
        if value.startswith("bpe:"):
            vocab = value[4:]
            if not vocab.isdigit() or not 260 <= int(vocab) <= 1 << 20:
                raise ValueError(
                    f"'{value}': use bpe:<vocab size>, a whole number from 260 up, e.g. bpe:2048 "
                    "(or bytes for a byte-level vocabulary)"
                )
        return value

    @model_validator(mode="after")
    def _mix(self) -> DataSpec:
        total = sum(s.weight for s in self.sources)
        if abs(total - 1.0) > 1e-6:
            weights = ", ".join(f"{s.name}={s.weight:g}" for s in self.sources)
            raise ValueError(f"source weights must sum to 1, got {total:g} ({weights})")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique, got {names}")
        if (
            self.vocab_size is not None
            and self.trained_vocab is not None
            and self.vocab_size != self.trained_vocab
        ):
            raise ValueError(self._contradiction(self.trained_vocab))
        return self

    def _contradiction(self, known: int) -> str:
        return (
            f"vocab_size {self.vocab_size} contradicts tokenizer '{self.tokenizer}' ({known} tokens); "
            "drop vocab_size, which is only for hub tokenizers"
        )

    def problems(self) -> Iterator[tuple[str, str]]:
        """What only the disk can tell: local sources that hold no parquet file, a local tokenizer whose
        size contradicts vocab_size. (location, message) pairs, as `Study.resolve` reports them."""
        for i, source in enumerate(self.sources):
            try:
                source.location  # noqa: B018 (checks the path)
            except ValueError as exc:
                yield f"sources.{i}.uri", str(exc)
        local = self._local_vocab()
        if self.vocab_size is not None and local is not None and local != self.vocab_size:
            yield "vocab_size", self._contradiction(local)

    @property
    def tokenizer_location(self) -> str:
        """A local tokenizer directory made absolute against the study file's directory; otherwise as
        written (bpe:N, bytes, or a hub id)."""
        path = self.base_dir / Path(self.tokenizer).expanduser()
        return str(path) if path.is_dir() else self.tokenizer

    @property
    def trained_vocab(self) -> int | None:
        """The size of a vocabulary rayb trains on the mix ('bytes' is a BPE with no merges), else None."""
        if self.tokenizer == BYTES_TOKENIZER:
            return BYTE_VOCAB
        return int(self.tokenizer[4:]) if self.tokenizer.startswith("bpe:") else None

    def _local_vocab(self) -> int | None:
        tokenizer_file = Path(self.tokenizer_location) / "tokenizer.json"
        if tokenizer_file.is_file():
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(tokenizer_file)).get_vocab_size(with_added_tokens=True)
        return None

    @property
    def nominal_vocab(self) -> int | None:
        """The vocabulary size known before any data work: bpe:N's N, a local tokenizer's size, or a hub
        tokenizer's declared vocab_size (None: known once the data step has fetched it)."""
        return self.trained_vocab or self._local_vocab() or self.vocab_size

    @property
    def train_rows(self) -> int:
        return self.token_budget // self.seq_len

    @property
    def val_rows(self) -> int:
        return max(1, round(self.train_rows * self.val_share))

    @property
    def held_out(self) -> HeldOutRule:
        """Which documents are held out for validation (split.py)."""
        return HeldOutRule(self.seed, self.val_share)
