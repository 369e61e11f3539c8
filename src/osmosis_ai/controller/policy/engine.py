"""The local policy: a Hugging Face causal LM and its tokenizer served as OpenAI chat and
text completions, with token ids, logprobs, hot weight updates and a policy version.

Concurrent calls share the model: one engine thread (started on demand, gone when idle)
runs every request waiting by then as one batch. Told how many callers are in flight
(:meth:`LocalPolicy.expect_callers`), it waits briefly for all of them before starting.
Needs the ``train`` extra (torch, transformers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.controller.errors import WeightSyncTimeoutError
from osmosis_ai.deadlines import WEIGHT_SYNC
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
# With callers expected, an idle engine starts a batch once each of them has a request
# waiting, or once none has come for this long or as long as recent batches took, whichever
# is longer (a caller that never asks, a slow tool: waiting longer than a batch takes would
# cost more than the extra batch it saves), and never holds a request past the cap.
DEFAULT_BATCH_LINGER_S = 0.02
_MAX_BATCH_WAIT_S = 1.0
_ENGINE_IDLE_S = 30.0  # the engine thread outlives a pause between steps, not an idle policy
_PROMPT_CACHE_SIZE = 1024
_PROMPT_CACHE_MAX_TOKENS = 4096
_BUILD_HINT = "build one with `python -m osmosis_ai.train.tiny_model {path}`"


@dataclass(slots=True, eq=False)
class _Job:
    rows: list[Row]
    notify: Callable[[], None] | None = None  # called from the engine thread when done
    flush: Callable[[], None] | None = None  # then once per batch, after every notify
    done: threading.Event = field(default_factory=threading.Event)
    version: int = 0
    samples: list[Sample] = field(default_factory=list[Sample])
    error: BaseException | None = None


class LocalPolicy:
    """Serves the model in ``model_dir`` (Hugging Face format, loaded offline).

    ``device`` is ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; ``dtype`` a torch dtype or its name
    (default: float32 on CPU, the checkpoint's dtype elsewhere). ``max_model_len`` bounds
    prompt plus completion (default: the model's ``max_position_embeddings``); a completion
    that would pass it is cut short (``finish_reason`` ``"length"``). ``seed`` makes the
    requests that carry no seed reproducible as a sequence. A LoRA adapter folder is merged
    into ``base`` (a model folder), else into the base model its config names.
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
        base: str | Path | None = None,
    ) -> None:
        from osmosis_ai.controller.policy.adapter import is_adapter, load_merged

        path = Path(model_dir).expanduser()
        resolved = _dtype(dtype, device)
        model: Any
        if is_adapter(path):  # a LoRA checkpoint: merged into ``base``, else the one it names
            model, tokenizer = load_merged(
                path, base=Path(base).expanduser() if base else None, dtype=resolved
            )
        else:
            _check_model_dir(path)
            try:
                tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    path, local_files_only=True, dtype=resolved
                )
            except (OSError, ValueError, KeyError) as exc:
                raise ConfigError(
                    f"cannot load a Hugging Face causal LM from {path}: {exc}; point model_path "
                    f"at a directory saved with save_pretrained, or "
                    f"{_BUILD_HINT.format(path=path)}"
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
        self._queue = threading.Condition()  # guards the five fields below
        self._pending: deque[_Job] = deque()
        self._runner: threading.Thread | None = None
        self._callers = 0
        self._arrived = 0.0
        self._held = False  # no batch starts while held
        self._held_until = 0.0  # the weight sync deadline of the hold (monotonic)
        self._hold_s = WEIGHT_SYNC.default_s
        self._expired: list[_Job] = []  # requests the hold kept past it, to fail
        self._batch_s = 0.0  # recent batches' duration: a maximum that decays
        self.batches = 0  # batches run so far (how well concurrent requests batch)
        self.batch_linger_s = DEFAULT_BATCH_LINGER_S
        self._prompts: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._prompts_lock = threading.Lock()
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
        job = self._job(prompts, params)
        self._submit(job)
        job.done.wait()
        return self._outcome(job)

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> tuple[int, list[Sample]]:
        """:meth:`generate` for an event loop: the loop thread only queues the request and
        is woken once its batch is done (no worker thread per request)."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_resolve, finished)

        job = self._job(prompts, params, wake)
        self._submit(job)
        await finished
        return self._outcome(job)

    def expect_callers(self, count: int) -> None:
        """Batching hint: ``count`` callers (a training step's rollouts in flight) may each
        send a request now. While it is above zero, an idle engine waits until that many
        requests wait before it starts a batch, or until none has arrived for
        :attr:`batch_linger_s` or as long as recent batches took, whichever is longer; at
        zero it starts as soon as one request waits. Lower it as callers finish."""
        with self._queue:
            self._callers = max(0, count)
            if self._pending:
                self._queue.notify_all()

    def hold(self, held: bool) -> None:
        """While held, no batch starts and requests queue. Lets the rollouts of the next
        training step start and reach the policy while the trainer still computes the
        update: the trainer releases them once the new weights are in place and it asks for
        that step (the model is then the trainer's alone to use).

        A hold lasts at most the weight sync deadline (``OSMOSIS_WEIGHT_SYNC_TIMEOUT_S``):
        past it, each held request, and each one that comes while the hold lasts, fails
        with :class:`WeightSyncTimeoutError` (its rollout fails saying so)."""
        with self._queue:
            if held and not self._held:
                self._hold_s = WEIGHT_SYNC.seconds()
                self._held_until = time.monotonic() + self._hold_s
            self._held = held
            self._queue.notify_all()

    def _job(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        notify: Callable[[], None] | None = None,
    ) -> _Job:
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
            ids = list(prompt)  # shared by its rows: the decoder never changes a prompt
            rows.extend(Row(ids, params, budget, generator) for _ in range(params.n))
        return _Job(rows, notify)

    @staticmethod
    def _outcome(job: _Job) -> tuple[int, list[Sample]]:
        if job.error is not None:
            raise job.error
        return job.version, job.samples

    def _submit(self, job: _Job) -> None:
        with self._queue:
            self._pending.append(job)
            self._arrived = time.monotonic()
            if self._runner is None:
                self._runner = threading.Thread(
                    target=self._serve, name="osmosis-policy-engine", daemon=True
                )
                self._runner.start()
            # Wake the engine when it idles or its batch may be full; otherwise it wakes at
            # its own deadline and sees the later arrival.
            if len(self._pending) == 1 or self._batch_ready():
                self._queue.notify_all()

    def _batch_ready(self) -> bool:
        rows = sum(len(job.rows) for job in self._pending)
        return len(self._pending) >= self._callers or rows >= self.max_batch_rows

    def _serve(self) -> None:
        """The engine thread: batch after batch while requests wait; it ends once none has
        come for a while (so starting it stays off the hot path of a run's steps)."""
        try:
            while True:
                with self._queue:
                    if not self._pending:
                        self._queue.wait_for(lambda: bool(self._pending), timeout=_ENGINE_IDLE_S)
                    batch = self._next_batch()
                    expired, self._expired = self._expired, []
                    if not batch and not expired:
                        self._runner = None  # (under the lock: a new request starts another)
                        return
                if expired:
                    self._fail(expired, self._hold_error())
                    continue
                self._run(batch)
        except BaseException:
            with self._queue:
                self._runner = None
            raise

    def _next_batch(self) -> list[_Job]:
        # Called holding ``_queue``: waits out a hold and for the expected callers, then
        # takes up to ``max_batch_rows`` rows (always at least one job).
        while self._pending and self._held:
            left = self._held_until - time.monotonic()
            if left <= 0:  # the trainer never came back for them: they fail
                self._expired = list(self._pending)
                self._pending.clear()
                return []
            self._queue.wait(left)  # hold() notifies
        started = time.monotonic()
        linger = max(self.batch_linger_s, self._batch_s)
        while self._pending and not self._batch_ready():
            now = time.monotonic()
            deadline = min(self._arrived + linger, started + _MAX_BATCH_WAIT_S)
            if now >= deadline:
                break
            self._queue.wait(deadline - now)
        batch: list[_Job] = []
        size = 0
        while self._pending and (
            not batch or size + len(self._pending[0].rows) <= self.max_batch_rows
        ):
            job = self._pending.popleft()
            batch.append(job)
            size += len(job.rows)
        return batch

    def _run(self, batch: list[_Job]) -> None:
        try:
            with self._engine:
                training = self.model.training
                self.model.eval()
                started = time.monotonic()
                try:
                    with torch.no_grad():
                        self._decoder.run([row for job in batch for row in job.rows])
                finally:
                    self.model.train(training)
                self._batch_s = max(time.monotonic() - started, 0.8 * self._batch_s)
                self.batches += 1
                for job in batch:
                    job.version = self._version
            for job in batch:
                job.samples = [row.result(self.decode) for row in job.rows]
        except BaseException as exc:  # every waiting caller sees the failure
            for job in batch:
                job.error = exc
        finally:
            self._finish(batch)

    def _fail(self, jobs: list[_Job], error: BaseException) -> None:
        for job in jobs:
            job.error = error
        self._finish(jobs)

    @staticmethod
    def _finish(batch: list[_Job]) -> None:
        for job in batch:
            job.done.set()
            if job.notify is not None:
                job.notify()
        for flush in dict.fromkeys(job.flush for job in batch if job.flush is not None):
            flush()

    def _hold_error(self) -> WeightSyncTimeoutError:
        return WEIGHT_SYNC.error(
            WeightSyncTimeoutError,
            "the policy held this model call for the next training step's weights, and the "
            "trainer did not ask for that step in time",
            self._hold_s,
        )

    def chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer an OpenAI chat-completions request (``stream`` ignored) as a
        ``chat.completion`` body with token ids, logprobs and ``policy_version``."""
        params, prompt, renderer = self._chat_request(body)
        renderer.version, samples = self.generate([prompt], params)
        return renderer.chat(samples, params)

    async def achat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`chat` for an event loop (see :meth:`agenerate`)."""
        params, prompt, renderer = self._chat_request(body)
        renderer.version, samples = await self.agenerate([prompt], params)
        return renderer.chat(samples, params)

    def chat_chunks(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The same answer as ``chat.completion.chunk`` payloads (generated first, then
        split), with a usage chunk when ``stream_options.include_usage`` is set."""
        params, prompt, renderer = self._chat_request(body)
        renderer.version, samples = self.generate([prompt], params)
        return renderer.chat_chunks(samples, params, include_usage=_wants_usage(body))

    async def achat_chunks(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """:meth:`chat_chunks` for an event loop (see :meth:`agenerate`)."""
        params, prompt, renderer = self._chat_request(body)
        renderer.version, samples = await self.agenerate([prompt], params)
        return renderer.chat_chunks(samples, params, include_usage=_wants_usage(body))

    def submit_chat(
        self,
        body: Mapping[str, Any],
        reply: Callable[[Any, BaseException | None], None],
        *,
        chunks: bool = False,
        flush: Callable[[], None] | None = None,
    ) -> None:
        """Queue a chat request and return at once: ``reply(answer, None)`` or
        ``reply(None, error)`` is called from the engine thread when its batch is done
        (``answer`` as :meth:`chat` or, with ``chunks``, :meth:`chat_chunks` gives it), then
        ``flush()`` once for all the replies of that batch that gave it (so a caller can send
        a batch's answers together). A request that cannot be served raises
        :class:`PolicyRequestError` here instead."""
        params, prompt, renderer = self._chat_request(body)
        usage = _wants_usage(body)
        job = self._job([prompt], params)

        def finish() -> None:
            if job.error is not None:
                reply(None, job.error)
                return
            renderer.version = job.version
            try:
                if chunks:
                    answer: Any = renderer.chat_chunks(job.samples, params, include_usage=usage)
                else:
                    answer = renderer.chat(job.samples, params)
            except Exception as exc:  # a renderer bug reaches the caller, not the engine
                reply(None, exc)
                return
            reply(answer, None)

        job.notify = finish
        job.flush = flush
        self._submit(job)

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
        prompt = self._chat_prompt(messages, body.get("tools"), kwargs)
        return params, prompt, self._renderer(body, [prompt], self._version)

    def _chat_prompt(
        self, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]
    ) -> list[int]:
        # Rendering and tokenizing cost more than the rest of a small request, and a step
        # asks for every prompt n_samples_per_prompt times: keep recent prompts' ids.
        try:
            key = json.dumps([messages, tools, kwargs], sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError):  # not JSON (a caller's own objects): no caching
            return self.encode(self.render(messages, tools, **kwargs))
        with self._prompts_lock:
            cached = self._prompts.get(key)
            if cached is not None:
                self._prompts.move_to_end(key)
                return list(cached)
        prompt = self.encode(self.render(messages, tools, **kwargs))
        if len(prompt) <= _PROMPT_CACHE_MAX_TOKENS:
            with self._prompts_lock:
                self._prompts[key] = tuple(prompt)
                if len(self._prompts) > _PROMPT_CACHE_SIZE:
                    self._prompts.popitem(last=False)
        return prompt

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
        place; on a clean exit the version becomes ``version``, or goes up by one. A
        generation batch that keeps the model past the weight sync deadline
        (``OSMOSIS_WEIGHT_SYNC_TIMEOUT_S``) raises :class:`WeightSyncTimeoutError`."""
        deadline = WEIGHT_SYNC.seconds()
        if not self._engine.acquire(timeout=deadline):
            raise WEIGHT_SYNC.error(
                WeightSyncTimeoutError,
                "a generation batch kept the policy's model, so its weights could not be updated",
                deadline,
            )
        try:
            new = self._next_version(version)
            yield
            self._version = new
        finally:
            self._engine.release()

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


def _wants_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
