"""The batched decoding loop of the local policy: left-padded prompts share one KV cache;
each row keeps its own sampling parameters, random generator, stop rule and token budget.

Logprobs are ``log_softmax(logits / T)`` of the sampled token (``T = 1`` when greedy),
computed before ``top_p`` filtering: the distribution the trainer's importance ratio needs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from osmosis_ai.controller.policy.requests import SamplingParams
from osmosis_ai.controller.policy.responses import Sample

# A prefill's result: the last position's logits, the KV cache, attention mask, positions.
_Prefilled = tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]


@dataclass(slots=True, eq=False)
class Row:
    """One sample being decoded; rows of one request share its ``generator``."""

    prompt: list[int]
    params: SamplingParams
    max_new: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list[int])
    logprobs: list[float] = field(default_factory=list[float])
    top: list[list[tuple[int, float]]] = field(default_factory=list[list[tuple[int, float]]])
    finish: str | None = None
    stop_at: int | None = None

    def result(self, decode: Callable[[list[int]], str]) -> Sample:
        text = decode(self.tokens)
        if self.stop_at is not None:
            text = text[: self.stop_at]
        top = self.top if self.params.top_logprobs else None
        return Sample(self.tokens, self.logprobs, self.finish or "length", text, top)


class Decoder:
    """Runs rows through ``model`` (a Hugging Face causal LM) until each one finishes."""

    def __init__(
        self,
        model: Any,
        *,
        pad_id: int,
        eos_ids: Sequence[int],
        decode: Callable[[list[int]], str],
        device: torch.device,
    ) -> None:
        self.model = model
        self.pad_id = pad_id
        self.eos_ids = frozenset(eos_ids)
        self.decode = decode
        self.device = device
        accepted = inspect.signature(model.forward).parameters
        # transformers 5.2x renamed past_key_values to cache; accept either generation.
        self._cache_arg = "cache" if "cache" in accepted else "past_key_values"
        self._first: dict[str, Any] = {"use_cache": True}
        if "logits_to_keep" in accepted:
            self._first["logits_to_keep"] = 1

    def run(self, rows: Sequence[Row]) -> None:
        """Decode every row in place (``tokens``, ``logprobs``, ``finish`` …)."""
        device = self.device
        last, cache, mask, positions = self._prefill(rows)
        greedy = torch.tensor([row.params.greedy for row in rows], device=device)
        scale = torch.tensor(
            [[1.0 if row.params.greedy else row.params.temperature] for row in rows],
            device=device,
        )
        top_p = torch.tensor([[row.params.top_p] for row in rows], device=device)
        filter_top_p = any(r.params.top_p < 1 and not r.params.greedy for r in rows)
        top_k = max(row.params.top_logprobs for row in rows)
        groups = _generator_groups(rows)
        for _ in range(max(row.max_new for row in rows)):
            logits = last.float()
            logp = torch.log_softmax(logits / scale, dim=-1)
            uniform = torch.cat(
                [torch.rand(count, generator=g, device=device) for g, count in groups]
            )
            chosen = torch.where(
                greedy, logits.argmax(-1), _draw(logp, uniform, top_p, filter_top_p)
            )
            picked = logp.gather(1, chosen[:, None])[:, 0].tolist()
            top: list[tuple[list[float], list[int]]] = []
            if top_k:
                values, indices = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
                top = list(zip(values.tolist(), indices.tolist(), strict=True))
            for i, (row, token) in enumerate(zip(rows, chosen.tolist(), strict=True)):
                if row.finish is None:
                    self._append(row, token, picked[i], top[i] if top else None)
            if all(row.finish is not None for row in rows):
                return
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=chosen[:, None],
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{self._cache_arg: cache},
            )
            last, cache = out.logits[:, -1, :], _cache_of(out)

    def _prefill(self, rows: Sequence[Row]) -> _Prefilled:
        """The prompts' forward pass: each row's last logits, the cache, the attention mask
        and positions. Rows that share a prompt (a request's ``n`` samples, a group's
        rollouts) share its pass: each distinct prompt runs once and its cache is copied to
        the rows that asked for it."""
        slots: dict[tuple[int, ...], int] = {}
        index = [slots.setdefault(tuple(row.prompt), len(slots)) for row in rows]
        if len(slots) == len(rows):
            return self._forward_prompts([row.prompt for row in rows])
        last, cache, mask, positions = self._forward_prompts([list(p) for p in slots])
        if not callable(getattr(cache, "reorder_cache", None)):  # no way to copy it: run all
            return self._forward_prompts([row.prompt for row in rows])
        picks = torch.tensor(index, dtype=torch.long, device=self.device)
        cache.reorder_cache(picks)
        return (
            last.index_select(0, picks),
            cache,
            mask.index_select(0, picks),
            positions.index_select(0, picks),
        )

    def _forward_prompts(self, prompts: Sequence[list[int]]) -> _Prefilled:
        width = max(len(prompt) for prompt in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, **self._first)
        return out.logits[:, -1, :], _cache_of(out), mask, positions

    def _append(
        self, row: Row, token: int, logprob: float, top: tuple[list[float], list[int]] | None
    ) -> None:
        row.tokens.append(token)
        row.logprobs.append(logprob)
        if top is not None:
            k = row.params.top_logprobs
            row.top.append(list(zip(top[1][:k], top[0][:k], strict=True)))
        if token in self.eos_ids or (row.params.stop and self._stopped(row)):
            row.finish = "stop"
        elif len(row.tokens) >= row.max_new:
            row.finish = "length"

    def _stopped(self, row: Row) -> bool:
        text = self.decode(row.tokens)
        found = [i for s in row.params.stop if (i := text.find(s)) >= 0]
        if found:
            row.stop_at = min(found)
        return bool(found)


def _draw(
    logp: torch.Tensor, uniform: torch.Tensor, top_p: torch.Tensor, filter_top_p: bool
) -> torch.Tensor:
    # Inverse-CDF sampling with one uniform draw per row (from that row's generator), so a
    # seeded request samples the same tokens whatever else shares its batch.
    probs = logp.exp()
    if filter_top_p:
        ordered, order = probs.sort(dim=-1, descending=True)
        outside = (ordered.cumsum(dim=-1) - ordered) > top_p
        probs = torch.zeros_like(probs).scatter(1, order, ordered.masked_fill(outside, 0.0))
    cdf = probs.cumsum(dim=-1)
    target = (uniform * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=probs.shape[-1] - 1)


def _generator_groups(rows: Sequence[Row]) -> list[tuple[torch.Generator, int]]:
    groups: list[tuple[torch.Generator, int]] = []
    for row in rows:
        if groups and groups[-1][0] is row.generator:
            groups[-1] = (row.generator, groups[-1][1] + 1)
        else:
            groups.append((row.generator, 1))
    return groups


def _cache_of(out: Any) -> Any:
    cache = out.get("cache")
    return out.get("past_key_values") if cache is None else cache
