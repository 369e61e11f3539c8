"""The tiny local model: deterministic build, offline reload, exact text, chat template."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch not installed (extra train)")
pytest.importorskip("transformers", reason="transformers not installed (extra train)")

from transformers import AutoModelForCausalLM, AutoTokenizer

from osmosis_ai.controller.policy.responses import split_tool_calls
from osmosis_ai.errors import MissingExtraError, UsageError
from osmosis_ai.train import tiny_model
from osmosis_ai.train.tiny_model import build_tiny_model

TEXTS = [
    "a b\nc 12+3=15 é",
    "  two  spaces\n\n\ttab\r\n",
    "日本語 🙂 Ünïcödé ß",
    "user said <tool_call>",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 6*7?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "42"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "a*b",
            "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
        },
    }
]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen2")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_writes_a_hugging_face_directory(qwen_dir: Path):
    names = {p.name for p in qwen_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    model = AutoModelForCausalLM.from_pretrained(qwen_dir, local_files_only=True)
    assert model.config.model_type == "qwen2"
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 128
    tokenizer = AutoTokenizer.from_pretrained(qwen_dir, local_files_only=True)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|pad|>"
    assert tokenizer.padding_side == "left"
    assert len(tokenizer) == model.config.vocab_size == 256 + 4 + 6
    # id b is byte b: the vocabulary vLLM and AutoTokenizer rebuild the same way
    assert tokenizer("Az", add_special_tokens=False).input_ids == [65, 122]
    assert model.generation_config.eos_token_id == [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]


def test_entry_point_builds_offline_and_deterministically(qwen_dir: Path, tmp_path: Path):
    out = tmp_path / "again"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    code = (
        "import sys; from osmosis_ai.train.tiny_model import main; main(sys.argv[1:]);"
        "from transformers import AutoModelForCausalLM, AutoTokenizer;"
        "t = AutoTokenizer.from_pretrained(sys.argv[1]);"
        "AutoModelForCausalLM.from_pretrained(sys.argv[1]);"
        "s = 'a b\\nc 12 é'; assert t.decode(t(s).input_ids) == s"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert digest(out / "model.safetensors") == digest(qwen_dir / "model.safetensors")
    assert digest(out / "tokenizer.json") == digest(qwen_dir / "tokenizer.json")


def test_module_entry_point_help():
    done = subprocess.run(
        [sys.executable, "-m", "osmosis_ai.train.tiny_model", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "OUT_DIR" in done.stdout.upper()


@pytest.mark.parametrize("text", TEXTS)
def test_text_round_trips_exactly(qwen_dir: Path, text: str):
    tokenizer = AutoTokenizer.from_pretrained(qwen_dir, local_files_only=True)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_llama_arch_round_trips_even_unnormalized_text(tmp_path: Path):
    path = build_tiny_model(tmp_path / "llama", arch="llama", hidden_size=64, num_layers=1)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    assert model.config.model_type == "llama"
    for text in [*TEXTS, "e\u0301"]:  # decomposed: qwen2's tokenizer class NFC-normalizes it
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == text


def test_chat_template_renders_tools_tool_calls_and_tool_messages(qwen_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(qwen_dir, local_files_only=True)
    text = tokenizer.apply_chat_template(
        MESSAGES, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n{")
    assert '"name": "multiply"' in text.split("</tools>")[0]
    assert text.count("<|im_start|>system") == 1
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")
    # the rendered assistant turn parses back into the same call
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls = split_tool_calls(turn)
    assert content is None
    assert [c["function"] for c in calls] == [{"name": "multiply", "arguments": '{"a": 6, "b": 7}'}]
    # without tools: plain ChatML, token ids of the specials and role words
    plain = tokenizer.apply_chat_template(MESSAGES[1:2], tokenize=False, add_generation_prompt=True)
    assert plain == "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(plain, add_special_tokens=False).input_ids
    start, user = (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "user"))
    assert ids[:3] == [start, user, ord("\n")]


def test_content_and_tool_calls_in_one_turn(qwen_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(qwen_dir, local_files_only=True)
    calls = [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
        {"type": "function", "function": {"name": "g", "arguments": {}}},
    ]
    message = {"role": "assistant", "content": "Let me check.", "tool_calls": calls}
    text = tokenizer.apply_chat_template([message], tokenize=False)
    turn = text.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
    content, parsed = split_tool_calls(turn)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in parsed] == ["f", "g"]
    assert [c["function"]["arguments"] for c in parsed] == ['{"x": 1}', "{}"]


def test_bad_arguments_and_missing_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    with pytest.raises(UsageError, match="arch='gpt2'"):
        build_tiny_model(tmp_path, arch="gpt2")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="divisible"):
        build_tiny_model(tmp_path, hidden_size=130, num_heads=4)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtraError, match=r"osmosis-ai\[train\]"):
        tiny_model.build_tiny_model(tmp_path)
