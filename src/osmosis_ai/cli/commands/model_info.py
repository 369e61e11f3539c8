"""``osmosis model info NAME``: a LoRA model (or, for an ``org/name`` path, a base model)."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, DetailResult, Result
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.platform.client import PlatformClientError, segment

BASE_DETAIL_KEYS = (
    "namespace",
    "parameters",
    "context_window",
    "hf_url",
    "inference_input_usd_per_million_tokens",
    "inference_cached_input_usd_per_million_tokens",
    "inference_output_usd_per_million_tokens",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="LORA_MODEL", help="a LoRA model name, or a base model's org/name path"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    name: str = args.name
    with open_session(ctx) as session:
        client = session.client
        if "/" not in name:  # LoRA names never hold a slash; Hugging Face paths always do
            try:
                record = client.call("GET", f"/api/cli/models/{segment(name)}")
            except PlatformClientError as exc:
                if exc.status_code != 404:
                    raise
            else:
                return _lora(record, session.result_context())
        try:
            record = client.call("GET", f"/api/cli/models/base/{segment(name)}")
        except PlatformClientError as exc:
            if exc.status_code == 404:
                raise CLIError(
                    CLIErrorCode.NOT_FOUND, f"Model not found: {name}", dict(exc.details)
                ) from exc
            raise
        return _base(record, session.result_context())


def _lora(record: dict[str, object], context: dict[str, object]) -> DetailResult:
    model = {
        **records.lora_model(record),
        **{
            key: record.get(key)
            for key in ("hf_upload_status", "hf_url", "uploaded_by", "inference_model")
        },
    }
    endpoint = record.get("inference_base_url")  # a self-hosted platform's own /v1
    if endpoint:
        model["inference_base_url"] = endpoint
    fields: list[tuple[str, object]] = [
        ("Name", record.get("model_name")),
        ("Base model", record.get("base_model")),
        ("Training run", record.get("training_run_name")),
        ("Checkpoint step", record.get("checkpoint_step")),
        ("Training reward", record.get("reward")),
        ("Created", record.get("created_at")),
        ("Hugging Face upload", record.get("hf_upload_status")),
        ("Hugging Face URL", record.get("hf_url")),
    ]
    if "deployment_status" in record:
        fields.append(("Deployment", record.get("deployment_status") or "inactive"))
        fields.append(("Inference model", record.get("inference_model")))
        if endpoint:
            fields.append(("Inference endpoint", endpoint))
    if record.get("platform_url"):
        fields.append(("URL", record.get("platform_url")))
    kind = record.get("checkpoint_type")
    if kind:  # the platform says what the checkpoint folder holds
        fields.insert(1, ("Type", "LoRA adapter" if kind == "lora" else "full weights"))
    return DetailResult(
        title="Trained model" if kind == "full" else "LoRA model",
        data={"lora_model": model, "platform_url": record.get("platform_url"), **context},
        fields=fields,
    )


def _base(record: dict[str, object], context: dict[str, object]) -> DetailResult:
    model = {**records.base_model(record), **{k: record.get(k) for k in BASE_DETAIL_KEYS}}
    fields: list[tuple[str, object]] = [
        ("Name", record.get("model_name")),
        ("Path", record.get("base_model")),
        ("Parameters", record.get("parameters")),
        ("Context window", record.get("context_window")),
        ("Created", record.get("created_at")),
        ("Created by", record.get("creator_name")),
        ("Hugging Face URL", record.get("hf_url")),
    ]
    return DetailResult(
        title="Base model",
        data={"base_model": model, "platform_url": record.get("platform_url"), **context},
        fields=fields,
    )
