"""The confirmation contract: prompt only a human (rich output on a TTY), never a script.

Without a TTY, ``--yes`` is required; its absence is an ``INTERACTIVE_REQUIRED`` error whose
details carry everything the caller needs to decide: prompt, summary, notes, warnings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from osmosis_ai.cli import output
from osmosis_ai.cli.errors import CLIError, CLIErrorCode, PromptDeclinedError


def confirm(
    prompt: str,
    *,
    yes: bool,
    summary: Mapping[str, object] | None = None,
    notes: Sequence[str] = (),
    warnings: Sequence[str] = (),
) -> None:
    """Return when the action may go ahead; raise ``PromptDeclinedError`` (exit 0) when declined.

    Raises ``CLIError(INTERACTIVE_REQUIRED)`` when a prompt is needed but cannot be shown.
    """
    if yes:
        return
    ctx = output.current()
    if not ctx.interactive:
        raise CLIError(
            CLIErrorCode.INTERACTIVE_REQUIRED,
            f"Confirmation required: {prompt} Re-run with --yes to proceed.",
            {
                "prompt": prompt,
                "summary": dict(summary or {}),
                "notes": list(notes),
                "warnings": list(warnings),
            },
        )
    from osmosis_ai.cli import console

    if not console.ask(prompt, summary=summary or {}, notes=notes, warnings=warnings):
        raise PromptDeclinedError
