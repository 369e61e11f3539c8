"""LoRA training on the copy-digit template's tiny model: the warm-up gives the run a policy
(an adapter cannot give one to a random-init model), the adapter trains the output layer
TRL scores completions with, and a saved LoRA checkpoint serves what was trained when loaded
as ``local:<dir>``. A short LoRA run through the full path is ``slow``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")
pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")
pytest.importorskip("peft", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

import torch

from osmosis_ai.controller.policy import LocalPolicy
from osmosis_ai.train import engine
from osmosis_ai.train.demo import lora_config, setup_workspace
from osmosis_ai.train.plan import TrainPlan, TrainRunOptions, build_plan
from osmosis_ai.train.tiny_model import build_tiny_model

CONFIG = Path("configs") / "training" / "copy-digit-lora.toml"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The copy-digit template with ``[lora] enabled = true`` as its only change (the
    config ``python -m osmosis_ai.train.demo --lora`` trains)."""
    root = tmp_path_factory.mktemp("lora-workspace")
    setup_workspace(root)
    build_tiny_model(root / "models" / "tiny")
    template = (root / "configs" / "training" / "copy-digit.toml").read_text()
    assert lora_config(root) == root / CONFIG
    lines = (root / CONFIG).read_text().splitlines()
    changed = [(a, b) for a, b in zip(template.splitlines(), lines, strict=True) if a != b]
    assert changed == [("enabled = false", "enabled = true")]
    return root


@pytest.fixture(scope="module")
def plan(workspace: Path) -> TrainPlan:
    engine.quiet()
    torch.set_num_threads(1)
    found = build_plan(TrainRunOptions(config_path=workspace / CONFIG, cwd=workspace))
    assert found.config.lora.enabled
    return found


@pytest.fixture(scope="module")
def warmed(workspace: Path, plan: TrainPlan) -> tuple[Any, Any]:
    model, tokenizer = engine.load_model(str(workspace / "models" / "tiny"), "cpu")
    torch.manual_seed(0)
    model, steps, stopped = engine.warm_up(
        model, tokenizer, plan, "cpu", emit=lambda _event: None, should_stop=lambda: False
    )
    assert (steps, stopped) == (plan.config.warmup.sft_steps, False)
    return model, tokenizer


def answer_distributions(model: Any, tokenizer: Any, plan: TrainPlan) -> list[tuple[Any, int]]:
    """Each row's next-token distribution after the prompt, and the label's token id."""
    found = []
    model.eval()
    for row in plan.rows:
        assert row.label is not None
        prompt = tokenizer.apply_chat_template(
            list(row.initial_messages), add_generation_prompt=True, return_tensors="pt"
        )
        ids = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
        with torch.no_grad():
            probs = model(ids).logits[0, -1].softmax(-1)
        found.append((probs, tokenizer(row.label, add_special_tokens=False)["input_ids"][0]))
    return found


def test_the_warm_up_of_a_lora_run_gives_it_a_policy(warmed: tuple[Any, Any], plan: TrainPlan):
    # Warmed up through an adapter, the random model stayed uniform (entropy 5.55 of
    # ln 266 = 5.58 at most, p(label) 0.007), so GRPO never saw a reward.
    model, tokenizer = warmed
    assert not hasattr(model, "peft_config")  # GRPO's adapter goes on the warmed-up weights
    rows = answer_distributions(model, tokenizer, plan)
    entropy = sum(float(-(p * p.clamp_min(1e-12).log()).sum()) for p, _ in rows) / len(rows)
    greedy = sum(int(p.argmax()) == label for p, label in rows) / len(rows)
    assert entropy < 5.0 and greedy >= 0.5, (entropy, greedy)


def test_the_adapter_trains_the_output_layer_grpo_scores_with(
    warmed: tuple[Any, Any], plan: TrainPlan, tmp_path: Path
):
    # TRL computes completion log-probabilities from the output layer's weight, which the
    # tiny model ties to its input embeddings: frozen, it capped p(digit) near 0.24.
    model, tokenizer = warmed
    args = engine.grpo_config(plan, tmp_path / "resume", "cpu", [])
    trainer = engine.build_trainer(
        model, tokenizer, plan, args, rollout_func=lambda *_: {}, callbacks=[]
    )
    inner = engine.served_model(trainer)
    output = inner.get_output_embeddings().weight
    assert output.requires_grad
    assert output is inner.get_input_embeddings().weight  # still tied
    trained = {id(p) for p in trainer.model.parameters() if p.requires_grad}
    assert id(output) in trained
    assert any("lora_" in name for name, p in trainer.model.named_parameters() if p.requires_grad)


def nudged_adapter(workspace: Path, base: Path, plan: TrainPlan) -> tuple[Any, Any]:
    """A LoRA model on ``base`` whose adapter and saved modules moved off their start."""
    from peft import get_peft_model

    model, tokenizer = engine.load_model(str(base), "cpu")
    wrapped: Any = get_peft_model(model, engine.lora_config(plan.config.lora, model))
    optimizer = torch.optim.Adam([p for p in wrapped.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.tensor([list(range(40, 60))])
    for _ in range(3):
        loss = wrapped(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    wrapped.eval()
    return wrapped, tokenizer


def served_logits(policy_dir: Path) -> torch.Tensor:
    """Logits of the model ``model_path = "local:<policy_dir>"`` serves."""
    policy = LocalPolicy(policy_dir)
    with torch.no_grad():
        return policy.model(torch.tensor([list(range(40, 60))])).logits


@pytest.mark.parametrize("warm", [False, True], ids=["adapter", "merged-after-warm-up"])
def test_a_lora_checkpoint_serves_what_was_trained(
    warm: bool, workspace: Path, plan: TrainPlan, tmp_path: Path
):
    configured = workspace / "models" / "tiny"
    base = configured
    if warm:  # the run's warm-up saved other weights for the adapter to sit on
        base = tmp_path / "warmup"
        model, tokenizer = engine.load_model(str(configured), "cpu")
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(2.0)
        engine.save_model(model, tokenizer, base)
    wrapped, tokenizer = nudged_adapter(workspace, base, plan)
    with torch.no_grad():
        trained = wrapped(torch.tensor([list(range(40, 60))])).logits
    checkpoint = tmp_path / "step-000001"
    engine.save_model(wrapped, tokenizer, checkpoint, base_ref=str(configured))

    adapter = (checkpoint / "adapter_config.json").is_file()
    assert adapter is not warm  # after a warm-up: the merged model, standing on its own
    assert (checkpoint / "config.json").is_file() is warm
    served = served_logits(checkpoint)
    assert torch.allclose(served, trained, atol=1e-4), float((served - trained).abs().max())
    if warm:  # and not the adapter on the configured base, which would answer garbage
        assert not torch.allclose(served_logits(configured), trained, atol=1e-2)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a 60-step warm-up and 40 GRPO steps on a shared CPU
def test_a_short_lora_run_learns_and_its_checkpoint_answers(workspace: Path):
    """The template's LoRA run, 40 GRPO steps at a higher rate: the warm-up took (entropy
    well under uniform), gradients flow, the reward rises, and the final checkpoint served as
    ``local:<dir>`` answers most digits."""
    from osmosis_ai.controller.policy import open_local_upstream
    from osmosis_ai.train.runner import run_training

    config = workspace / "configs" / "training" / "lora-short.toml"
    text = (workspace / CONFIG).read_text()
    text = re.sub(r"(?m)^lr = 3e-4$", "lr = 1e-3", text)
    text = re.sub(r"(?m)^total_epochs = 160$", "total_epochs = 32", text)
    text = re.sub(r"(?m)^eval_interval = 50$", "eval_interval = 0", text)
    text = re.sub(r"(?m)^checkpoint_save_freq = 50$", "checkpoint_save_freq = 40", text)
    config.write_text(text)
    result = run_training(
        TrainRunOptions(
            config_path=config, cwd=workspace, torch_threads=1, handle_signals=False, name="short"
        )
    )
    assert result.status == "success" and result.steps_done == 40
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    assert all(r["entropy"] < 4.5 for r in records[:5]), [r["entropy"] for r in records[:5]]
    assert all(math.isfinite(r["grad_norm"]) for r in records)
    assert sum(r["grad_norm"] > 0 for r in records) >= 30
    rewards = [r["training_reward"] for r in records]
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.15, rewards

    checkpoint = result.run_dir / "checkpoints" / "step-000040"
    upstream = open_local_upstream(checkpoint)
    right = 0
    for digit in "0123456789":
        body = {"messages": [{"role": "user", "content": f"Copy: {digit}"}], "max_tokens": 4}
        answer = upstream.policy.chat({**body, "temperature": 0.0})
        right += answer["choices"][0]["message"]["content"].strip() == digit
    assert right >= 7, right
