"""The Dockerfile subset the local sandbox applies: parsing, ``ARG``/``ENV`` expansion and
``COPY``/``ADD`` sources.

``FROM`` is accepted and ignored (the host root is the base image); ``ARG``, ``ENV``,
``WORKDIR``, ``USER``, ``RUN``, ``COPY`` and ``ADD`` are applied by the sandbox; ``LABEL``,
``EXPOSE``, ``CMD``, ``MAINTAINER``, ``STOPSIGNAL`` and ``HEALTHCHECK`` change nothing Harbor
relies on and are skipped. Anything else is refused with
:class:`~osmosis_ai.rollout.backend.harbor.errors.UnsupportedDockerfileError` naming it.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path

from osmosis_ai.rollout.backend.harbor.errors import UnsupportedDockerfileError

__all__ = [
    "BuildState",
    "Instruction",
    "copy_sources",
    "expand",
    "parse_assignments",
    "parse_dockerfile",
    "split_words",
]


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword (upper case), arguments and line number."""

    keyword: str
    args: str
    line: int


SKIPPED = frozenset({"LABEL", "EXPOSE", "CMD", "MAINTAINER", "STOPSIGNAL", "HEALTHCHECK"})
SUPPORTED = frozenset({"FROM", "ARG", "ENV", "WORKDIR", "USER", "RUN", "COPY", "ADD"}) | SKIPPED


def parse_dockerfile(text: str, *, source: str = "Dockerfile") -> list[Instruction]:
    """Split a Dockerfile into instructions, refusing those the sandbox cannot reproduce."""
    instructions: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical = (pending + stripped).strip()
        pending = ""
        if logical:
            keyword, _, args = logical.partition(" ")
            instructions.append(Instruction(keyword.upper(), args.strip(), start))
    if pending.strip():
        keyword, _, args = pending.strip().partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
    froms = 0
    for item in instructions:
        where = f"{source} line {item.line}"
        if item.keyword not in SUPPORTED:
            raise UnsupportedDockerfileError(
                f"{where}: {item.keyword} is not supported by the local sandbox (it applies "
                f"FROM, ARG, ENV, WORKDIR, USER, RUN, COPY and ADD); use Harbor's docker "
                "environment for this task"
            )
        if item.keyword == "FROM":
            froms += 1
            if froms > 1:
                raise UnsupportedDockerfileError(
                    f"{where}: a second FROM (multi-stage build) is not supported by the "
                    "local sandbox; use Harbor's docker environment for this task"
                )
        if item.keyword in ("COPY", "ADD") and "--from" in item.args.split("=")[0]:
            raise UnsupportedDockerfileError(
                f"{where}: {item.keyword} --from is not supported by the local sandbox"
            )
    return instructions


def split_words(text: str) -> list[str]:
    if text.startswith("["):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(v, str) for v in parsed):
            return [str(v) for v in parsed]
    return shlex.split(text)


def parse_assignments(args: str, keyword: str, line: int) -> dict[str, str]:
    words = shlex.split(args)
    if not words:
        raise UnsupportedDockerfileError(f"Dockerfile line {line}: {keyword} needs a value")
    if "=" not in words[0]:
        if keyword == "ARG" and len(words) == 1:
            return {words[0]: ""}
        # Legacy form: ENV NAME value with spaces
        name, _, value = args.strip().partition(" ")
        return {name: value.strip()}
    values: dict[str, str] = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise UnsupportedDockerfileError(
                f"Dockerfile line {line}: {keyword} expects NAME=value pairs, got {word!r}"
            )
        values[name] = value
    return values


def expand(value: str, variables: dict[str, str]) -> str:
    """Docker-style $NAME / ${NAME} / ${NAME:-default} substitution."""
    out: list[str] = []
    i = 0
    while i < len(value):
        char = value[i]
        if char == "\\" and i + 1 < len(value) and value[i + 1] == "$":
            out.append("$")
            i += 2
            continue
        if char != "$":
            out.append(char)
            i += 1
            continue
        if value.startswith("${", i):
            end = value.find("}", i)
            if end == -1:
                out.append(value[i:])
                break
            body = value[i + 2 : end]
            name, sep, default = body.partition(":-")
            out.append(variables.get(name) or (default if sep else ""))
            i = end + 1
            continue
        j = i + 1
        while j < len(value) and (value[j].isalnum() or value[j] == "_"):
            j += 1
        if j == i + 1:
            out.append("$")
            i += 1
            continue
        out.append(variables.get(value[i + 1 : j], ""))
        i = j
    return "".join(out)


@dataclass
class BuildState:
    """What the Dockerfile set so far: build arguments, environment, working folder, user."""

    variables: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str | None = None


def copy_sources(
    item: Instruction, sources: Sequence[str], context: Path
) -> tuple[list[tuple[Path, str]], bool]:
    """COPY/ADD sources matched in the build context: (entries to pack, copy into a folder)."""
    matches: list[Path] = []
    for pattern in sources:
        if "://" in pattern:
            raise UnsupportedDockerfileError(
                f"Dockerfile line {item.line}: ADD of a URL ({pattern}) is not supported "
                "by the local sandbox; put the file in the environment folder"
            )
        found = sorted(glob(str(context / pattern)))
        if not found:
            raise FileNotFoundError(
                f"Dockerfile line {item.line}: {item.keyword} source {pattern!r} is not in "
                f"{context}"
            )
        for hit in found:
            path = Path(os.path.abspath(hit))
            if path != context and context not in path.parents:
                raise UnsupportedDockerfileError(
                    f"Dockerfile line {item.line}: {item.keyword} source {pattern!r} is "
                    f"outside the environment folder {context}"
                )
            matches.append(path)
    into_dir = len(matches) > 1 or any(p.is_dir() and not p.is_symlink() for p in matches)
    if not into_dir:
        return [(matches[0], matches[0].name)], False
    entries: list[tuple[Path, str]] = []
    for path in matches:
        if path.is_dir() and not path.is_symlink():
            entries += [(child, child.name) for child in sorted(path.iterdir())]
        else:
            entries.append((path, path.name))
    return entries, True
