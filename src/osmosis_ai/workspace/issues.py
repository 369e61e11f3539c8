"""How config validation reports problems: one issue per problem, all raised together.

``ConfigValidationError.details()`` is the ``details`` object of the CLI's VALIDATION error.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from osmosis_ai.errors import ConfigError

ConfigKind = Literal["eval", "training"]


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config file.

    ``key`` is the dotted location (``evaluation.n``, a section name, or ``file`` for the
    file as a whole); ``key_correction`` is the known key the author probably meant.
    """

    key: str
    message: str
    key_correction: str | None = None

    def to_dict(self) -> dict[str, str]:
        data = {"key": self.key, "message": self.message}
        if self.key_correction is not None:
            data["key_correction"] = self.key_correction
        return data

    def __str__(self) -> str:
        text = self.message if self.message.startswith(self.key) else f"{self.key}: {self.message}"
        if self.key_correction is not None:
            text += f" (did you mean {self.key_correction!r}?)"
        return text


class ConfigValidationError(ConfigError):
    """A config file has one or more problems; ``issues`` lists every one of them."""

    def __init__(self, kind: ConfigKind, path: Path, issues: Sequence[ConfigIssue]) -> None:
        self.kind: ConfigKind = kind
        self.path = path
        self.issues = list(issues)
        lines = "\n".join(f"  - {issue}" for issue in self.issues)
        super().__init__(f"Invalid {kind} config {path}:\n{lines}")

    def details(self) -> dict[str, object]:
        """``{"error": "Invalid <kind> config", "issues": [{key, message, key_correction?}]}``."""
        return {
            "error": f"Invalid {self.kind} config",
            "issues": [issue.to_dict() for issue in self.issues],
        }


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` is most likely a typo of, if any is close enough."""
    matches = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


def describe_value(value: object) -> str:
    """A short rendering of a TOML value with its type, for messages: ``'8' (string)``."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({toml_type_name(value)})"


def toml_type_name(value: object) -> str:
    """The TOML name of a parsed value's type."""
    names: tuple[tuple[type, str], ...] = (
        (bool, "boolean"),
        (int, "integer"),
        (float, "float"),
        (str, "string"),
        (list, "array"),
        (dict, "table"),
    )
    for cls, name in names:
        if isinstance(value, cls):
            return name
    return "date/time" if hasattr(value, "isoformat") else type(value).__name__
