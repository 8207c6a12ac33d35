"""Tokenizers: a byte-level BPE trained on the study's own mix (the offline default), or any HF tokenizer.

Every model in a study shares one tokenizer, saved once with `save_pretrained` so that training
workers, eval actors and lm-eval all load the identical vocabulary from disk.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rayb.files import atomic_directory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"


def train_bpe(texts: Iterable[str], vocab_size: int, out_dir: Path) -> Path:
    """Train a GPT-2-style byte-level BPE and save it as a transformers tokenizer directory."""
    from transformers import PreTrainedTokenizerFast  # here, not at the top: data tasks need no torch

    out_dir = Path(out_dir)
    if (out_dir / "tokenizer.json").exists():
        return out_dir
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, bos_token=EOS, unk_token=EOS)
    wrapped.pad_token = EOS
    with atomic_directory(out_dir) as scratch:  # whole or not at all, even if this process dies
        wrapped.save_pretrained(scratch.path)
    return out_dir


def load_tokenizer(name_or_dir: str | Path) -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(name_or_dir))
    if tok.eos_token_id is None:
        raise ValueError(
            f"tokenizer '{name_or_dir}' has no end-of-text token; rayb separates documents with it"
        )
    return tok


def ensure_pretrained(name_or_dir: str, out_dir: Path) -> Path:
    """Copy a local or hub tokenizer into the study cache, so workers never need the hub."""
    out_dir = Path(out_dir)
    if not (out_dir / "tokenizer_config.json").exists():
        load_tokenizer(name_or_dir).save_pretrained(out_dir)
    return out_dir
