"""Translate text with a saved model, in Python: `load_model`, `translate_batch`, `translate`, `translate_nbest`.

- `load_model(path)` loads a model folder or Hub repository with its tokenizer, in eval mode, and checks that the
  tokenizer fits the model's vocabulary (`check_tokenizer_fits`) and that the device exists (`resolve_device`).
- `translate_batch(model, tokenizer, sentences)` is one `generate()` call with the model's own `generation_config`
  (or the settings given), on the CPU through `fast_generation.fast_generate` (the same token ids, faster) where it
  applies; with `output_attentions` it also returns each translation's attention.
- `translate(...)` streams translations of any number of sentences, `batch_size` at a time, in input order.
- `translate_nbest(model, tokenizer, sentences, num_return_sequences=N)` gives N scored hypotheses per sentence,
  best first. A score is the log-probability divided by `length ** length_penalty`, the quantity beam search ranks
  by, computed by one teacher-forced pass over the hypotheses (`sequence_scores`) for every decoding.

A sentence longer than the Transformer's position table (`max_position_embeddings`) is refused, never cut
(`SentenceTooLong` names its row). `attn translate`, `attn evaluate` and the recipe's attention picture use these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

import torch
from transformers import (
    AutoTokenizer,
    BatchEncoding,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..constraints import PER_SENTENCE_ARGUMENT
from ..fast_generation import fast_generate
from ..generation import TargetPrefix, per_sentence_offset, sentence_limits
from ..registry import MODEL_TYPES
from .constraints import warn_unmet
from .errors import UserError
from .heatmaps import TranslationAttention, attention_from_generate
from .model_folder import check_config, load_checked
from .values import COUNT


class TranslateError(UserError, ValueError):
    """Bad input to `attn translate` / `attn evaluate`; the message names the file, line or sentence."""


class SentenceTooLong(TranslateError):
    """A sentence has more tokens than the model's position table. `row` is its index among the sentences given
    (`translate_batch`'s batch, `evaluate`'s sources); `detail` is the message without that position."""

    def __init__(self, detail: str, row: int):
        super().__init__(f"sentence {row} of the batch {detail}")
        self.row = row
        self.detail = detail


def check_tokenizer_fits(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    """Raise if the tokenizer can produce ids the model has no embedding for."""
    sizes = {"vocab_size": model.config.vocab_size}
    if getattr(model.config, "decoder_vocab_size", None) is not None:
        sizes["decoder_vocab_size"] = model.config.decoder_vocab_size
    for field, size in sizes.items():
        if len(tokenizer) > size:
            raise TranslateError(
                f"{where}: the tokenizer has {len(tokenizer)} tokens but the model's config.{field} is {size}; ids "
                f"{size}..{len(tokenizer) - 1} have no embedding. Use the tokenizer the model was trained with."
            )


class Hypothesis(NamedTuple):
    """One translation of an n-best list and its score (see the module docstring)."""

    text: str
    score: float


def resolve_device(device: str | None) -> torch.device:
    """`device` as a torch.device (default: CUDA if available, else CPU); TranslateError naming it if this machine
    or this build of torch does not have it."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise TranslateError(f"device {device!r}: not a device name (cpu, cuda, cuda:1, mps...)") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA support" if torch.version.cuda is None else "no GPU is visible"
            raise TranslateError(f"device {device!r}: CUDA is not available ({why}); use --device cpu")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise TranslateError(f"device {device!r}: there are {torch.cuda.device_count()} CUDA devices")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise TranslateError(f"device {device!r}: MPS is not available on this machine; use --device cpu")
    return resolved


def load_model(
    model_name_or_path: str, device: str | None = None, eager: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer saved in a folder or Hub repo, in eval mode on `device` (default: CUDA if any).

    `eager` loads a Transformer with the eager attention, the backend that returns attention weights.
    """
    import modeling_attn  # noqa: F401  (registers the model types with the Auto classes)

    target = resolve_device(device)  # before the (slow) load

    config = check_config(model_name_or_path)  # ModelFolderError (an OSError) naming what is wrong
    folder = Path(model_name_or_path).expanduser()
    if folder.is_dir() and not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise TranslateError(
            f"{model_name_or_path}: no tokenizer (tokenizer.json / tokenizer_config.json); save the tokenizer the "
            "model was trained with in the same folder (tokenizer.save_pretrained)"
        )
    per_head = config.model_type in MODEL_TYPES and MODEL_TYPES[config.model_type].per_head_attention
    kwargs = {"attn_implementation": "eager"} if eager and per_head else {}
    model = load_checked(model_name_or_path, **kwargs)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    except ValueError as error:
        raise TranslateError(
            f"{model_name_or_path}: cannot load the tokenizer: {str(error).splitlines()[0]}"
        ) from error
    check_tokenizer_fits(model, tokenizer, str(model_name_or_path))
    return model.to(target).eval(), tokenizer


@contextlib.contextmanager
def eager_attention(model: PreTrainedModel) -> Iterator[None]:
    """The model with the eager attention (the one that returns attention weights) while the block runs, then the
    attention it had; a model type without per-head attention (the RNN) is left as it is. The switch is seen by
    every thread that runs the model meanwhile (the server runs it in one worker thread). An ensemble
    (`AttnEnsemble`) switches each of its members."""
    members = getattr(model, "members", None)
    if isinstance(members, torch.nn.ModuleList):
        with contextlib.ExitStack() as stack:
            for member in members:
                stack.enter_context(eager_attention(member))
            yield
        return
    implementation = model.config._attn_implementation
    entry = MODEL_TYPES.get(model.config.model_type)
    switch = implementation != "eager" and entry is not None and entry.per_head_attention
    if switch:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if switch:
            model.set_attn_implementation(implementation)


def batches(items: Iterable[str], batch_size: int) -> Iterator[list[str]]:
    """`items` in lists of `batch_size` (the last one shorter); ValueError for a `batch_size` that is not a positive
    integer (0 would end at once: every sentence silently dropped)."""
    COUNT.check("batch_size", batch_size)
    return _batches(iter(items), batch_size)


def _batches(iterator: Iterator[str], batch_size: int) -> Iterator[list[str]]:
    while batch := list(islice(iterator, batch_size)):
        yield batch


def _strings(sentences: Iterable[str]) -> Iterator[str]:
    """`sentences`, each checked to be a string (TypeError naming its index) as it arrives."""
    for number, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(f"sentence {number} is a {type(sentence).__name__}, not a str: {sentence!r:.40}")
        yield sentence


def check_source_lengths(
    config: Any, lengths: list[int], sentences: list[str], rows: list[int], generate_kwargs: dict[str, Any]
) -> None:
    """SentenceTooLong (naming its index in `sentences`) for a sentence of `rows` whose `lengths` (tokens, end token
    included) the model's position table cannot hold, never cut; TranslateError for a `max_new_tokens` over it."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and lengths and max(lengths) > limit:
        index = max(range(len(rows)), key=lambda i: lengths[i])
        sentence = sentences[rows[index]]
        raise SentenceTooLong(
            f"({sentence[:40]!r}{'...' if len(sentence) > 40 else ''}) has {lengths[index]} tokens, more than the "
            f"model's max_position_embeddings={limit}; split it",
            rows[index],
        )
    new_tokens = generate_kwargs.get("max_new_tokens")  # asked for (--max_new_tokens); the config's is the model's
    if limit is not None and new_tokens is not None and new_tokens > limit:
        raise TranslateError(
            f"max_new_tokens={new_tokens} is more than the model's max_position_embeddings={limit}: the decoder has "
            f"no position for a longer translation; use at most {limit}"
        )


def _encode(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    rows: list[int],
    generate_kwargs: dict[str, Any],
) -> BatchEncoding:
    """The tokenized `sentences[row] for row in rows`, padded, on the model's device (`check_source_lengths`)."""
    encoded = tokenizer(
        [sentences[row] for row in rows], padding=True, return_tensors="pt", return_token_type_ids=False
    ).to(model.device)
    lengths = encoded["attention_mask"].sum(dim=1).tolist()
    check_source_lengths(model.config, lengths, sentences, rows, generate_kwargs)
    return encoded


# The engines' options that are not generate() arguments, each engine turning them into its own: a target prefix per
# sentence (None or "": none) and words no translation may contain (docs/translate-evaluate.md, "Steering").
PER_SENTENCE_OPTIONS = ("target_prefix",)
STEERING_OPTIONS = (*PER_SENTENCE_OPTIONS, "bad_words")
# generate()'s repetition and length limits a call may set (`--no_repeat_ngram_size`...), on torch and CTranslate2
REPETITION_OPTIONS = ("no_repeat_ngram_size", "repetition_penalty", "min_new_tokens")


def for_rows(options: dict[str, Any], rows: list[int]) -> dict[str, Any]:
    """`options` for the sentences at `rows` of a call: the per-sentence options' values at those rows."""
    return {
        name: [value[row] for row in rows] if name in PER_SENTENCE_OPTIONS and value is not None else value
        for name, value in options.items()
    }


def target_ids(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """Each text's token ids as the start or part of a translation (no special tokens)."""
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []


def check_bad_words(words: Any) -> list[str]:
    """The `bad_words` option as a list of non-empty strings; TranslateError naming the first bad entry."""
    if isinstance(words, str) or not isinstance(words, list | tuple):
        raise TranslateError(f"bad_words: give a list of words or phrases, not {type(words).__name__} {words!r:.40}")
    for index, word in enumerate(words):
        if not isinstance(word, str) or not word.strip():
            raise TranslateError(f"bad_words[{index}]: {word!r} is not a word (an empty or non-text entry)")
    return list(words)


def translation_limits(model: PreTrainedModel, lengths: list[int], options: dict[str, Any]) -> list[int]:
    """Each translation's length limit in tokens, its end token included, as generate() applies it with `options`:
    `max_new_tokens`, else the per-sentence limit (source length + offset, capped by the position table), else the
    config's `max_length` less the decoder start token."""
    config, kwargs = model.generation_config, dict(options)
    offset = per_sentence_offset(config, kwargs)
    if offset:
        positions = getattr(model.config, "max_position_embeddings", None)
        return sentence_limits(torch.tensor(lengths), offset, positions).tolist()
    if "max_new_tokens" in kwargs or config.max_new_tokens is not None:
        return [kwargs.get("max_new_tokens", config.max_new_tokens)] * len(lengths)
    max_length = kwargs.get("max_length", config.max_length)
    if max_length is None:  # transformers' default where the config has none (as generate() applies it)
        max_length = GenerationConfig._get_default_generation_params()["max_length"]
    return [max_length - 1] * len(lengths)


def check_prefixes(prefixes: list[list[int]], limits: list[int], rows: list[int]) -> None:
    """SentenceTooLong (naming its row) for a prefix with no room left for the end token under its limit."""
    for prefix, limit, row in zip(prefixes, limits, rows, strict=True):
        if len(prefix) >= limit:
            raise SentenceTooLong(
                f"has a target prefix of {len(prefix)} tokens, and its translation at most {limit} tokens with the "
                "end token: shorten the prefix or raise max_new_tokens",
                row,
            )


def generate_arguments(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    encoded: BatchEncoding,
    rows: list[int],
    options: dict[str, Any],
) -> dict[str, Any]:
    """generate()'s keyword arguments for the sentences at `rows` (encoded in `encoded`): `options` with the steering
    options (`STEERING_OPTIONS`) made generate()'s own: `bad_words` added to the model's `bad_words_ids`, each
    sentence's `target_prefix` forced by a `generation.TargetPrefix` processor (SentenceTooLong for one too long)."""
    options = dict(options)
    if (words := options.pop("bad_words", None)) is not None:
        options["bad_words_ids"] = [*(model.generation_config.bad_words_ids or []), *target_ids(tokenizer, words)]
    prefixes = options.pop("target_prefix", None)
    if prefixes is not None and any(prefixes[row] for row in rows):
        ids = target_ids(tokenizer, [prefixes[row] or "" for row in rows])
        lengths = encoded["attention_mask"].sum(dim=1).tolist()
        check_prefixes(ids, translation_limits(model, lengths, options), rows)
        longest = max(len(prefix) for prefix in ids)
        padded = torch.tensor([prefix + [-1] * (longest - len(prefix)) for prefix in ids], device=model.device)
        options["logits_processor"] = [*options.get("logits_processor", []), TargetPrefix(padded)]
    return options


def _constrain(
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    rows: list[int],
    constraints: list[list[str]] | None,
    generate_kwargs: dict[str, Any],
) -> None:
    """Put the constraints of the sentences `rows` (`constraints`: one list of target phrases per sentence) into
    `generate_kwargs` as generate()'s `force_words_ids_per_sentence`, when any has one (`api/constraints.py`)."""
    if constraints is None:
        return
    from .constraints import ConstraintError, sentence_phrase_ids

    if len(constraints) != len(sentences):
        raise ConstraintError(f"constraints: {len(constraints)} entries for {len(sentences)} sentences; give one each")
    ids = sentence_phrase_ids(tokenizer, constraints)
    if any(ids[row] for row in rows):
        generate_kwargs[PER_SENTENCE_ARGUMENT] = [ids[row] for row in rows]


def _unmet(tokenizer: PreTrainedTokenizerBase, constraints: list[list[str]] | None, row: int, text: str) -> list[str]:
    """The phrases of sentence `row`'s constraints that its translation `text` lacks."""
    if not constraints or not constraints[row]:
        return []
    from .constraints import missing_phrases

    return missing_phrases(tokenizer, text, constraints[row])


def _generate(model: PreTrainedModel, encoded: BatchEncoding, generate_kwargs: dict[str, Any]) -> Any:
    """`model.generate()`'s output for the encoded sources: on the CPU through `fast_generation.fast_generate`, the
    same token ids without generate()'s machinery, where it takes the model and settings (a GPU, not measured
    there, and anything it does not replicate go to generate())."""
    if model.device.type == "cpu":
        sequences = fast_generate(model, encoded["input_ids"], encoded["attention_mask"], **generate_kwargs)
        if sequences is not None:
            return sequences
    return model.generate(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"], **generate_kwargs)


@torch.no_grad()
def translate_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    output_attentions: bool = False,
    constraints: list[list[str]] | None = None,
    **generate_kwargs: Any,
) -> tuple[list[str], list[TranslationAttention | None] | None]:
    """Translations of `sentences` (one generate() call) and, with `output_attentions`, their attention (None for
    an empty sentence).

    Empty sentences translate to empty strings without reaching the model. `constraints`: per sentence, target
    phrases its translation must contain (lexically constrained beam search, `modeling_attn.constraints`); a
    translation that lacks one (it did not fit within the length limit) gives a `ConstraintWarning`.
    """
    if generate_kwargs.get("num_return_sequences", 1) != 1:
        raise TranslateError("translate_batch returns one translation per sentence; use translate_nbest for several")
    translations = [""] * len(sentences)
    rows = [row for row, sentence in enumerate(sentences) if sentence.strip()]
    attentions: list[TranslationAttention | None] | None = [None] * len(sentences) if output_attentions else None
    if not rows:
        return translations, attentions
    encoded = _encode(model, tokenizer, sentences, rows, generate_kwargs)
    generate_kwargs = generate_arguments(model, tokenizer, encoded, rows, generate_kwargs)
    _constrain(tokenizer, sentences, rows, constraints, generate_kwargs)
    if output_attentions:
        generate_kwargs.update(output_attentions=True, return_dict_in_generate=True)
    outputs = _generate(model, encoded, generate_kwargs)
    sequences = outputs.sequences if output_attentions else outputs
    for row, text in zip(rows, tokenizer.batch_decode(sequences, skip_special_tokens=True), strict=True):
        translations[row] = text
    for row, text in enumerate(translations):
        if missing := _unmet(tokenizer, constraints, row, text):
            warn_unmet(row, missing)
    if output_attentions:
        for index, row in enumerate(rows):
            attentions[row] = attention_from_generate(
                outputs, encoded["input_ids"], encoded["attention_mask"], index, tokenizer
            )
    return translations, attentions


def _eos_ids(model: PreTrainedModel) -> list[int]:
    eos = model.generation_config.eos_token_id
    eos = model.config.eos_token_id if eos is None else eos
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


@torch.no_grad()
def teacher_forced_log_probs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    sequences: torch.Tensor,
    rows_per_pass: int = 16,
) -> torch.Tensor:
    """(rows, length - 1), float32: the log-probability of each token of `sequences` after the first (the decoder
    start token), given its source and the tokens before it, read teacher-forced; the one forward of
    `sequence_scores` and of scoring (`scoring.py`). For an `AttnEnsemble`, its combined distribution.

    `input_ids`/`attention_mask` are the sources; each has `len(sequences) // len(input_ids)` consecutive sequences
    (generate()'s `num_return_sequences` layout). A source is encoded once for all its sequences; about
    `rows_per_pass` sequences go through the decoder at a time, so that the (rows, length, vocabulary) logits stay
    small.
    """
    per_source = len(sequences) // len(input_ids)
    if per_source * len(input_ids) != len(sequences):
        raise ValueError(f"{len(sequences)} sequences for {len(input_ids)} sources: not a whole number per source")
    decoder_input_ids, targets = sequences[:, :-1], sequences[:, 1:]
    found = []
    step = max(1, rows_per_pass // per_source)
    for start in range(0, len(input_ids), step):
        sources, rows = slice(start, start + step), slice(start * per_source, (start + step) * per_source)
        encoded = model.get_encoder()(input_ids=input_ids[sources], attention_mask=attention_mask[sources])
        # As generate() expands them for its beams: every tensor of the encoder's output repeated along the batch
        # (an ensemble's holds a tuple of them, one per member).
        for key, value in encoded.items():
            if isinstance(value, torch.Tensor):
                encoded[key] = value.repeat_interleave(per_source, dim=0)
            elif isinstance(value, tuple) and all(isinstance(item, torch.Tensor) for item in value):
                encoded[key] = tuple(item.repeat_interleave(per_source, dim=0) for item in value)
        logits = model(
            attention_mask=attention_mask[sources].repeat_interleave(per_source, dim=0),
            encoder_outputs=encoded,
            decoder_input_ids=decoder_input_ids[rows],
            use_cache=False,
        ).logits.float()
        token_logits = logits.gather(-1, targets[rows, :, None]).squeeze(-1)
        found.append(token_logits - logits.logsumexp(dim=-1))
    return torch.cat(found)


@torch.no_grad()
def sequence_scores(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    sequences: torch.Tensor,
    length_penalty: float = 1.0,
    rows_per_pass: int = 16,
) -> torch.Tensor:
    """Scores of generated `sequences` (decoder start token first, as generate() returns them), one per row:
    the sum of the log-probabilities of their tokens up to and including the first end-of-sentence token, divided by
    (that many tokens) ** `length_penalty`: beam search's `sequences_scores`, computed teacher-forced
    (`teacher_forced_log_probs`, whose layout of sources and sequences this takes).
    """
    log_probs = teacher_forced_log_probs(model, input_ids, attention_mask, sequences, rows_per_pass)
    eos = torch.tensor(_eos_ids(model), device=sequences.device)
    ends = torch.isin(sequences[:, 1:], eos).int()
    # Tokens after the first end-of-sentence are padding; a sequence cut at the length limit counts every token.
    counted = (ends.cumsum(dim=1) - ends) == 0
    lengths = counted.sum(dim=1).clamp(min=1).float()
    return (log_probs * counted).sum(dim=1) / lengths**length_penalty


def check_nbest(model: PreTrainedModel, num_return_sequences: int, generate_kwargs: dict[str, Any]) -> None:
    """TranslateError if generate() cannot return `num_return_sequences` hypotheses with these settings."""
    config = model.generation_config
    num_beams = generate_kwargs.get("num_beams") or config.num_beams or 1
    do_sample = generate_kwargs.get("do_sample", config.do_sample)
    if num_return_sequences < 1:
        raise TranslateError(f"num_return_sequences must be a positive integer, got {num_return_sequences}")
    if num_return_sequences > num_beams and (num_beams > 1 or not do_sample):
        raise TranslateError(
            f"num_return_sequences={num_return_sequences} is more than num_beams={num_beams}: beam search keeps "
            "num_beams hypotheses; raise num_beams, or sample (do_sample) with one beam"
        )


@torch.no_grad()
def translate_nbest(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    num_return_sequences: int = 1,
    constraints: list[list[str]] | None = None,
    **generate_kwargs: Any,
) -> list[list[Hypothesis]]:
    """`num_return_sequences` scored translations of each of `sentences` (one generate() call), best first; with
    `constraints` (as `translate_batch`'s), those that contain their sentence's phrases first.

    Beam search returns its `num_return_sequences` best hypotheses (at most `num_beams`); with `do_sample=True`
    and one beam they are independent samples (set the seed with `transformers.set_seed` to repeat them). An empty
    sentence gets `num_return_sequences` empty hypotheses scored NaN (the model is not run on it).
    """
    check_nbest(model, num_return_sequences, generate_kwargs)
    empty = [Hypothesis("", float("nan"))] * num_return_sequences
    hypotheses = [list(empty) for _ in sentences]
    rows = [row for row, sentence in enumerate(sentences) if sentence.strip()]
    if not rows:
        return hypotheses
    encoded = _encode(model, tokenizer, sentences, rows, generate_kwargs)
    arguments = generate_arguments(model, tokenizer, encoded, rows, generate_kwargs)
    arguments["num_return_sequences"] = num_return_sequences
    _constrain(tokenizer, sentences, rows, constraints, arguments)
    sequences = _generate(model, encoded, arguments)
    length_penalty = generate_kwargs.get("length_penalty", model.generation_config.length_penalty)
    scores = sequence_scores(
        model,
        encoded["input_ids"],
        encoded["attention_mask"],
        sequences,
        1.0 if length_penalty is None else length_penalty,
    ).tolist()
    texts = tokenizer.batch_decode(sequences, skip_special_tokens=True)
    for index, row in enumerate(rows):
        block = slice(index * num_return_sequences, (index + 1) * num_return_sequences)
        found = [Hypothesis(text, score) for text, score in zip(texts[block], scores[block], strict=True)]
        unmet = {text: bool(_unmet(tokenizer, constraints, row, text)) for text, _ in found}
        hypotheses[row] = sorted(found, key=lambda hypothesis: (unmet[hypothesis.text], -hypothesis.score))
    for row, block in enumerate(hypotheses):  # samples come unordered
        if missing := _unmet(tokenizer, constraints, row, block[0].text):
            warn_unmet(row, missing)
    return hypotheses


def generation_overrides(args: Any) -> dict[str, Any]:
    """The generation settings given in `args` (the flags of `attn translate` / `attn evaluate`, the options of a
    request to `attn serve`): the attributes `num_beams`, `length_penalty`, `max_new_tokens`, `top_k`, `top_p`,
    `temperature`, the repetition limits `no_repeat_ngram_size`, `repetition_penalty`, `min_new_tokens` and the
    steering option `bad_words` (a list of words: a tuple here, hashable) that are not None, and `do_sample`; the
    others come from the model's generation_config."""
    names = (
        "num_beams",
        "length_penalty",
        "max_new_tokens",
        "top_k",
        "top_p",
        "temperature",
        *REPETITION_OPTIONS,
    )
    overrides = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    if isinstance(words := getattr(args, "bad_words", None), list | tuple):  # a request's (the flag's is a file)
        overrides["bad_words"] = tuple(check_bad_words(words))
    if getattr(args, "do_sample", False):
        overrides["do_sample"] = True
        overrides.setdefault("num_beams", 1)  # plain sampling, not the beam sampling a saved num_beams would give
    return overrides


def translate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Iterable[str],
    batch_size: int = 32,
    **generate_kwargs: Any,
) -> Iterator[str]:
    """Translations of `sentences`, in order, computed `batch_size` at a time as the input arrives (no sentences: no
    translations). A bad `batch_size` raises ValueError at the call, one string instead of a list of them TypeError;
    a sentence that is not a string raises TypeError naming its index when it is reached; bad generate() settings
    (`num_beams=0`, a NaN `length_penalty`...) at the first batch, naming the setting (`modeling_attn.generation`)."""
    if isinstance(sentences, str | bytes):  # it would be translated character by character
        raise TypeError(f"sentences: give a list of sentences, not one {type(sentences).__name__}: {sentences!r:.40}")
    return (
        translation
        for batch in batches(_strings(sentences), batch_size)
        for translation in translate_batch(model, tokenizer, batch, **generate_kwargs)[0]
    )


__all__ = [
    "PER_SENTENCE_OPTIONS",
    "REPETITION_OPTIONS",
    "STEERING_OPTIONS",
    "Hypothesis",
    "SentenceTooLong",
    "TranslateError",
    "batches",
    "check_bad_words",
    "check_nbest",
    "check_prefixes",
    "for_rows",
    "generate_arguments",
    "check_source_lengths",
    "check_tokenizer_fits",
    "eager_attention",
    "generation_overrides",
    "load_model",
    "resolve_device",
    "sequence_scores",
    "teacher_forced_log_probs",
    "translate",
    "translate_batch",
    "target_ids",
    "translate_nbest",
    "translation_limits",
]
