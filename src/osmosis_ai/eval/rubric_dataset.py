"""Rubric datasets: reading a conversations JSONL into records, and scoring every record.

:func:`evaluate_rubric_dataset` shares one judge (and its connection pool) across records and
runs; a failed judge call is kept as that run's error rather than ending the whole dataset.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_ai.errors import UsageError
from osmosis_ai.eval.judge import DEFAULT_CONCURRENCY, Judge, ProviderRequestError
from osmosis_ai.eval.verdict import ask_judge, check_score_range, check_text, judge_messages

__all__ = [
    "RubricDatasetError",
    "RubricDatasetReport",
    "RubricRecord",
    "RubricRecordResult",
    "RubricRun",
    "RubricStatistics",
    "evaluate_rubric_dataset",
    "load_rubric_dataset",
]


# --- loading a dataset ----------------------------------------------------------------------


class RubricDatasetError(UsageError, ValueError):
    """A line of a rubric dataset (JSONL) is malformed; ``line`` counts from 1."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}, line {line}: {reason}")


@dataclass(frozen=True, slots=True)
class RubricRecord:
    """One record of a rubric dataset; ``line`` counts from 1 and ``id`` comes from ``id`` or
    ``conversation_id``."""

    line: int
    solution_str: str
    id: str | None = None
    ground_truth: str | None = None
    original_input: str | None = None
    metadata: dict[str, object] | None = None


def load_rubric_dataset(path: str | os.PathLike[str]) -> list[RubricRecord]:
    """Read a rubric dataset: one JSON object per line, blank lines skipped.

    A line holds ``messages`` (the last assistant message is the solution; the last user
    message before it is the original input unless ``original_input`` is given) or the
    legacy ``solution_str``; optionally ``ground_truth``, ``metadata``, ``original_input``,
    ``id``/``conversation_id``. Raises ``FileNotFoundError`` and :class:`RubricDatasetError`.
    """
    source = Path(path)
    records: list[RubricRecord] = []
    with source.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if text.strip():
                records.append(_record(source, number, text))
    return records


def _record(path: Path, line: int, text: str) -> RubricRecord:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RubricDatasetError(path, line, f"not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise RubricDatasetError(path, line, f"expected a JSON object, got {type(data).__name__}")
    row: dict[str, Any] = data
    solution, asked = _from_messages(path, line, row.get("messages"))
    if solution is None:
        legacy = row.get("solution_str")
        if legacy is None:
            reason = "no assistant message in 'messages' and no 'solution_str'"
            raise RubricDatasetError(path, line, reason)
        if not isinstance(legacy, str):
            raise RubricDatasetError(path, line, "'solution_str' must be a string")
        solution = legacy
    if not solution.strip():
        raise RubricDatasetError(path, line, "the solution (last assistant message) is empty")
    metadata = row.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise RubricDatasetError(path, line, "'metadata' must be a JSON object")
    identifier = row.get("id", row.get("conversation_id"))
    original = row.get("original_input")
    return RubricRecord(
        line=line,
        solution_str=solution,
        id=None if identifier is None else str(identifier),
        ground_truth=_as_text(row.get("ground_truth")),
        original_input=_as_text(original) if original is not None else asked,
        metadata=metadata,
    )


def _from_messages(path: Path, line: int, messages: object) -> tuple[str | None, str | None]:
    """The last assistant message's text and the last user message's text before it."""
    if messages is None:
        return None, None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise RubricDatasetError(path, line, "'messages' must be a list of message objects")
    turns: list[dict[str, Any]] = messages
    for at in range(len(turns) - 1, -1, -1):
        if turns[at].get("role") == "assistant":
            asked = next(
                (_text(m.get("content")) for m in reversed(turns[:at]) if m.get("role") == "user"),
                None,
            )
            return _text(turns[at].get("content")), asked
    return None, None


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _as_text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


# --- scoring a dataset ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RubricRun:
    """One judge call: a ``score`` and ``explanation``, or the ``error`` it ended with."""

    score: float | None = None
    explanation: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        if self.error is not None:
            return {"error": self.error}
        return {"score": self.score, "explanation": self.explanation}


@dataclass(frozen=True, slots=True)
class RubricRecordResult:
    """A record's runs, in order."""

    record: RubricRecord
    runs: tuple[RubricRun, ...]

    @property
    def scores(self) -> list[float]:
        return [run.score for run in self.runs if run.score is not None]

    @property
    def error(self) -> str | None:
        """The first run's error, if any run failed."""
        return next((run.error for run in self.runs if run.error is not None), None)

    def to_dict(self) -> dict[str, object]:
        scores = self.scores
        return {
            "line": self.record.line,
            "id": self.record.id,
            "scores": scores,
            "average": statistics.fmean(scores) if scores else None,
            "runs": [run.to_dict() for run in self.runs],
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class RubricStatistics:
    """Population statistics over every score; ``None`` values when there is none."""

    count: int
    average: float | None
    variance: float | None
    stdev: float | None
    min: float | None
    max: float | None

    @classmethod
    def of(cls, scores: Sequence[float]) -> RubricStatistics:
        if not scores:
            return cls(0, None, None, None, None, None)
        return cls(
            count=len(scores),
            average=statistics.fmean(scores),
            variance=statistics.pvariance(scores),
            stdev=statistics.pstdev(scores),
            min=min(scores),
            max=max(scores),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "count": self.count,
            "average": self.average,
            "variance": self.variance,
            "stdev": self.stdev,
            "min": self.min,
            "max": self.max,
        }


@dataclass(frozen=True, slots=True)
class RubricDatasetReport:
    """Every record's runs, in dataset order, and the statistics over all their scores."""

    records: tuple[RubricRecordResult, ...]
    statistics: RubricStatistics

    @property
    def failed(self) -> list[RubricRecordResult]:
        return [record for record in self.records if record.error is not None]

    def to_dict(self) -> dict[str, object]:
        return {
            "total_records": len(self.records),
            "failed_records": len(self.failed),
            "statistics": self.statistics.to_dict(),
            "records": [record.to_dict() for record in self.records],
        }


async def evaluate_rubric_dataset(
    records: Sequence[RubricRecord],
    *,
    rubric: str,
    model: str,
    runs: int = 1,
    concurrency: int = DEFAULT_CONCURRENCY,
    score_min: float = 0.0,
    score_max: float = 1.0,
    api_key: str | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 -- per request, as in evaluate_rubric
    system_prompt: str | None = None,
    base_url: str | None = None,
) -> RubricDatasetReport:
    """Score every record ``runs`` times with at most ``concurrency`` judge calls in flight.

    A failed judge call is kept as that run's error (see :attr:`RubricDatasetReport.failed`);
    bad arguments, a missing API key or a missing LiteLLM raise before any call.
    """
    check_score_range(score_min, score_max)
    check_text("rubric", rubric)
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    for record in records:
        check_text(f"solution_str of the record on line {record.line}", record.solution_str)
    gate = asyncio.Semaphore(concurrency)
    judge = Judge(
        model, api_key=api_key, base_url=base_url, timeout=timeout, max_connections=concurrency
    )

    async def one(record: RubricRecord) -> RubricRun:
        messages = judge_messages(
            rubric=rubric,
            solution_str=record.solution_str,
            ground_truth=record.ground_truth,
            original_input=record.original_input,
            metadata=record.metadata,
            score_min=score_min,
            score_max=score_max,
            system_prompt=system_prompt,
        )
        async with gate:
            try:
                result = await ask_judge(judge, messages, score_min, score_max)
            except ProviderRequestError as exc:
                return RubricRun(error=str(exc))
        return RubricRun(score=result.score, explanation=result.explanation)

    async with judge, asyncio.TaskGroup() as group:
        tasks = [[group.create_task(one(record)) for _ in range(runs)] for record in records]
    results = tuple(
        RubricRecordResult(record, tuple(task.result() for task in row))
        for record, row in zip(records, tasks, strict=True)
    )
    every = [score for result in results for score in result.scores]
    return RubricDatasetReport(results, RubricStatistics.of(every))
