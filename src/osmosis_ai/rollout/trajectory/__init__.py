"""Trajectory persistence: a rollout's sample archived as an ATIF document (``ATIF-v1.7``).

``convert`` maps a sample to the document, ``report`` reads the controller's optional
trajectory report from a callback ack, ``save`` writes the files; ``atif`` is internal.
"""

from __future__ import annotations

from osmosis_ai.rollout.trajectory.convert import convert_sample_to_trajectory
from osmosis_ai.rollout.trajectory.report import (
    LlmCallMetrics,
    SampleReport,
    TrajectoryReport,
    report_from_response,
)
from osmosis_ai.rollout.trajectory.save import save_trajectory

__all__ = [
    "LlmCallMetrics",
    "SampleReport",
    "TrajectoryReport",
    "convert_sample_to_trajectory",
    "report_from_response",
    "save_trajectory",
]
