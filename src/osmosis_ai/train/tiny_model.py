"""Build a tiny causal LM offline: a few layers of Qwen2 (or Llama), a byte-level tokenizer
with a ChatML chat template that renders tool calls, saved in Hugging Face format.

The result is deterministic for given arguments: tests, examples and smoke trainings use it
where no model hub is reachable. ``python -m osmosis_ai.train.tiny_model OUT_DIR``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from osmosis_ai.controller.policy.responses import byte_symbols
from osmosis_ai.errors import MissingExtraError, UsageError

Arch = Literal["qwen2", "llama"]

PAD, END_OF_TEXT, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, END_OF_TEXT, IM_START, IM_END)
#: Ordinary added tokens: one id each, kept by ``decode(skip_special_tokens=True)``.
WORD_TOKENS = ("system", "user", "assistant", "tool", "<tool_call>", "</tool_call>")

# ChatML. A block tag is never directly followed by a newline: Hugging Face renders
# templates with trim_blocks, which would eat it, so such newlines are written {{ '\n' }}.
# An assistant tool call renders as
#   <tool_call>\n{"name": "<function>", "arguments": <JSON object>}\n</tool_call>
# (the Qwen2.5 / Hermes format), which the local policy parses back into OpenAI tool_calls.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages and messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>\nCall a function with <tool_call>\n"
    '{"name": <function name>, "arguments": <JSON object>}\n</tool_call><|im_end|>'
    "{{ '\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if not (loop.first and tools and message.role == 'system') %}"
    "<|im_start|>{{ message.role }}\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "{% if message.content or not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": {{ fn.name | tojson }}, "arguments": '
    "{% if fn.arguments is string %}{{ fn.arguments }}{% else %}{{ fn.arguments | tojson }}"
    "{% endif %}{{ '}' }}\n</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _import_train(feature: str) -> tuple[Any, Any, Any]:
    try:
        import tokenizers
        import torch
        import transformers
    except ModuleNotFoundError as exc:
        raise MissingExtraError("train", feature, exc.name) from exc
    return torch, transformers, tokenizers


def build_tokenizer(arch: Arch = "qwen2") -> Any:
    """The byte-level tokenizer: id ``b`` is byte ``b`` (no merges), then the special tokens,
    then :data:`WORD_TOKENS`. Left padding, eos ``<|im_end|>``, pad ``<|pad|>``.

    For ``qwen2`` the pipeline mirrors what ``AutoTokenizer`` rebuilds for that model type
    (it adds NFC normalization), so every loader gives the same ids; ``llama`` loads as saved.
    """
    _, transformers, tokenizers = _import_train("building the tiny tokenizer")
    symbols = byte_symbols()
    backend = tokenizers.Tokenizer(
        tokenizers.models.BPE(vocab={symbols[b]: b for b in range(256)}, merges=[])
    )
    if arch == "qwen2":
        backend.normalizer = tokenizers.normalizers.NFC()
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
        add_prefix_space=False, use_regex=False
    )
    backend.decoder = tokenizers.decoders.ByteLevel()
    added = tokenizers.AddedToken
    backend.add_special_tokens([added(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([added(t, special=False, normalized=False) for t in WORD_TOKENS])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD,
        padding_side="left",
        model_max_length=1 << 20,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    *,
    arch: Arch = "qwen2",
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    max_position_embeddings: int = 2048,
) -> Path:
    """Build, save and return ``out_dir``: a random-init causal LM of ``arch`` with tied
    embeddings, float32, loadable offline by ``AutoTokenizer`` / ``AutoModelForCausalLM``.
    The same arguments give byte-identical weights."""
    if arch not in ("qwen2", "llama"):
        raise UsageError(f"arch={arch!r} is not supported: use 'qwen2' or 'llama'")
    if hidden_size < 1 or num_layers < 1 or num_heads < 1 or hidden_size % num_heads:
        raise UsageError(
            f"hidden_size={hidden_size}, num_layers={num_layers}, num_heads={num_heads}: give "
            "positive sizes with hidden_size divisible by num_heads"
        )
    torch, transformers, _ = _import_train("building the tiny model")
    tokenizer = build_tokenizer(arch)
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in (IM_END, END_OF_TEXT)]
    config_class = transformers.Qwen2Config if arch == "qwen2" else transformers.LlamaConfig
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_ids[0],
        pad_token_id=tokenizer.pad_token_id,
    )
    # "TokenizersBackend" makes AutoTokenizer load tokenizer.json as saved where the model
    # type allows it (llama); qwen2 always gets Qwen2Tokenizer, which the pipeline mirrors.
    config.tokenizer_class = "TokenizersBackend"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id
    )
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m osmosis_ai.train.tiny_model OUT_DIR``: build and print the directory."""
    parser = argparse.ArgumentParser(
        prog="python -m osmosis_ai.train.tiny_model",
        description="Build a tiny random-init causal LM (Hugging Face format) offline.",
    )
    parser.add_argument("out_dir", type=Path, help="directory to write (created if missing)")
    parser.add_argument("--arch", choices=["qwen2", "llama"], default="qwen2")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_tiny_model(
        args.out_dir,
        arch=args.arch,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        seed=args.seed,
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
