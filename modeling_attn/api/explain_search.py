"""The explainer's search: the beam search (or greedy search) of one sentence, step by step, as a tree.

`run_search` runs the model's own `generate()` with `SearchRecorder` as its beam search observer
(`beam_search_observer`): each step's candidates, their scores and which survive. `beam_tree` and `greedy_tree`
turn what was recorded into the page's tree of hypotheses (the chosen path marked, finished hypotheses with their
final score).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from transformers import PreTrainedModel

from ..beam_search import NEG
from .errors import ExplainError
from .explain_numbers import number


class Candidate(NamedTuple):
    """One continuation considered at one step: its tokens (after the start token), summed log-probability, whether
    it hit a stopping criterion, whether it runs on, and its length-penalised score if it joined the finished ones."""

    path: tuple[int, ...]
    score: float
    stops: bool
    kept: bool
    finished_score: float | None


class SearchRecorder:
    """A `beam_search_observer` (beam_search.py) that keeps every step's candidates of one sentence's search, and
    the finished hypotheses after the last step."""

    def __init__(self) -> None:
        self.steps: list[list[Candidate]] = []
        self.finished: list[tuple[tuple[int, ...], float]] = []
        self.settings = None

    def __call__(self, settings, cur_len, state, scores, sequences, origins, stops) -> None:
        if state.running.shape[0] != 1:
            raise ExplainError("the search recorder follows one sentence at a time")
        self.settings, prompt = settings, settings.prompt_length
        running = {tuple(row.tolist()) for row in state.running[0, :, prompt : cur_len + 1]}
        self.finished = []
        for slot in state.is_finished[0].nonzero().flatten().tolist():
            length = int((state.finished_origins[0, slot] != -1).sum())
            path = tuple(state.finished[0, slot, prompt : prompt + length].tolist())
            self.finished.append((path, float(state.finished_scores[0, slot])))
        finished = dict(self.finished)  # a path of this step's length in it finished at this step
        candidates = []
        for index in range(scores.shape[1]):
            score = float(scores[0, index])
            if score <= NEG / 2:  # a continuation of an empty beam (a vocabulary smaller than the candidates)
                continue
            path = tuple(sequences[0, index, prompt : cur_len + 1].tolist())
            candidates.append(Candidate(path, score, bool(stops[0, index]), path in running, finished.get(path)))
        self.steps.append(candidates)


def run_search(model: PreTrainedModel, encoded: dict[str, torch.Tensor], **generate_kwargs: Any):
    """generate()'s translation (start token first) and, for beam search, the recorder of its search. The search is
    beam search or greedy search: a generation_config that samples is overridden, and sampling asked for refused."""
    if generate_kwargs.get("do_sample"):
        raise ExplainError("the explainer shows beam search or greedy search; do_sample=True is not supported")
    generate_kwargs["do_sample"] = False
    num_beams = generate_kwargs.get("num_beams") or model.generation_config.num_beams or 1
    recorder = SearchRecorder() if num_beams > 1 else None
    model.beam_search_observer = recorder
    try:
        with torch.no_grad():
            sequences = model.generate(**encoded, **generate_kwargs)
    finally:
        model.__dict__.pop("beam_search_observer", None)
    if recorder is not None and not recorder.steps:
        raise ExplainError(
            "generate() ran transformers' own beam search (settings the model's search passes on), which cannot "
            "be recorded; use the model's default decoding settings"
        )
    sequence = sequences[0]
    eos = _eos_ids(model)
    ends = [position for position, token in enumerate(sequence.tolist()) if position > 0 and token in eos]
    return (sequence[: ends[0] + 1] if ends else sequence), recorder


def _eos_ids(model: PreTrainedModel) -> set[int]:
    eos = model.generation_config.eos_token_id
    eos = model.config.eos_token_id if eos is None else eos
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def beam_tree(recorder: SearchRecorder, generated: Sequence[int], labels: dict[int, str]) -> dict[str, Any]:
    """The recorded search as nodes (a root, then every candidate of every step) for the page."""
    best = tuple(generated)
    ranked = sorted(recorder.finished, key=lambda item: -item[1])
    if best not in dict(ranked):
        raise RuntimeError("the recorded search does not end with the translation generate() returned")
    ranks = {path: rank for rank, (path, _) in enumerate(ranked)}
    nodes: list[dict[str, Any]] = [
        {"parent": None, "step": -1, "token": "<start>", "score": 0, "status": "start", "best": True}
    ]
    ids = {(): 0}
    for step, candidates in enumerate(recorder.steps):
        for candidate in sorted(candidates, key=lambda c: -c.score):
            if candidate.path[:-1] not in ids:
                raise RuntimeError(f"step {step}: a candidate continues a hypothesis that was not kept")
            ids[candidate.path] = len(nodes)
            status = "finished" if candidate.finished_score is not None else "kept" if candidate.kept else "dropped"
            nodes.append(
                {
                    "parent": ids[candidate.path[:-1]],
                    "step": step,
                    "token": labels[candidate.path[-1]],
                    "score": number(candidate.score),
                    "status": status,
                    "stops": candidate.stops,
                    "final_score": None if candidate.finished_score is None else number(candidate.finished_score),
                    "rank": ranks.get(candidate.path),
                    "best": best[: len(candidate.path)] == candidate.path,
                }
            )
    settings = recorder.settings
    return {
        "method": "beam",
        "num_beams": settings.num_beams,
        "candidates": settings.candidates,
        "length_penalty": settings.length_penalty,
        "nodes": nodes,
    }


def greedy_tree(log_probs: torch.Tensor, generated: Sequence[int], labels: dict[int, str]) -> dict[str, Any]:
    """Greedy search as a tree: per step the token kept (generate()'s) and the most likely other token, dropped."""
    nodes: list[dict[str, Any]] = [
        {"parent": None, "step": -1, "token": "<start>", "score": 0, "status": "start", "best": True}
    ]
    total, parent = 0.0, 0
    for step, token in enumerate(generated):
        runner_up = next(int(i) for i in log_probs[step].topk(2).indices if int(i) != token)
        kept_id = None
        for candidate in (token, runner_up):
            score = total + float(log_probs[step, candidate])
            last = step == len(generated) - 1
            status = ("finished" if last else "kept") if candidate == token else "dropped"
            nodes.append(
                {
                    "parent": parent,
                    "step": step,
                    "token": labels[candidate],
                    "score": number(score),
                    "status": status,
                    "stops": last and candidate == token,
                    "final_score": number(score) if status == "finished" else None,
                    "rank": 0 if status == "finished" else None,
                    "best": candidate == token,
                }
            )
            if candidate == token:
                kept_id = len(nodes) - 1
        total, parent = total + float(log_probs[step, token]), kept_id
    return {"method": "greedy", "num_beams": 1, "candidates": 2, "length_penalty": None, "nodes": nodes}


__all__ = ["Candidate", "SearchRecorder", "beam_tree", "greedy_tree", "run_search"]
