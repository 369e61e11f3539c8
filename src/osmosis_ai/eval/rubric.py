"""LLM-as-judge scoring: :func:`evaluate_rubric`, and the public names of rubric evaluation.

The judge answers ``{"score": number, "explanation": string}``; the score is clamped into the
asked range. The endpoint lives in :mod:`.judge`, the prompt and verdict in :mod:`.verdict`,
datasets in :mod:`.rubric_dataset`; all keep their public names importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from osmosis_ai.eval.judge import (
    DEFAULT_CONCURRENCY,
    DEFAULT_OPENAI_BASE_URL,
    DEFAULT_TIMEOUT_S,
    Judge,
    LiteLLMNotInstalledError,
    MissingAPIKeyError,
    ModelNotFoundError,
    ProviderRequestError,
)
from osmosis_ai.eval.verdict import (
    DEFAULT_SYSTEM_PROMPT,
    RubricResult,
    ask_judge,
    check_score_range,
    check_text,
    judge_messages,
)

if TYPE_CHECKING:
    from osmosis_ai.eval.rubric_dataset import (
        RubricDatasetError,
        RubricDatasetReport,
        RubricRecord,
        RubricRecordResult,
        RubricRun,
        RubricStatistics,
        evaluate_rubric_dataset,
        load_rubric_dataset,
    )

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_OPENAI_BASE_URL",
    "DEFAULT_SYSTEM_PROMPT",
    "DEFAULT_TIMEOUT_S",
    "LiteLLMNotInstalledError",
    "MissingAPIKeyError",
    "ModelNotFoundError",
    "ProviderRequestError",
    "RubricDatasetError",
    "RubricDatasetReport",
    "RubricRecord",
    "RubricRecordResult",
    "RubricResult",
    "RubricRun",
    "RubricStatistics",
    "evaluate_rubric",
    "evaluate_rubric_dataset",
    "load_rubric_dataset",
]


async def evaluate_rubric(
    *,
    solution_str: str,
    rubric: str,
    model: str,
    ground_truth: str | None = None,
    original_input: str | None = None,
    metadata: Mapping[str, object] | None = None,
    score_min: float = 0.0,
    score_max: float = 1.0,
    api_key: str | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 -- per request, part of the public contract
    system_prompt: str | None = None,
    base_url: str | None = None,
) -> RubricResult:
    """Ask the judge ``model`` (``provider/model``) to score ``solution_str`` against ``rubric``.

    ``openai/<model>`` posts to ``base_url``, else ``OPENAI_BASE_URL``/``OPENAI_API_BASE``,
    else the OpenAI API, with ``api_key`` or ``OPENAI_API_KEY`` (optional on a loopback
    URL). ``timeout`` is seconds per request (default :data:`DEFAULT_TIMEOUT_S`).
    Raises ``ValueError`` for bad arguments, :class:`MissingAPIKeyError`,
    :class:`ProviderRequestError` and its :class:`ModelNotFoundError`.
    """
    check_score_range(score_min, score_max)
    check_text("rubric", rubric)
    check_text("solution_str", solution_str)
    async with Judge(model, api_key=api_key, base_url=base_url, timeout=timeout) as judge:
        return await ask_judge(
            judge,
            judge_messages(
                rubric=rubric,
                solution_str=solution_str,
                ground_truth=ground_truth,
                original_input=original_input,
                metadata=metadata,
                score_min=score_min,
                score_max=score_max,
                system_prompt=system_prompt,
            ),
            score_min,
            score_max,
        )


# The dataset names live in .rubric_dataset: resolve them on first access (PEP 562) so that
# scoring one solution does not load the dataset code.
_DATASET_NAMES = frozenset(
    {
        "RubricDatasetError",
        "RubricDatasetReport",
        "RubricRecord",
        "RubricRecordResult",
        "RubricRun",
        "RubricStatistics",
        "evaluate_rubric_dataset",
        "load_rubric_dataset",
    }
)


def __getattr__(name: str) -> Any:
    if name not in _DATASET_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from osmosis_ai.eval import rubric_dataset

    value = getattr(rubric_dataset, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_DATASET_NAMES})
