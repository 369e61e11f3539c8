"""Root options, command resolution and running one command: parse, call, render, exit code.

Help uses only the standard library and the static command table; a command's module (and
everything it imports) loads only when that command runs or shows its help.
"""

from __future__ import annotations

import os
import sys

from osmosis_ai.cli import registry
from osmosis_ai.cli.errors import (
    CLIError,
    CLIErrorCode,
    CLIUsageError,
    PromptDeclinedError,
    to_cli_error,
)
from osmosis_ai.consts import PACKAGE_VERSION, package_name

# Not typing.TYPE_CHECKING: importing typing alone costs more than the rest of `--help`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO

    from osmosis_ai.cli.output import Format

FORMAT_FLAGS = ("--json", "--plain")


def run(args: list[str]) -> int:
    """Run the command line ``args``; return the exit code (0, 1, 2 or 130)."""
    args, fmt, conflict = _hoist_format(args)
    try:
        if conflict:
            raise CLIUsageError("--json and --plain cannot be used together")
        index, env_file, platform = _root_options(args)
        if index is None:
            return 0
        path, rest = _resolve(args[index:])
        if path is None:
            return 0
        return _run(path, rest, fmt, env_file=env_file, platform=platform)
    except CLIUsageError as exc:
        return _usage_error(exc, fmt)


def _hoist_format(args: list[str]) -> tuple[list[str], Format, bool]:
    """Take ``--json``/``--plain`` from anywhere before ``--``; report both given."""
    end = args.index("--") if "--" in args else len(args)
    found = {flag for flag in args[:end] if flag in FORMAT_FLAGS}
    kept = [arg for arg in args[:end] if arg not in FORMAT_FLAGS] + args[end:]
    fmt: Format = "json" if "--json" in found else "plain" if "--plain" in found else "rich"
    return kept, fmt, len(found) > 1


def _root_options(args: list[str]) -> tuple[int | None, str | None, str | None]:
    """Parse the options before the command; ``None`` index: help or version was printed."""
    env_file: str | None = None
    platform: str | None = None
    index = 0
    while index < len(args) and args[index].startswith("-"):
        arg = args[index]
        name, has_value, value = arg.partition("=")
        if arg in ("-V", "--version"):
            sys.stdout.write(f"{package_name} {PACKAGE_VERSION}\n")
            return None, None, None
        if arg in ("-h", "--help"):
            _print_root_help()
            return None, None, None
        if name in ("--env-file", "--platform"):
            if not has_value:
                if index + 1 >= len(args):
                    raise CLIUsageError(f"Option '{name}' requires an argument.")
                index += 1
                value = args[index]
            if name == "--env-file":
                env_file = value
            else:
                platform = value
        else:
            raise CLIUsageError(f"No such option: {arg}")
        index += 1
    if index >= len(args):
        _print_root_help()
        return None, None, None
    return index, env_file, platform


def _resolve(args: list[str]) -> tuple[tuple[str, ...] | None, list[str]]:
    """Walk group names to a command; ``None``: a group's help was printed."""
    path: tuple[str, ...] = ()
    index = 0
    while True:
        prog = " ".join(("osmosis", *path))
        token = args[index] if index < len(args) else None
        if token is None or token in ("-h", "--help"):
            group = registry.group(path)
            assert group is not None
            from osmosis_ai.cli.help import group_help

            sys.stdout.write(group_help(group, _encoding()))
            return None, []
        if token.startswith("-"):
            raise CLIUsageError(f"No such option: {token}", prog=prog)
        candidate = (*path, token)
        if not path and token == "help":
            raise CLIUsageError(
                "No such command 'help'. Use 'osmosis --help', "
                "or 'osmosis COMMAND --help' for a specific command."
            )
        if candidate in registry.REMOVED:
            raise CLIUsageError(
                f"'osmosis {' '.join(candidate)}' was removed. {registry.REMOVED[candidate]}",
                prog=prog,
            )
        if registry.command(candidate) is not None:
            return candidate, args[index + 1 :]
        if registry.group(candidate) is None:
            message = f"No such command '{token}'."
            suggestion = registry.suggest(path, token)
            if suggestion is not None:
                message += f" Did you mean '{suggestion}'?"
            raise CLIUsageError(message, prog=prog)
        path = candidate
        index += 1


def _run(
    path: tuple[str, ...],
    rest: list[str],
    fmt: Format,
    *,
    env_file: str | None,
    platform: str | None,
) -> int:
    from osmosis_ai.cli import commands, output

    entry = registry.command(path)
    assert entry is not None
    interactive = fmt == "rich" and _isatty(sys.stdin) and _isatty(sys.stdout)
    ctx = output.Context(command=entry.name, format=fmt, interactive=interactive)
    token = output.install(ctx)
    try:
        module = commands.load(entry.module)
        namespace = commands.parse(module, f"osmosis {entry.name}", entry.help, rest)
        _prepare_environment(env_file, platform)
        result = module.run(namespace, ctx)
        if result is None:  # allowed in rich mode only: an interactive command showed itself
            if fmt == "rich":
                return 0
            raise CLIError(CLIErrorCode.INTERNAL, "The command produced no output.")
        output.render(result, ctx)
        return result.exit_code
    except CLIUsageError as exc:
        return _usage_error(exc, fmt)
    except PromptDeclinedError:
        sys.stdout.write("Cancelled.\n")
        return 0
    except KeyboardInterrupt:
        if fmt != "json":
            sys.stderr.write("Aborted.\n")
        return 130
    except SystemExit as exc:  # argparse --help, or a command exiting on purpose
        return _exit_code(exc.code)
    except BrokenPipeError:
        raise
    except Exception as exc:
        error = _to_cli_error(exc)
        output.emit_error(ctx, error)
        return 1
    finally:
        output.uninstall(token)


def _prepare_environment(env_file: str | None, platform: str | None) -> None:
    from osmosis_ai.cli.env import load_env

    try:
        load_env(env_file)
    except FileNotFoundError as exc:
        message = f"Env file not found: {exc.filename}"
        raise CLIError(CLIErrorCode.NOT_FOUND, message, {"path": exc.filename}) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(CLIErrorCode.VALIDATION, f"Cannot read the env file: {exc}") from exc
    if platform is not None:
        os.environ["OSMOSIS_PLATFORM_URL"] = platform


def _to_cli_error(exc: Exception) -> CLIError:
    error = to_cli_error(exc)
    if error.code is CLIErrorCode.INTERNAL and os.environ.get("OSMOSIS_DEBUG") == "1":
        import traceback

        cause = (exc.__cause__ or exc.__context__) if isinstance(exc, CLIError) else exc
        if cause is not None:
            traceback.print_exception(cause, file=sys.stderr)
    return error


def _usage_error(exc: CLIUsageError, fmt: Format) -> int:
    if fmt == "json":
        command = exc.prog.removeprefix("osmosis").strip() or "<root>"
        from osmosis_ai.cli import output

        error = CLIError(CLIErrorCode.VALIDATION, exc.message)
        output.emit_error(output.Context(command=command, format="json"), error)
        return 2
    usage = exc.usage or f"usage: {exc.prog} [OPTIONS] COMMAND [ARGS]...\n"
    usage = "Usage:" + usage.removeprefix("usage:")
    sys.stderr.write(f"{usage}Try '{exc.prog} --help' for help.\n\nError: {exc.message}\n")
    return 2


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def _print_root_help() -> None:
    from osmosis_ai.cli.help import root_help

    sys.stdout.write(root_help(_encoding()))


def _encoding() -> str | None:
    return getattr(sys.stdout, "encoding", None)


def _isatty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False
