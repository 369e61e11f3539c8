"""``osmosis eval rubric``: score a conversations JSONL with an LLM judge against a rubric."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from osmosis_ai.cli.arguments import positive_int
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result

RESULT_FILE = "rubric_eval_result.json"


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-d",
        "--data",
        required=True,
        type=Path,
        metavar="JSONL",
        help="conversations, one JSON object a line ('messages' or 'solution_str')",
    )
    parser.add_argument(
        "-r",
        "--rubric",
        required=True,
        metavar="TEXT|@FILE",
        help="the rubric, or @path to read it from a file",
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="ID",
        help="judge model as provider/model; openai/<model> reaches any OpenAI-compatible "
        "endpoint (see --base-url), other providers need LiteLLM",
    )
    parser.add_argument(
        "-n",
        "--number",
        type=positive_int,
        default=1,
        metavar="N",
        help="judge runs per record (default 1)",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help=f"write the results JSON here; a directory gets {RESULT_FILE}",
    )
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        help="deprecated: set the provider's key variable (e.g. OPENAI_API_KEY) instead",
    )
    parser.add_argument(
        "--timeout", type=_positive_float, metavar="S", help="seconds per judge request"
    )
    parser.add_argument("--score-min", type=float, default=0.0, metavar="X", help="(default 0.0)")
    parser.add_argument("--score-max", type=float, default=1.0, metavar="X", help="(default 1.0)")
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="OpenAI-compatible base URL (default OPENAI_BASE_URL, else the OpenAI API)",
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    import asyncio

    from osmosis_ai.errors import MissingExtraError
    from osmosis_ai.eval.judge import MissingAPIKeyError
    from osmosis_ai.eval.rubric_dataset import (
        RubricDatasetError,
        evaluate_rubric_dataset,
        load_rubric_dataset,
    )
    from osmosis_ai.rundir.durable import atomic_write_json

    if args.api_key is not None:
        ctx.warn(
            "DEPRECATION",
            "--api-key is deprecated and ends up in shell history: set the provider's key "
            "variable (e.g. OPENAI_API_KEY) instead.",
        )
    score_min: float = args.score_min
    score_max: float = args.score_max
    if not score_max > score_min:
        raise CLIError(
            CLIErrorCode.VALIDATION,
            f"--score-max ({score_max:g}) must be greater than --score-min ({score_min:g}).",
            {"score_min": score_min, "score_max": score_max},
        )
    rubric = _rubric_text(args.rubric)
    data: Path = args.data.absolute()
    try:
        records = load_rubric_dataset(data)
    except FileNotFoundError:
        raise CLIError(
            CLIErrorCode.NOT_FOUND, f"Data file not found: {data}", {"file": str(data)}
        ) from None
    except RubricDatasetError as exc:
        details: dict[str, object] = {"file": str(data), "line": exc.line, "reason": exc.reason}
        raise CLIError(CLIErrorCode.VALIDATION, str(exc), details) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(CLIErrorCode.VALIDATION, f"Cannot read {data}: {exc}") from exc
    if not records:
        raise CLIError(CLIErrorCode.VALIDATION, f"{data} has no records.", {"file": str(data)})

    try:
        report = asyncio.run(
            evaluate_rubric_dataset(
                records,
                rubric=rubric,
                model=args.model,
                runs=args.number,
                score_min=score_min,
                score_max=score_max,
                api_key=args.api_key,
                timeout=args.timeout,
                base_url=args.base_url,
            )
        )
    except MissingAPIKeyError as exc:
        raise CLIError(CLIErrorCode.VALIDATION, str(exc), {"env_var": exc.env_var}) from exc
    except MissingExtraError as exc:
        raise CLIError(CLIErrorCode.VALIDATION, str(exc), {"missing": exc.missing}) from exc
    except ValueError as exc:  # the model id is not provider/model
        raise CLIError(CLIErrorCode.VALIDATION, str(exc)) from exc

    output = _output_path(args.output)
    resource: dict[str, object] = {
        "model": args.model,
        "data": str(data),
        "number": args.number,
        "score_min": score_min,
        "score_max": score_max,
        "output": None if output is None else str(output),
        **report.to_dict(),
    }
    if output is not None:
        try:
            atomic_write_json(output, resource)
        except OSError as exc:
            raise CLIError(
                CLIErrorCode.VALIDATION, f"Cannot write {output}: {exc}", {"output": str(output)}
            ) from exc

    failed = report.failed
    if failed:
        first = failed[0]
        where = f"line {first.record.line}" + (f" ({first.record.id})" if first.record.id else "")
        raise CLIError(
            CLIErrorCode.PLATFORM_ERROR,
            f"{len(failed)} of {len(report.records)} record(s) failed; first, {where}: "
            f"{first.error}",
            {
                "failed": [
                    {"line": r.record.line, "id": r.record.id, "error": r.error} for r in failed
                ],
                "statistics": report.statistics.to_dict(),
                "output": resource["output"],
            },
        )

    stats = report.statistics
    runs = "run" if args.number == 1 else "runs"
    message = (
        f"Scored {len(report.records)} record(s), {args.number} {runs} each, with {args.model}: "
        f"average {stats.average:.4g}, stdev {stats.stdev:.4g}, "
        f"min {stats.min:.4g}, max {stats.max:.4g}."
    )
    return OperationResult(
        operation="eval.rubric",
        status="success",
        resource=resource,
        message=message,
        next_steps=[f"Results written to {output}"] if output is not None else [],
    )


def _rubric_text(value: str) -> str:
    text = value
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CLIError(
                CLIErrorCode.NOT_FOUND, f"Rubric file not found: {path}", {"file": str(path)}
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(
                CLIErrorCode.VALIDATION, f"Cannot read the rubric {path}: {exc}"
            ) from exc
    if not text.strip():
        raise CLIError(CLIErrorCode.VALIDATION, "The rubric is empty.", {"rubric": value})
    return text


def _output_path(output: str | None) -> Path | None:
    """``-o``: a file, or a folder (existing, or written with a trailing slash) for the default."""
    if output is None:
        return None
    path = Path(output).absolute()
    if path.is_dir() or output.endswith(("/", os.sep)):
        return path / RESULT_FILE
    return path
