"""``[advanced] report_to`` and ``mlflow_tracking_uri`` of an eval config, checked with the
plan (see :mod:`osmosis_ai.eval.reporting` for what the trackers then record).

The eval config's own sections take only the keys the hosted platform's CLI accepts, so
these ride under ``[advanced]``, which it forwards as written. A bad name, or a tracker whose
library is missing, fails before any rollout runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from osmosis_ai import tracking
from osmosis_ai.errors import ConfigError
from osmosis_ai.workspace import ConfigIssue, ConfigValidationError, EvalConfig
from osmosis_ai.workspace.issues import describe_value
from osmosis_ai.workspace.sections import REPORT_TARGETS, subset_of

FEATURE = "osmosis eval run"
# [advanced] keys a local eval uses (everything else there is recorded, not used)
USED_ADVANCED_KEYS = ("report_to", tracking.MLFLOW_URI_KEY)


@dataclasses.dataclass(frozen=True)
class EvalReporting:
    """What ``[advanced]`` asks of the trackers."""

    targets: tuple[str, ...] = ()
    mlflow_tracking_uri: str | None = None


def reporting_of(config: EvalConfig, environ: Mapping[str, str]) -> EvalReporting:
    """``[advanced] report_to`` / ``mlflow_tracking_uri`` of ``config``, checked, with every
    named tracker's library installed."""
    issues: list[ConfigIssue] = []
    rule = subset_of(REPORT_TARGETS)
    value = config.advanced.get("report_to", [])
    targets: tuple[str, ...] = ()
    if rule.accepts(value):
        targets = tuple(dict.fromkeys(rule.convert(value)))  # pyright: ignore[reportArgumentType]
    else:
        message = f"advanced.report_to must be {rule.expected}, got {describe_value(value)}"
        issues.append(ConfigIssue("advanced.report_to", message))
    uri: str | None = None
    try:
        uri = tracking.mlflow_tracking_uri(config.advanced)
    except ConfigError as exc:
        issues.append(ConfigIssue(f"advanced.{tracking.MLFLOW_URI_KEY}", str(exc)))
    if issues:
        raise ConfigValidationError("eval", config.path, issues)
    tracking.require_installed(targets, FEATURE, environ, mlflow_uri=uri)
    return EvalReporting(targets, uri)
