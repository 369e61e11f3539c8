"""LoRA adapter folders as models: what LoRA training saves (``adapter_config.json`` beside
the adapter's weights, and the tokenizer) is loaded onto the base model it names and merged,
so ``model_path = "local:<adapter dir>"`` serves it like any Hugging Face folder.

Imports torch, transformers and peft inside functions (the ``train`` extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from osmosis_ai.errors import ConfigError, MissingExtraError

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter(folder: Path) -> bool:
    """Whether ``folder`` holds a peft adapter rather than a whole model."""
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def adapter_base(folder: Path) -> str | None:
    """The base model an adapter folder names (``base_model_name_or_path``), if any."""
    try:
        data: object = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError):
        return None
    value = data.get("base_model_name_or_path") if isinstance(data, dict) else None  # pyright: ignore[reportUnknownMemberType]
    return value if isinstance(value, str) and value else None


def load_merged(folder: Path, *, base: Path | None = None, dtype: Any = None) -> tuple[Any, Any]:
    """The model and tokenizer of adapter ``folder``: its base (``base``, else the folder the
    adapter names) with the adapter merged in, on the CPU. The tokenizer is the adapter's
    when it saved one, else the base's."""
    try:
        import transformers
        from peft import PeftModel
    except ModuleNotFoundError as exc:
        raise MissingExtraError("train", "loading a LoRA adapter", exc.name) from exc
    if base is None:
        named = adapter_base(folder)
        if named is None or not (Path(named) / "config.json").is_file():
            raise ConfigError(
                f"{folder} is a LoRA adapter whose base model {named!r} is not a model folder "
                f"here: point model_path at a merged checkpoint, or set base_model_name_or_path "
                f"in {folder / ADAPTER_CONFIG} to the base model's folder"
            )
        base = Path(named)
    source = folder if (folder / "tokenizer_config.json").is_file() else base
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=True)
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(
            base, local_files_only=True, dtype=dtype if dtype is not None else "float32"
        )
        merged: Any = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()  # pyright: ignore[reportUnknownMemberType]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load the LoRA adapter {folder} onto {base}: {exc}") from exc
    return merged, tokenizer
