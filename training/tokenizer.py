"""A joint (shared source/target) BPE vocabulary trained with the `tokenizers` library, as a transformers tokenizer.

The paper uses one byte-pair-encoding vocabulary of about 37k tokens shared by English and German (Sec. 5.1), so that
source, target and output embeddings can be one matrix (Sec. 3.4). Here sentences are split on whitespace with the
SentencePiece-style `Metaspace` marker, so decoding restores the original spacing exactly and BLEU is computed on
detokenized text. Digits are split one by one before BPE (as in SentencePiece's `split_digits`; not in the paper),
which keeps numbers and dates from being cut at arbitrary places. Special tokens: <pad>=0, <s>=1 (decoder start),
</s>=2 (appended to every sentence), <unk>=3, the ids the model presets expect.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 37000,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    lowercase: bool = False,
    split_punctuation: bool = False,
) -> PreTrainedTokenizerFast:
    """Learn a BPE vocabulary of at most `vocab_size` tokens on `texts` (source and target sentences together).

    `lowercase`: lowercase every text before BPE, at training and at use (source and target alike: the model then
    reads and writes lowercased text, as the published Multi30k systems do). `split_punctuation`: punctuation is a
    token of its own that BPE never merges with a word ("Mann." is "▁Mann" + "."), which spends the vocabulary on
    words rather than on word+punctuation pairs; decoding still restores the original spacing exactly.
    """
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.normalizer = (
        normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]) if lowercase else normalizers.NFKC()
    )
    splits = [pre_tokenizers.Metaspace()]
    if split_punctuation:
        splits.append(pre_tokenizers.Punctuation("isolated"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.Digits(individual_digits=True)])
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS.values()),
        limit_alphabet=1000,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    eos = SPECIAL_TOKENS["eos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, tokenizer.token_to_id(eos))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=model_max_length, **SPECIAL_TOKENS)


def truncate(ids: list[int], limit: int) -> list[int]:
    """`ids` cut to `limit` tokens, keeping the last one (the end-of-sentence token)."""
    return ids if len(ids) <= limit else ids[: limit - 1] + ids[-1:]


def splits_punctuation(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer's pre-tokenizer keeps punctuation apart from words (`split_punctuation=True`)."""
    pre_tokenizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "pre_tokenizer", None)
    return pre_tokenizer is not None and len(pre_tokenizer.pre_tokenize_str("a.")) > 1
