"""modeling_attn.beam_search: the beam search that drops closed sentences gives transformers' beam search's result."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from tiny import padded_batch, spread_tiny_rnn, tiny_model
from transformers import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList, StoppingCriteriaList

from modeling_attn import beam_search
from modeling_attn.constraints import SentenceConstraints


def eos_prone_transformer(seed: int):
    """A tiny Transformer whose translations end at different lengths (weights scaled up, the end token favoured)."""
    model = tiny_model("sdpa", seed=seed, bos_token_id=1, eos_token_id=2, pad_token_id=0, decoder_start_token_id=1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4)
        model.lm_head.weight[2] += 0.5
    return model


MODELS = {"attn_transformer": eos_prone_transformer, "attn_rnn": lambda seed: spread_tiny_rnn(seed=seed)}


def transformers_generate(model, monkeypatch, **settings) -> torch.Tensor:
    with monkeypatch.context() as patch:
        patch.setattr(type(model), "_beam_search", GenerationMixin._beam_search)
        return model.generate(**settings)


SEARCH = (
    (2, 4),  # num_beams
    (1.0, 0.0, 2.0),  # length_penalty
    (False, True, "never"),  # early_stopping
)
END_FAVOURED = [[[2], 5.0]]  # sequence_bias on the end token: sentences end early and close by the heuristic
LENGTHS = {  # name: (settings, whether sentences must leave the batch in some of its searches)
    "max_new_tokens": ({"max_new_tokens": 10}, False),
    "max_length_over_source": ({"max_length_over_source": 2}, True),
    "min_new_tokens": ({"max_new_tokens": 10, "min_new_tokens": 3}, False),
    "end favoured": ({"max_new_tokens": 10, "sequence_bias": END_FAVOURED}, True),
    "two end tokens": (
        {"max_new_tokens": 10, "eos_token_id": [2, 5], "sequence_bias": [[[2], 5.0], [[5], 3.0]]},
        True,
    ),
    "processors": (
        {
            "max_new_tokens": 10,
            "sequence_bias": END_FAVOURED,
            "repetition_penalty": 1.5,
            "no_repeat_ngram_size": 2,
            "bad_words_ids": [[7]],
        },
        True,
    ),
}


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("model_type", MODELS)
def test_compact_beam_search_equals_transformers_beam_search(model_type, lengths, monkeypatch):
    """Token for token, over the settings that decide when a sentence is done and what it returns, while closed
    sentences do leave the batch (the decoder sees fewer rows) wherever sentences end before the length limit."""
    limit, must_drop = LENGTHS[lengths]
    decoder_rows, drops = [], []
    select_rows = beam_search.select_rows
    monkeypatch.setattr(
        beam_search, "select_rows", lambda kwargs, rows: (drops.append(1), select_rows(kwargs, rows))[1]
    )
    for seed in range(2):
        model = MODELS[model_type](seed)
        input_ids, attention_mask, _ = padded_batch(seed=seed, batch=6, source_length=9)
        handle = model.register_forward_pre_hook(
            lambda module, args, kwargs: decoder_rows.append(kwargs["decoder_input_ids"].shape[0]), with_kwargs=True
        )
        for num_beams, length_penalty, early_stopping in itertools.product(*SEARCH):
            settings = dict(
                input_ids=input_ids,
                attention_mask=attention_mask,
                num_beams=num_beams,
                length_penalty=length_penalty,
                early_stopping=early_stopping,
                num_return_sequences=min(2, num_beams),
                **limit,
            )
            with torch.no_grad():
                ours = model.generate(**settings)
                ours_calls = len(decoder_rows)
                theirs = transformers_generate(model, monkeypatch, **settings)
                del decoder_rows[ours_calls:]  # count ours' rows only
            assert ours.shape == theirs.shape and torch.equal(ours, theirs), settings
        handle.remove()
    if must_drop:
        assert drops, "no sentence left the batch: this group does not exercise the compaction"
        assert min(decoder_rows) < 6 * 2  # fewer rows than sentences times beams at some step


def test_repetition_penalty_with_a_prompt_length_per_row_goes_to_transformers(monkeypatch):
    """With a decoder_attention_mask, transformers gives the repetition penalty one prompt length per row; such a
    processor cannot follow rows that leave, so the call runs transformers' beam search (it used to fail)."""
    model = eos_prone_transformer(0)
    input_ids, attention_mask, _ = padded_batch(batch=6, source_length=9)
    settings = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_attention_mask=torch.ones(6, 1),
        num_beams=2,
        max_length_over_source=2,
        repetition_penalty=1.3,
    )
    with torch.no_grad():
        ours = model.generate(**settings)
        assert torch.equal(ours, transformers_generate(model, monkeypatch, **settings))


def test_batch_dependent_settings_go_to_transformers_beam_search(monkeypatch):
    """Scores and beam indices (return_dict_in_generate) and processors not known to be per-row are laid out over
    the whole batch, and max_time depends on speed: those calls run transformers' beam search, and say why."""
    model = eos_prone_transformer(0)
    input_ids, attention_mask, _ = padded_batch(batch=4)

    class ByBatchRow(LogitsProcessor):  # a processor whose effect on a row depends on the row's batch position
        def __call__(self, input_ids, scores):
            return scores - torch.arange(scores.shape[0], dtype=scores.dtype)[:, None] * 0.01

    refusals = []
    refusal = beam_search.CompactBeamSearchMixin._compact_beam_search_refusal
    monkeypatch.setattr(
        beam_search.CompactBeamSearchMixin,
        "_compact_beam_search_refusal",
        lambda *args: (refusals.append(refusal(*args)), refusals[-1])[1],
    )
    settings = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=8)
    with torch.no_grad():
        scored = model.generate(**settings, return_dict_in_generate=True, output_scores=True)
        processed = model.generate(**settings, logits_processor=LogitsProcessorList([ByBatchRow()]))
        plain = model.generate(**settings)
        timed = model.generate(**settings, max_time=600.0)
    assert "return_dict_in_generate" in refusals[0]
    assert "logits processor" in refusals[1]
    assert refusals[2] is None
    assert "max_time" in refusals[3] and torch.equal(timed, plain)
    with torch.no_grad():
        assert torch.equal(scored.sequences, transformers_generate(model, monkeypatch, **settings))
        assert torch.equal(plain, scored.sequences)
        theirs = transformers_generate(model, monkeypatch, **settings, logits_processor=[ByBatchRow()])
    assert torch.equal(processed, theirs)


def test_only_caches_whose_rows_can_leave_are_shrunk():
    """Dynamic layers (and the RNN's cache) drop rows by `reorder_cache`; static layers keep their batch size, so a
    static cache sends the call to transformers' beam search."""
    from tiny import tiny_config
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache

    from modeling_attn.beam_search import rows_can_leave
    from modeling_attn.compat import CACHE_FIELD
    from modeling_attn.modeling_rnn import AttnRNNCache

    static = StaticCache(config=tiny_config(), max_cache_len=8)
    assert rows_can_leave(EncoderDecoderCache(DynamicCache(), DynamicCache())) and rows_can_leave(AttnRNNCache())
    assert not rows_can_leave(static) and not rows_can_leave(EncoderDecoderCache(DynamicCache(), static))
    refusal = eos_prone_transformer(0)._compact_beam_search_refusal(
        LogitsProcessorList(),
        StoppingCriteriaList(),
        GenerationConfig(num_beams=2),
        False,
        {CACHE_FIELD: EncoderDecoderCache(static, DynamicCache()), "use_cache": True},
    )
    assert refusal == "a cache that cannot drop rows (static or quantized layers)"


# ---------------------------------------------------------------------------------------------------------------
# ListBeamSearch (the fast decoding loop's search on Python numbers) against the tensor search it restates


def test_f32_rounds_as_torch_float32_operations():
    generator = torch.Generator().manual_seed(0)
    scores = (torch.rand(2000, generator=generator) * -60).tolist()  # float32 values, as Python floats
    for score, length, penalty in zip(scores, itertools.cycle(range(1, 41)), itertools.cycle((0.6, 1.0, 1.7, -0.5))):
        divisor = length**penalty
        assert beam_search.f32(score / beam_search.f32(divisor)) == (torch.tensor([score]) / divisor).item()
        assert beam_search.f32(score + beam_search.NEG) == (torch.tensor([score]) + beam_search.NEG).item()
    low = torch.finfo(torch.float32).min  # a forced row's score; a negative length penalty divides it by < 1
    for divisor in (0.5, 0.9999999, 1.0, 2.0):
        assert beam_search.f32(low / beam_search.f32(divisor)) == (torch.tensor([low]) / divisor).item()
        assert beam_search.f32(low + beam_search.NEG) == (torch.tensor([low]) + beam_search.NEG).item()


def test_top_is_torch_topk_ties_and_nan_included():
    generator = torch.Generator().manual_seed(1)
    low = torch.finfo(torch.float32).min
    for size, k in itertools.product((3, 8, 12), (1, 2, 4)):
        if k > size:
            continue
        for trial in range(50):
            values = (torch.randint(-4, 1, (size,), generator=generator) * 0.5).tolist()  # many ties
            if trial % 5 == 1:
                values = torch.rand(size, generator=generator).tolist()  # distinct: the Python sort decides
            if trial % 5 == 2:
                values[trial % size] = float("nan")
            if trial % 5 == 3:
                values[: size // 2] = [low] * (size // 2)
            expected = torch.topk(torch.tensor(values, dtype=torch.float32), k).indices.tolist()
            assert beam_search.top(values, k) == expected, values


def tensor_search_steps(settings, fill, eos, batch_size, log_probs_of):
    """The tensor search (`OpenSentences`, `SearchResults`) as fast_generation ran it before ListBeamSearch:
    per step the rows each next row continues and the kept positions; then the result."""
    beams = settings.num_beams
    state = beam_search.OpenSentences.start(torch.full((batch_size * beams, 1), 1), settings, fill)
    results = beam_search.SearchResults.start(state)
    steps, cur_len = [], 1
    while True:
        log_probs = log_probs_of(cur_len, len(state.sentences) * beams)
        scores, sequences, origins = state.expand(log_probs, settings, cur_len)
        open_count = len(state.sentences)
        stops = torch.isin(sequences[:, :, cur_len], eos)
        if cur_len + 1 >= settings.max_length:
            stops = torch.ones_like(stops)
        state.advance(scores, sequences, origins, stops, settings, cur_len)
        parents = state.running_origins[..., cur_len - settings.prompt_length].flatten()
        cur_len += 1
        closed = results.closed_sentences(state, stops, settings)
        if closed is None:
            steps.append(None)
            break
        kept = None
        if closed.any():
            kept = results.close(state, closed)
            parents = parents.view(open_count, beams)[kept].flatten()
            kept = kept.tolist()
        steps.append((parents.tolist(), kept))
    return steps, lambda returned: results.finish(state, returned, settings.prompt_length)


def list_search_steps(settings, fill, eos, batch_size, log_probs_of):
    search = beam_search.ListBeamSearch(batch_size, settings, [1], fill, eos.tolist())
    steps, cur_len = [], 1
    while True:
        outcome = search.step(log_probs_of(cur_len, len(search.open) * settings.num_beams), cur_len)
        cur_len += 1
        steps.append(outcome)
        if outcome is None:
            return steps, search


@pytest.mark.parametrize("beams", [2, 4])
@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("eos", [[2], [2, 3]])
def test_list_search_equals_the_tensor_search(beams, early_stopping, eos):
    """Both searches driven by the same log-probabilities, step by step: the same decoder rows, the same sentences
    closed, the same result. The log-probabilities have ties (logits in steps of 0.5 over 7 tokens), end tokens
    often, and sentences and rows forced to end (finfo.min but the end tokens, as the per-sentence limit does; with a
    negative length penalty their scores overflow float32)."""
    eos = torch.tensor(eos)
    low = torch.finfo(torch.float32).min
    for penalty, seed in itertools.product((-0.5, 0.0, 0.6, 1.0, 2.0), range(4)):
        config = GenerationConfig(num_beams=beams, length_penalty=penalty, early_stopping=early_stopping)
        config._eos_token_tensor = eos
        config.max_length = 9
        settings = beam_search.BeamSettings.of(config, prompt_length=1)

        def log_probs_of(cur_len: int, rows: int, seed=seed) -> torch.Tensor:
            generator = torch.Generator().manual_seed(1000 * seed + cur_len)
            logits = torch.randint(-6, 3, (rows, 7), generator=generator) * 0.5
            log_probs = torch.log_softmax(logits, dim=-1)
            # whole sentences forced, as the per-sentence limit forces them, and single rows
            forced = (torch.rand(rows // beams, generator=generator) < 0.2).repeat_interleave(beams)
            forced |= torch.rand(rows, generator=generator) < 0.1
            ends = torch.full_like(log_probs, low)
            ends[:, eos] = log_probs[:, eos]
            return torch.where(forced[:, None], ends, log_probs)

        expected, finish = tensor_search_steps(settings, 0, eos, 3, log_probs_of)
        got, search = list_search_steps(settings, 0, eos, 3, log_probs_of)
        assert got == expected, (penalty, seed)
        for returned in range(1, beams + 1):
            assert torch.equal(search.finish(returned, torch.device("cpu")), finish(returned))


# ---------------------------------------------------------------------------------------------------------------
# ConstrainedListBeamSearch (the fast loop's constrained search) against ConstrainedSentences


def constrained_steps(settings, eos, constraints, limits, log_probs_of, listed: bool):
    """Either constrained search driven step by step, as `CompactBeamSearchMixin._beam_search` (tensor) and
    `fast_generation.beam_search` (lists) drive them: per step the rows each next row continues and the kept
    positions; then the search (lists) or a function of the returned count (tensor)."""
    beams, steps, cur_len = settings.num_beams, [], 1
    if listed:
        search = beam_search.ConstrainedListBeamSearch(
            len(limits), settings, [1], 0, eos.tolist(), constraints, limits
        )
        while True:
            sentences = [beams_of.sentence for beams_of in search.open]
            steps.append(search.step(log_probs_of(cur_len, sentences), cur_len))
            cur_len += 1
            if steps[-1] is None:
                return steps, search
    start = torch.full((len(limits) * beams, 1), 1)
    state = beam_search.ConstrainedSentences.start_constrained(start, settings, 0, constraints)
    results = beam_search.SearchResults.start(state)
    while True:
        sentences = state.sentences.tolist()
        at_limit = torch.tensor([cur_len + 1 >= settings.max_length or cur_len >= limits[s] for s in sentences])
        log_probs = log_probs_of(cur_len, sentences)
        scores, sequences, origins = state.expand(log_probs, settings, cur_len, at_limit.repeat_interleave(beams), eos)
        open_count = len(sentences)
        stops = torch.isin(sequences[:, :, cur_len], eos) | (cur_len + 1 >= settings.max_length)
        state.advance(scores, sequences, origins, stops, settings, cur_len)
        parents = state.running_origins[..., cur_len - settings.prompt_length].flatten()
        cur_len += 1
        closed = results.closed_sentences(state, stops, settings)
        if closed is None:
            steps.append(None)
            return steps, lambda returned: results.finish(state, returned, settings.prompt_length)
        kept = None
        if closed.any():
            kept = results.close(state, closed)
            parents = parents.view(open_count, beams)[kept].flatten()
            kept = kept.tolist()
        steps.append((parents.tolist(), kept))


@pytest.mark.parametrize("beams", [2, 4])
@pytest.mark.parametrize("early_stopping", [True, False, "never"])
def test_constrained_list_search_equals_the_tensor_search(beams, early_stopping):
    """Both constrained searches driven by the same log-probabilities (ties: logits in steps of 0.5 over 8 tokens,
    two end tokens), random phrases (none, one or two, overlapping, repeated), per-sentence limits (the rows at their
    limit forced to end, as `SourceLengthLimit` forces them): the same rows, sentences closed and results."""
    eos = torch.tensor([2, 3])
    low = torch.finfo(torch.float32).min
    for penalty, seed in itertools.product((-0.5, 0.6, 1.0, 2.0), range(4)):
        config = GenerationConfig(num_beams=beams, length_penalty=penalty, early_stopping=early_stopping)
        config._eos_token_tensor = eos
        config.max_length = 11
        settings = beam_search.BeamSettings.of(config, prompt_length=1)
        generator = random.Random(seed)
        phrases = [
            [[generator.randint(4, 7) for _ in range(generator.randint(1, 2))] for _ in range(generator.randint(0, 2))]
            for _ in range(3)
        ]
        limits = [generator.randint(3, 10) for _ in range(3)]

        def log_probs_of(cur_len: int, sentences: list[int], seed=seed, limits=limits) -> torch.Tensor:
            generator = torch.Generator().manual_seed(1000 * seed + cur_len)
            rows = len(sentences) * beams
            logits = torch.randint(-6, 3, (rows, 8), generator=generator) * 0.5
            log_probs = torch.log_softmax(logits, dim=-1)
            forced = torch.tensor([cur_len >= limits[s] for s in sentences]).repeat_interleave(beams)
            ends = torch.full_like(log_probs, low)
            ends[:, eos] = log_probs[:, eos]
            return torch.where(forced[:, None], ends, log_probs)

        constraints = [SentenceConstraints(sentence) for sentence in phrases]
        expected, finish = constrained_steps(settings, eos, constraints, limits, log_probs_of, listed=False)
        constraints = [SentenceConstraints(sentence) for sentence in phrases]
        got, search = constrained_steps(settings, eos, constraints, limits, log_probs_of, listed=True)
        assert got == expected, (penalty, seed, phrases, limits)
        for returned in range(1, beams + 1):
            assert torch.equal(search.finish(returned, torch.device("cpu")), finish(returned))
