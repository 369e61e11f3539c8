"""One rubric verdict: the judge's prompt, asking the judge, and reading its answer.

The judge answers ``{"score": number, "explanation": string}``; the score is clamped into the
asked range. :func:`~osmosis_ai.eval.rubric.evaluate_rubric` scores one solution with these,
:func:`~osmosis_ai.eval.rubric_dataset.evaluate_rubric_dataset` a whole dataset.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from osmosis_ai.eval.judge import SNIPPET_CHARS, Judge, ProviderRequestError

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "RubricResult",
    "ask_judge",
    "check_score_range",
    "check_text",
    "judge_messages",
]

DEFAULT_SYSTEM_PROMPT = (
    "You are an impartial evaluator. Judge the solution strictly against the rubric, using the "
    "original input, ground truth and metadata when they are given. Answer with one JSON "
    'object and nothing else: {"score": <a number within the score range>, '
    '"explanation": "<a short justification>"}.'
)

_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RubricResult:
    """The judge's verdict: ``score`` within the asked range and its ``explanation``."""

    score: float
    explanation: str


def check_score_range(score_min: float, score_max: float) -> None:
    """Raise ``ValueError`` unless both bounds are finite and ``score_min < score_max``."""
    if not (math.isfinite(score_min) and math.isfinite(score_max)):
        raise ValueError(f"score_min and score_max must be finite, got {score_min}, {score_max}")
    if score_max <= score_min:
        raise ValueError(f"score_max ({score_max}) must be greater than score_min ({score_min})")


def check_text(name: str, value: object) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a non-blank string."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


def judge_messages(
    *,
    rubric: str,
    solution_str: str,
    ground_truth: str | None,
    original_input: str | None,
    metadata: Mapping[str, object] | None,
    score_min: float,
    score_max: float,
    system_prompt: str | None,
) -> list[dict[str, str]]:
    """The judge's conversation: the same inputs always give the same messages."""
    sections = [f"<rubric>\n{rubric.strip()}\n</rubric>"]
    if original_input is not None:
        sections.append(f"<original_input>\n{original_input}\n</original_input>")
    if ground_truth is not None:
        sections.append(f"<ground_truth>\n{ground_truth}\n</ground_truth>")
    if metadata:
        encoded = json.dumps(metadata, sort_keys=True, ensure_ascii=False, default=str)
        sections.append(f"<metadata>\n{encoded}\n</metadata>")
    sections.append(f"<solution>\n{solution_str}\n</solution>")
    sections.append(
        f"Score the solution against the rubric with a number from {score_min:g} to "
        f'{score_max:g}. Reply with only a JSON object: {{"score": <number>, '
        '"explanation": "<why>"}.'
    )
    return [
        {"role": "system", "content": system_prompt or DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(sections)},
    ]


async def ask_judge(
    judge: Judge, messages: list[dict[str, str]], score_min: float, score_max: float
) -> RubricResult:
    """The judge's verdict on ``messages``, its score clamped into ``[score_min, score_max]``.

    Raises :class:`ProviderRequestError` when the request fails or the reply holds no score.
    """
    text = await judge.complete(messages)
    verdict = _parse_verdict(text)
    if verdict is None:
        snippet = text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "…"
        raise ProviderRequestError(
            judge.provider,
            judge.model,
            f"the judge's reply is not a JSON object with a numeric 'score': {snippet!r}",
        )
    score, explanation = verdict
    return RubricResult(min(max(score, score_min), score_max), explanation)


def _parse_verdict(text: str) -> tuple[float, str] | None:
    """The score and explanation in a judge's reply (bare or code-fenced JSON), or ``None``."""
    candidates = [text.strip()]
    fenced = _FENCE.search(text)
    if fenced is not None:
        candidates.insert(0, fenced.group(1))
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict):
            return _verdict_of(data)
    return None


def _verdict_of(data: dict[str, Any]) -> tuple[float, str] | None:
    raw = data.get("score")
    if isinstance(raw, bool):
        return None
    if isinstance(raw, str):
        try:
            raw = float(raw.strip())
        except ValueError:
            return None
    if not isinstance(raw, int | float) or not math.isfinite(raw):
        return None
    explanation = data.get("explanation", "")
    if not isinstance(explanation, str):
        explanation = json.dumps(explanation, ensure_ascii=False)
    return float(raw), explanation
