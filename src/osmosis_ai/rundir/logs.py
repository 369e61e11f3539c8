"""The run log ``logs.txt`` of every run (eval and training) and the one redactor that keeps
secret values out of logs, errors and reports.

Lines read ``<ISO> <LEVEL> [<step>] <message> <canonical JSON details>``. Every registered
secret value (provider keys, run tokens) is replaced by ``[REDACTED]`` in the message, the
details and any text passed through, such as a child process's output. The file is
owner-only (0600), whichever run writes it.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from osmosis_ai.errors import UsageError
from osmosis_ai.rundir.durable import HeldFile, canonical_json, open_owner_only, write_all
from osmosis_ai.rundir.timestamps import iso_utc

if TYPE_CHECKING:
    from pydantic import JsonValue

LOGS_FILE = "logs.txt"
REDACTED = "[REDACTED]"
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
Details = Mapping[str, object] | None
_LEVELS: frozenset[str] = frozenset({"DEBUG", "INFO", "WARNING", "ERROR"})


class Redactor:
    """Replaces every registered secret value with ``[REDACTED]``, longest value first.

    Values of any length are redacted (short ones too); the empty string is never registered,
    since it would match everywhere. Safe to share between threads.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(*secrets)

    def add(self, *values: str) -> None:
        """Register secret values; empty strings and repeats are ignored."""
        with self._lock:
            new = {v for v in values if v} - self._values
            if not new:
                return
            self._values |= new
            # One alternation, longest first: a secret that contains another is replaced
            # whole, and replacement text is never scanned again.
            ordered = sorted(self._values, key=lambda v: (-len(v), v))
            self._pattern = re.compile("|".join(re.escape(v) for v in ordered))

    def __len__(self) -> int:
        return len(self._values)

    def redact(self, text: str) -> str:
        pattern = self._pattern
        return text if pattern is None else pattern.sub(REDACTED, text)

    def redact_json(self, value: object) -> JsonValue:
        """A JSON-safe copy of ``value`` with secrets redacted in every string and key.

        Non-finite floats and objects JSON cannot hold become strings.
        """
        if value is None or isinstance(value, bool | int):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else str(value)
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, Mapping):
            items: Iterable[tuple[object, object]] = value.items()
            return {self.redact(str(k)): self.redact_json(v) for k, v in items}
        if isinstance(value, list | tuple | set | frozenset):
            members: Iterable[object] = value
            return [self.redact_json(v) for v in members]
        return self.redact(str(value))


class RunLog(HeldFile):
    """Appends redacted lines to ``logs.txt`` (owner-only); safe to share between threads.

    Details come as a mapping, as keyword fields, or both. A line logged after :meth:`close`
    is dropped: a thread still reporting as the run ends must not fail over its log.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        redactor: Redactor | None = None,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        super().__init__(Path(path), open_owner_only(Path(path), os.O_WRONLY | os.O_APPEND))
        self.redactor = redactor if redactor is not None else Redactor()
        self._clock = clock

    def log(
        self,
        level: LogLevel,
        step: str,
        message: str,
        details: Mapping[str, object] | None = None,
    ) -> None:
        """Write one line; newlines in the message are escaped so a record stays one line."""
        if level not in _LEVELS:
            raise UsageError(f"log level must be one of {sorted(_LEVELS)}, got {level!r}")
        text = _one_line(self.redactor.redact(message))
        extra = canonical_json(self.redactor.redact_json(dict(details or {})))
        stamp = iso_utc(self._clock() if self._clock is not None else None)
        line = f"{stamp} {level} [{_one_line(step)}] {text} {extra}\n".encode()
        with self._lock:
            if self._fd >= 0:
                write_all(self._fd, line)

    def debug(self, step: str, message: str, details: Details = None, /, **fields: object) -> None:
        self.log("DEBUG", step, message, _merged(details, fields))

    def info(self, step: str, message: str, details: Details = None, /, **fields: object) -> None:
        self.log("INFO", step, message, _merged(details, fields))

    def warning(
        self, step: str, message: str, details: Details = None, /, **fields: object
    ) -> None:
        self.log("WARNING", step, message, _merged(details, fields))

    def error(self, step: str, message: str, details: Details = None, /, **fields: object) -> None:
        self.log("ERROR", step, message, _merged(details, fields))

    def redact(self, text: str) -> str:
        """``text`` with every secret of this log's redactor replaced by ``[REDACTED]``."""
        return self.redactor.redact(text)

    def add_secrets(self, *values: str) -> None:
        """Redact these values too, from the next line on."""
        self.redactor.add(*values)

    def output(self, step: str, text: str, *, level: LogLevel = "INFO") -> None:
        """Log a child process's output, one line per non-blank line, redacted.

        The whole chunk is redacted before it is split, so a secret that itself holds a
        line break (a PEM key) is still caught.
        """
        for line in self.redactor.redact(text).splitlines():
            if line.strip():
                self.log(level, step, line)


def _merged(details: Details, fields: Mapping[str, object]) -> Mapping[str, object] | None:
    return {**details, **fields} if details and fields else (details or fields)


def _one_line(text: str) -> str:
    return text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")
