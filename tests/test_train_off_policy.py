"""The importance-ratio correction of asynchronous training (``max_staleness >= 1``): taken
from the loss's own forward pass, it trains exactly as TRL's correction with its extra pass
before the loss does, and logs the same ``sampling/*`` figures."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")
pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

import torch

from osmosis_ai.train import engine
from osmosis_ai.train.collect import REWARD_FIELD, row_index
from osmosis_ai.train.demo import setup_workspace
from osmosis_ai.train.plan import TrainPlan, TrainRunOptions, build_plan
from osmosis_ai.train.tiny_model import build_tiny_model

KEYS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> TrainPlan:
    root = tmp_path_factory.mktemp("off-policy")
    setup_workspace(root)
    build_tiny_model(root / "models" / "tiny")
    engine.quiet()
    torch.set_num_threads(1)
    config = root / "configs" / "training" / "copy-digit.toml"
    return build_plan(TrainRunOptions(config_path=config, cwd=root))


class StaleRollouts:
    """Fixed completions for each prompt, with "sampled" logprobs that a policy some
    versions back would have given: the current ones shifted by noise, so some ratios are
    over the cap and most are not 1."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.rng = random.Random(7)
        self.cache: dict[tuple[int, int], tuple[list[int], list[int], list[float]]] = {}

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        seen: dict[int, int] = {}
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        rewards: list[float] = []
        for prompt in prompts:
            index = row_index(prompt)
            sample = seen[index] = seen.get(index, -1) + 1
            prompt_ids, completion, logprobs = self._row(prompt, index, sample)
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion)
            out["logprobs"].append(logprobs)
            rewards.append(float(sample % 2))
        return {**out, REWARD_FIELD: rewards}

    def _row(
        self, prompt: Any, index: int, sample: int
    ) -> tuple[list[int], list[int], list[float]]:
        key = (index, sample)
        if key not in self.cache:
            messages = [{k: v for k, v in m.items() if k in ("role", "content")} for m in prompt]
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            digits = [self.rng.randrange(10) for _ in range(1 + sample % 3)]
            completion = self.tokenizer("".join(map(str, digits)), add_special_tokens=False)[
                "input_ids"
            ] + [int(self.tokenizer.eos_token_id)]
            with torch.no_grad():
                logits = self.model(torch.tensor([ids + completion])).logits[0, len(ids) - 1 : -1]
            current = logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None])[:, 0]
            sampled = [float(v) + self.rng.uniform(-1.5, 1.0) for v in current]
            self.cache[key] = (ids, completion, sampled)
        return self.cache[key]


def one_step(plan: TrainPlan, model: Any, tokenizer: Any, tmp: Path, *, fuse: bool) -> Any:
    args = engine.grpo_config(plan, tmp, "cpu", [])
    args.max_steps = 1
    rollouts = StaleRollouts(copy.deepcopy(model), tokenizer)
    trainer = engine.build_trainer(
        copy.deepcopy(model), tokenizer, plan, args, rollout_func=rollouts, callbacks=[]
    )
    engine.correct_off_policy(trainer, 2.0, fuse=fuse)
    assert trainer.vllm_importance_sampling_correction is not fuse  # (no pass before the loss)
    passes = 0
    fused = trainer._compute_loss.__self__ if fuse else None  # (the fused ratio wraps it)
    inner = fused._logps if fused is not None else trainer._get_per_token_logps_and_entropies

    def counted(*a: Any, **k: Any) -> Any:
        nonlocal passes
        passes += 1
        return inner(*a, **k)

    if fused is not None:
        fused._logps = counted
    else:
        trainer._get_per_token_logps_and_entropies = counted
    trainer.train()
    trainer.passes = passes
    return trainer


def test_the_fused_ratio_trains_as_trl_does_with_one_pass_fewer(plan: TrainPlan, tmp_path: Path):
    model, tokenizer = engine.load_model(plan.model_ref, "cpu")
    torch.manual_seed(0)
    theirs = one_step(plan, model, tokenizer, tmp_path / "trl", fuse=False)
    torch.manual_seed(0)
    ours = one_step(plan, model, tokenizer, tmp_path / "fused", fuse=True)

    # the same update: every trained weight moved alike
    moved = 0
    for (name, a), (_, b) in zip(
        engine.served_model(theirs).named_parameters(),
        engine.served_model(ours).named_parameters(),
        strict=True,
    ):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), name
        moved += int(not torch.equal(a, model.get_parameter(name)))
    assert moved > 0

    # the same figures, and the correction really weighed the tokens (ratios off 1, capped)
    logged = [next(e for e in t.state.log_history if KEYS[0] in e) for t in (theirs, ours)]
    for key in KEYS:
        assert math.isclose(logged[0][key], logged[1][key], rel_tol=1e-4, abs_tol=1e-6), key
    assert logged[1]["sampling/importance_sampling_ratio/max"] == pytest.approx(2.0)
    assert logged[1]["sampling/importance_sampling_ratio/min"] < 0.9
    assert logged[1]["sampling/sampling_logp_difference/mean"] > 0.3

    # TRL's pass before the loss is gone: one forward pass a micro-batch, not one more
    micro_batches = theirs.args.gradient_accumulation_steps
    assert ours.passes == micro_batches
    assert theirs.passes > ours.passes
