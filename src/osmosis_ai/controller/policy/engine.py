"""The local policy: a Hugging Face causal LM and its tokenizer served as OpenAI chat and
text completions, with token ids, logprobs, hot weight updates and a policy version.

Concurrent calls share the model: whoever takes the model next runs every request waiting
by then as one batch. Needs the ``train`` extra (torch, transformers).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.errors import ConfigError, MissingExtraError, UsageError

try:
    import torch
    import transformers
except ModuleNotFoundError as _missing:
    raise MissingExtraError(
        "train", "the local policy (model_path 'local:<dir>')", _missing.name
    ) from _missing

from osmosis_ai.controller.policy.requests import (
    PolicyRequestError,
    SamplingParams,
    chat_messages,
    prompt_list,
)
from osmosis_ai.controller.policy.responses import Renderer, Sample, byte_symbols
from osmosis_ai.controller.policy.sampler import Decoder, Row

DEFAULT_MAX_BATCH_ROWS = 64
_BUILD_HINT = "build one with `python -m osmosis_ai.train.tiny_model {path}`"


@dataclass(slots=True, eq=False)
class _Job:
    rows: list[Row]
    done: threading.Event = field(default_factory=threading.Event)
    version: int = 0
    error: BaseException | None = None


class LocalPolicy:
    """Serves the model in ``model_dir`` (Hugging Face format, loaded offline).

    ``device`` is ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; ``dtype`` a torch dtype or its name
    (default: float32 on CPU, the checkpoint's dtype elsewhere). ``max_model_len`` bounds
    prompt plus completion (default: the model's ``max_position_embeddings``); a completion
    that would pass it is cut short (``finish_reason`` ``"length"``). ``seed`` makes the
    requests that carry no seed reproducible as a sequence.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        dtype: str | torch.dtype | None = None,
        max_model_len: int | None = None,
        seed: int | None = None,
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
    ) -> None:
        path = Path(model_dir).expanduser()
        _check_model_dir(path)
        resolved = _dtype(dtype, device)
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
            model: Any = transformers.AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, dtype=resolved
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(
                f"cannot load a Hugging Face causal LM from {path}: {exc}; point model_path at "
                f"a directory saved with save_pretrained, or {_BUILD_HINT.format(path=path)}"
            ) from exc
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"the tokenizer in {path} has no chat template: add one as "
                f"{path / 'chat_template.jinja'} (or a 'chat_template' entry in "
                f"{path / 'tokenizer_config.json'})"
            )
        self._setup(
            model.to(device),
            tokenizer,
            name=str(path),
            max_model_len=max_model_len,
            seed=seed,
            max_batch_rows=max_batch_rows,
        )

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "policy",
        max_model_len: int | None = None,
        seed: int | None = None,
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
    ) -> LocalPolicy:
        """Serve a model object the caller keeps training (weights shared in-process): wrap
        each optimizer step in :meth:`updating` so no generation sees half a step. A batch
        puts the model in eval mode while it runs, so keep training passes out of that time
        (inside :meth:`updating`, or between rollouts)."""
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"the tokenizer of {name!r} has no chat template: set one")
        policy = cls.__new__(cls)
        policy._setup(
            model,
            tokenizer,
            name=name,
            max_model_len=max_model_len,
            seed=seed,
            max_batch_rows=max_batch_rows,
        )
        return policy

    def _setup(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        max_model_len: int | None,
        seed: int | None,
        max_batch_rows: int,
    ) -> None:
        self.model: Any = model
        self.tokenizer: Any = tokenizer
        self.name = name
        self.device = torch.device(next(model.parameters()).device)
        config = model.config
        limit = getattr(config, "max_position_embeddings", None) or 2048
        self.max_model_len = int(max_model_len or limit)
        self.max_batch_rows = max_batch_rows
        eos = getattr(model.generation_config, "eos_token_id", None)
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self.eos_ids = sorted(i for i in eos_ids if isinstance(i, int))
        pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self._decoder = Decoder(
            model, pad_id=pad_id, eos_ids=self.eos_ids, decode=self.decode, device=self.device
        )
        self._rng = torch.Generator(self.device)
        self._rng.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8)) >> 1)
        self._version = 0
        self._engine = threading.Lock()  # the model: one batch or one weight update at a time
        self._pending_lock = threading.Lock()
        self._pending: list[_Job] = []
        self._token_bytes: dict[int, bytes] = {}
        self._byte_of = {c: b for b, c in byte_symbols().items()}
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_level = "ByteLevel" in repr(decoder)
        self._specials = set(tokenizer.all_special_ids)

    # -- text and tokens -------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The policy version: 0 as loaded, then set or bumped by every weight update."""
        return self._version

    def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Any = None, **kwargs: Any
    ) -> str:
        """The prompt text of ``messages`` (OpenAI shape; text content parts are joined)
        through the chat template, ending with the assistant's turn opener unless
        ``add_generation_prompt=False``."""
        from jinja2 import TemplateError

        plain = chat_messages({"messages": list(messages)})
        kwargs.setdefault("add_generation_prompt", True)
        try:
            text = self.tokenizer.apply_chat_template(
                plain, tools=tools or None, tokenize=False, **kwargs
            )
        except (TemplateError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise PolicyRequestError(
                f"the chat template cannot render these messages: {exc}", param="messages"
            ) from exc
        return str(text)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` without special tokens (eos, pad)."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (byte-level vocabularies give partial UTF-8 as is)."""
        raw = self._token_bytes.get(token_id)
        if raw is None:
            symbol = self.tokenizer.convert_ids_to_tokens(token_id)
            byte_level = self._byte_level and token_id not in self._specials
            if byte_level and all(c in self._byte_of for c in symbol):
                raw = bytes(self._byte_of[c] for c in symbol)
            else:
                raw = str(self.tokenizer.decode([token_id])).encode()
            self._token_bytes[token_id] = raw
        return raw

    # -- generation ------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> tuple[int, list[Sample]]:
        """``params.n`` samples for each prompt (prompt-major) and the policy version that
        made them. Blocks; safe to call from many threads (calls waiting together batch)."""
        generator = self._rng
        if params.seed is not None:
            generator = torch.Generator(self.device)
            generator.manual_seed(params.seed)
        rows: list[Row] = []
        for prompt in prompts:
            if not prompt:
                raise PolicyRequestError("the prompt is empty", param="prompt")
            room = self.max_model_len - len(prompt)
            if room < 1:
                raise PolicyRequestError(
                    f"the prompt is {len(prompt)} tokens but max_model_len is "
                    f"{self.max_model_len}: shorten it or raise max_model_len",
                    param="messages",
                )
            budget = min(room, params.max_tokens or room)
            rows.extend(Row(list(prompt), params, budget, generator) for _ in range(params.n))
        job = _Job(rows)
        with self._pending_lock:
            self._pending.append(job)
        while not job.done.is_set():
            with self._engine:
                if not job.done.is_set():
                    self._run_pending()
        if job.error is not None:
            raise job.error
        return job.version, [row.result(self.decode) for row in rows]

    def _run_pending(self) -> None:
        with self._pending_lock:
            batch: list[_Job] = []
            size = 0
            while self._pending and (
                not batch or size + len(self._pending[0].rows) <= self.max_batch_rows
            ):
                job = self._pending.pop(0)
                batch.append(job)
                size += len(job.rows)
        try:
            training = self.model.training
            self.model.eval()
            try:
                with torch.no_grad():
                    self._decoder.run([row for job in batch for row in job.rows])
            finally:
                self.model.train(training)
        except BaseException as exc:
            for job in batch:
                job.error = exc
        finally:
            for job in batch:
                job.version = self._version
                job.done.set()

    def chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer an OpenAI chat-completions request (``stream`` ignored) as a
        ``chat.completion`` body with token ids, logprobs and ``policy_version``."""
        params, prompt, renderer = self._chat_request(body)
        version, samples = self.generate([prompt], params)
        renderer.version = version
        return renderer.chat(samples, params)

    def chat_chunks(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The same answer as ``chat.completion.chunk`` payloads (generated first, then
        split), with a usage chunk when ``stream_options.include_usage`` is set."""
        params, prompt, renderer = self._chat_request(body)
        version, samples = self.generate([prompt], params)
        renderer.version = version
        options = body.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return renderer.chat_chunks(samples, params, include_usage=usage)

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer a text-completions request: ``prompt`` is text, token ids, or a list of
        either; every prompt gets ``n`` choices with the same token fields as chat."""
        params = SamplingParams.from_body(body, chat=False)
        prompts = [self._prompt_ids(p) for p in prompt_list(body)]
        version, samples = self.generate(prompts, params)
        renderer = self._renderer(body, prompts, version)
        return renderer.completion(samples, params, per_prompt=params.n)

    def _chat_request(self, body: Mapping[str, Any]) -> tuple[SamplingParams, list[int], Renderer]:
        messages = chat_messages(body)
        params = SamplingParams.from_body(body)
        extra = body.get("chat_template_kwargs")
        kwargs: dict[str, Any] = dict(extra) if isinstance(extra, dict) else {}
        prompt = self.encode(self.render(messages, body.get("tools"), **kwargs))
        return params, prompt, self._renderer(body, [prompt], self._version)

    def _renderer(
        self, body: Mapping[str, Any], prompts: list[list[int]], version: int
    ) -> Renderer:
        model = body.get("model")
        return Renderer(
            model=model if isinstance(model, str) and model else self.name,
            prompt_ids=prompts,
            version=version,
            token_bytes=self.token_bytes,
            as_token_ids=bool(body.get("return_tokens_as_token_ids")),
        )

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.encode(prompt, add_special_tokens=True)
        vocab = len(self.tokenizer)
        if any(not 0 <= t < vocab for t in prompt):
            raise PolicyRequestError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        return prompt

    # -- weights ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def updating(self, version: int | None = None) -> Generator[None]:
        """Hold the model (no generation runs) while the caller changes its weights in
        place; on a clean exit the version becomes ``version``, or goes up by one."""
        with self._engine:
            new = self._next_version(version)
            yield
            self._version = new

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None
    ) -> int:
        """Copy tensors into the parameters and buffers of the same names (a subset is
        fine) between generations; returns the new version. Nothing is copied when a name
        or shape does not match."""
        targets: dict[str, torch.Tensor] = self.model.state_dict(keep_vars=True)
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for name, tensor in named_tensors:
            target = targets.get(name)
            if target is None:
                known = ", ".join(list(targets)[:3])
                raise UsageError(f"weight {name!r} is not in the policy model (it has {known}, …)")
            if tuple(target.shape) != tuple(tensor.shape):
                raise UsageError(
                    f"weight {name!r} has shape {tuple(tensor.shape)}, the policy model's is "
                    f"{tuple(target.shape)}"
                )
            pairs.append((target, tensor))
        with self.updating(version), torch.no_grad():
            for target, tensor in pairs:
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        return self._version

    def load_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], version: int | None = None
    ) -> int:
        """:meth:`update_weights` from a (partial) state dict; returns the new version."""
        return self.update_weights(state_dict.items(), version)

    def load_safetensors(self, data: bytes, version: int | None = None) -> int:
        """:meth:`load_state_dict` from a safetensors file's bytes (``POST /weights``)."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            tensors = load(data)
        except SafetensorError as exc:
            raise UsageError(f"the weights are not a safetensors file: {exc}") from exc
        return self.load_state_dict(tensors, version)

    def _next_version(self, version: int | None) -> int:
        if version is None:
            return self._version + 1
        if version < 0:
            raise UsageError(f"version={version!r} must be an integer >= 0")
        return version

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "policy_version": self._version,
            "model_dir": self.name,
            "device": str(self.device),
        }


def _check_model_dir(path: Path) -> None:
    if not path.is_dir():
        raise ConfigError(
            f"model directory {path} does not exist: {_BUILD_HINT.format(path=path)}, or point "
            "model_path at a Hugging Face-format directory (config.json, tokenizer, weights)"
        )
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{path} has no config.json, so it is not a Hugging Face model directory: save one "
            f"with save_pretrained, or {_BUILD_HINT.format(path=path)}"
        )


def _dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype | str:
    if dtype is None:
        return torch.float32 if device == "cpu" else "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, dtype, None)
    if not isinstance(found, torch.dtype):
        raise UsageError(f"dtype={dtype!r} is not a torch dtype: use e.g. 'float32', 'bfloat16'")
    return found
