"""The TRL adapter: load the model, the supervised warm-up (``SFTTrainer``) and the GRPO
trainer (``GRPOTrainer`` with our ``rollout_func``), configured from the training config.

Imports torch, transformers, trl (and peft for LoRA) inside functions: importing this module
is cheap, calling it needs the ``train`` extra. CPU runs use ``use_cpu``, fp32, no gradient
checkpointing; TRL does the GRPO maths, the optimizer and its resumable checkpoints.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from osmosis_ai.errors import ConfigError, MissingExtraError
from osmosis_ai.train.collect import prompt_for, reward_from_rollouts
from osmosis_ai.train.errors import OutOfMemoryError
from osmosis_ai.train.events import WarmupEvent
from osmosis_ai.train.plan import TrainPlan
from osmosis_ai.train.step_watch import StepWatch, run_watched
from osmosis_ai.train.tokens import TrainingRow
from osmosis_ai.workspace import DatasetRow, LoraSection

_FEATURE = "osmosis train run"


def require_train_extra(*, lora: bool = False) -> None:
    """Fail once, naming the install command, when a training dependency is missing."""
    modules = ["torch", "transformers", "trl", "datasets", "accelerate"] + (
        ["peft"] if lora else []
    )
    for name in modules:
        if importlib.util.find_spec(name) is None:
            raise MissingExtraError("train", _FEATURE, name)


def quiet() -> None:
    """Keep library progress bars, per-step log prints and known deprecation noise off the
    terminal (the run reports through its own events and files), and the run off the
    network: TRL reports every trainer it builds to the Hugging Face Hub unless telemetry
    is off, so it is, unless ``HF_HUB_DISABLE_TELEMETRY`` says otherwise."""
    import warnings

    import datasets
    import transformers
    from huggingface_hub import constants

    if "HF_HUB_DISABLE_TELEMETRY" not in os.environ:
        constants.HF_HUB_DISABLE_TELEMETRY = True

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    warnings.filterwarnings(
        "ignore", message=".*gradient_checkpointing.* is deprecated", category=FutureWarning
    )
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _silence(trainer: Any) -> Any:
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def resolve_device(requested: str | None) -> str:
    import torch

    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device {requested!r} was asked for but no CUDA device is visible")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def set_threads(count: int | None) -> None:
    if count is not None:
        import torch

        torch.set_num_threads(max(1, count))


def load_model(ref: str, device: str) -> tuple[Any, Any]:
    """Model and tokenizer from a local Hugging Face directory (offline), checked for what
    training needs: a chat template and a pad token."""
    import torch
    import transformers

    path = Path(ref)
    hint = "point experiment.model_path at a directory saved with save_pretrained"
    if path.is_absolute() and not (path / "config.json").is_file():
        raise ConfigError(f"{path} has no config.json, so it is not a Hugging Face model: {hint}")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(ref, local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            ref, local_files_only=True, dtype=torch.float32 if device == "cpu" else "auto"
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load a causal LM from {ref!r}: {exc}; {hint}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"the tokenizer of {ref} has no chat template, which rollouts and training need to "
            f"turn messages into tokens: add one as {path / 'chat_template.jinja'} (or a "
            "'chat_template' entry in tokenizer_config.json)"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return cast(Any, model).to(device), tokenizer


def lora_config(section: LoraSection, model: Any) -> Any:
    """peft's config for ``[lora]``. Input and output embeddings that ``model`` ties stay
    tied when ``modules_to_save`` trains them (else the adapter trains one copy, merging
    breaks the tie, and the log-probabilities TRL computes from the output layer never see
    the change)."""
    from peft import LoraConfig
    from peft.utils.constants import EMBEDDING_LAYER_NAMES

    modules = section.target_modules
    saved = list(section.modules_to_save)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return LoraConfig(
        r=section.rank,
        lora_alpha=section.alpha,
        lora_dropout=section.dropout,
        target_modules=modules if isinstance(modules, str) else list(modules),
        modules_to_save=saved or None,
        ensure_weight_tying=tied
        and any(name.rpartition(".")[2] in EMBEDDING_LAYER_NAMES for name in saved),
        task_type="CAUSAL_LM",
    )


def _common_args(device: str, seed: int) -> dict[str, Any]:
    import torch

    gpu = device.startswith("cuda")
    return {
        "use_cpu": not gpu,
        "bf16": gpu and torch.cuda.is_bf16_supported(),
        "gradient_checkpointing": False,
        "seed": seed,
        "data_seed": seed,
        "disable_tqdm": True,
        "logging_steps": 1,
        "dataloader_num_workers": 0,
    }


def warm_up(
    model: Any,
    tokenizer: Any,
    plan: TrainPlan,
    device: str,
    *,
    emit: Callable[[WarmupEvent], None],
    should_stop: Callable[[], bool],
) -> tuple[Any, int, bool]:
    """Supervised steps on the rows' ground truth (the assistant reply is the label).
    Returns the model, the steps done, and whether it was stopped.

    Every weight is trained, LoRA or not: the warm-up exists for a model with no policy yet,
    and an adapter cannot give one to a random-init model. Its frozen embeddings (tied to
    the output layer) and final norm bound every logit, so on the tiny model no adapter can
    lift a digit's probability past about 0.07 (``bench/train_lora.py --bound``), and
    exact-match rewards stay 0. GRPO then trains the adapter on the warmed-up weights."""
    from datasets import Dataset
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    from osmosis_ai.train.callbacks import WarmupCallback

    config = plan.config
    examples = [
        {"prompt": _plain(row), "completion": [{"role": "assistant", "content": row.label}]}
        for row in plan.rows
        if row.label is not None
    ]
    # Repeat small datasets so every step gets a full batch (an epoch's last batch is short).
    wanted = config.warmup.sft_steps * config.warmup.batch_size
    examples *= max(1, -(-wanted // len(examples)))
    callback = WarmupCallback(emit, should_stop)
    with tempfile.TemporaryDirectory(prefix="osmosis-warmup-") as scratch:
        args = SFTConfig(
            output_dir=scratch,
            max_steps=config.warmup.sft_steps,
            per_device_train_batch_size=config.warmup.batch_size,
            learning_rate=config.warmup.lr,
            max_length=config.training.max_prompt_length + config.training.max_response_length,
            report_to=[],
            save_strategy="no",
            **_common_args(device, config.training.seed),
        )
        trainer = _silence(
            SFTTrainer(
                model=model,
                args=args,
                train_dataset=Dataset.from_list(examples),
                processing_class=tokenizer,
                callbacks=[callback],
            )
        )
        _guard_memory(trainer.train, plan, "the warm-up", config.warmup.batch_size)
        warmed = trainer.model
        steps = int(trainer.state.global_step)
    return warmed, steps, callback.stopped


def _plain(row: DatasetRow) -> list[dict[str, Any]]:
    return [dict(m) for m in row.initial_messages] or [{"role": "user", "content": ""}]


def grpo_config(
    plan: TrainPlan,
    output_dir: Path,
    device: str,
    report_to: list[str],
    *,
    world: int = 1,
    sharded: bool = False,
) -> Any:
    """TRL's settings for the plan. ``world`` trainer processes (torch.distributed already
    set up) each take an equal share of a step's completions; ``sharded``: FSDP over them
    (GPUs), else data-parallel replicas."""
    from trl.trainer.grpo_config import GRPOConfig

    config, options = plan.config, plan.options
    training, sampling = config.training, config.sampling
    completions = plan.batch * plan.group
    if completions % world:
        raise ConfigError(
            f"{world} trainer workers cannot share the {completions} completions of a step "
            "equally: choose a worker count that divides it"
        )
    share = completions // world
    micro = options.micro_batch_size or share
    if share % micro:
        raise ConfigError(
            f"micro_batch_size={micro} must divide each of the {world} trainer workers' "
            f"{share} completions a step"
        )
    distributed: dict[str, Any] = {}
    if world > 1:
        distributed["ddp_find_unused_parameters"] = False
        if sharded:
            distributed["fsdp"] = "full_shard auto_wrap"
    vllm: dict[str, Any] = {}
    if options.vllm_server_url:
        vllm = {
            "use_vllm": True,
            "vllm_mode": "server",
            "vllm_server_base_url": options.vllm_server_url,
        }
    return GRPOConfig(
        output_dir=str(output_dir),
        max_steps=plan.steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=share // micro,
        num_generations=plan.group,
        learning_rate=training.lr,
        lr_scheduler_type="constant_with_warmup" if training.lr_warmup_steps else "constant",
        warmup_steps=training.lr_warmup_steps,
        beta=training.kl_coef,
        loss_type=training.loss_type,
        max_completion_length=training.max_response_length,
        temperature=sampling.rollout_temperature,
        top_p=sampling.rollout_top_p,
        shuffle_dataset=False,  # the plan fixed the order; resume replays it exactly
        save_strategy="steps",
        save_steps=options.resume_every,
        save_total_limit=1,
        report_to=report_to,
        log_completions=False,
        **vllm,
        **distributed,
        **_common_args(device, training.seed),
    )


def build_trainer(
    model: Any,
    tokenizer: Any,
    plan: TrainPlan,
    args: Any,
    *,
    rollout_func: Callable[[list[Any], Any], dict[str, list[Any] | None]],
    callbacks: Sequence[Any],
    segments: Callable[[], Sequence[tuple[int, TrainingRow]]] | None = None,
) -> Any:
    """TRL's GRPO trainer over the plan's prompts. ``segments`` gives, after each call of
    ``rollout_func``, the further token segments of its rollouts (the position of their
    rollout's row, the row): they join the step's batch (:func:`append_segments`)."""
    from datasets import Dataset
    from trl.trainer.grpo_trainer import GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    dataset = Dataset.from_list([{"prompt": prompt_for(i, plan.rows[i])} for i in plan.order])
    lora = plan.config.lora
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward_from_rollouts],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(lora, model) if lora.enabled else None,
        rollout_func=rollout_func,
        callbacks=list(callbacks),
    )
    if segments is not None:
        _train_segments(trainer, segments)
    return _silence(trainer)


def _train_segments(trainer: Any, take: Callable[[], Sequence[tuple[int, TrainingRow]]]) -> None:
    """Have ``trainer`` append the segments ``take`` gives to each generation batch."""
    score = trainer._generate_and_score_completions

    def generate_and_score(inputs: Any) -> Any:
        batch = score(inputs)
        extra = list(take())
        if extra or trainer.accelerator.num_processes > 1:  # all workers agree on the count
            batch = append_segments(trainer, batch, extra)
        return batch

    trainer._generate_and_score_completions = generate_and_score


_SEGMENT_KEYS = {
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "advantages",
    "num_items_in_batch",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "tool_mask",
}


def append_segments(
    trainer: Any, batch: dict[str, Any], segments: Sequence[tuple[int, TrainingRow]]
) -> dict[str, Any]:
    """``batch`` (what GRPO scored for one generation batch) with ``segments`` appended:
    each a row of its own, with the advantage of the rollout whose row sits at its
    position. As in verl's and SkyRL's multi-turn training, every segment of a trajectory
    carries the trajectory's advantage, computed once per prompt group over the rollouts
    (never re-normalised over segments). The old and reference log-probabilities are
    computed for the new rows as TRL does for the others, and rows that carry no loss pad
    the batch to a multiple of ``steps_per_generation`` (TRL splits it evenly) and, with
    several trainer workers, to the most rows any worker appends (every worker then makes
    the same forward passes and collectives)."""
    import torch

    rows = [row for _, row in segments]
    advantages = [float(batch["advantages"][slot]) for slot, _ in segments]
    unknown = sorted({key for key, value in batch.items() if value is not None} - _SEGMENT_KEYS)
    if rows and unknown:
        raise ConfigError(
            f"a rollout with several token segments cannot join a batch with {unknown} "
            "(multimodal inputs): keep the agent's conversation append-only"
        )
    out = dict(batch)
    device = batch["prompt_ids"].device
    count = len(rows)
    if trainer.accelerator.num_processes > 1:
        # Every worker appends as many rows as the one with the most segments (its share of
        # the rollouts may have none): the forward passes of the new rows and every gather
        # TRL makes over a micro-batch's rows then match across the workers.
        counts = trainer.accelerator.gather(torch.tensor([count], device=device))
        count = int(counts.max())
    extra_items = torch.zeros((), device=device)
    if count:
        count += -(len(batch["advantages"]) + count) % trainer.args.steps_per_generation
        filler = _no_loss(rows[-1]) if rows else _empty_row(trainer._tokenizer.pad_token_id)
        advantages += [0.0] * (count - len(rows))
        rows += [filler] * (count - len(rows))
        new = _segment_batch(trainer, batch, rows)
        extra_items = (new["completion_mask"] * new["tool_mask"]).sum().float()
        if batch.get("tool_mask") is None:
            out["tool_mask"] = torch.ones_like(batch["completion_mask"])
        pad = trainer._tokenizer.pad_token_id
        fill = {"prompt_ids": pad, "completion_ids": pad, "tool_mask": 1}
        per_sequence = trainer.vllm_importance_sampling_mode.startswith("sequence")
        for key, tensor in new.items():
            # a ratio per token is as wide as the completions, even rows of one token
            if key == "importance_sampling_ratio" and per_sequence:
                out[key] = torch.cat([out[key], tensor.to(out[key])])
            else:
                left = key.startswith("prompt")
                out[key] = _joined(out[key], tensor, fill.get(key, 0), left=left)
        out["advantages"] = torch.cat(
            [batch["advantages"], torch.tensor(advantages).to(batch["advantages"])]
        )
    if trainer.accelerator.num_processes > 1:
        extra_items = trainer.accelerator.gather(extra_items.reshape(1)).sum()
    out["num_items_in_batch"] = batch["num_items_in_batch"] + extra_items.to(
        batch["num_items_in_batch"]
    )
    return out


def _segment_batch(
    trainer: Any, batch: dict[str, Any], rows: Sequence[TrainingRow]
) -> dict[str, Any]:
    """The tensors of ``rows`` under ``batch``'s keys (padded among themselves)."""
    import torch

    device, long = batch["prompt_ids"].device, torch.long
    pad = trainer._tokenizer.pad_token_id
    new = {
        "prompt_ids": _stack([r.prompt_ids for r in rows], pad, long, device, left=True),
        "prompt_mask": _stack([[1] * len(r.prompt_ids) for r in rows], 0, long, device, left=True),
        "completion_ids": _stack([r.completion_ids for r in rows], pad, long, device),
        "completion_mask": _stack([[1] * len(r.completion_ids) for r in rows], 0, long, device),
        "tool_mask": _stack([r.env_mask for r in rows], 1, long, device),
    }
    if trainer.mask_truncated_completions:
        ends = {*trainer.eos_token_ids, pad}
        cut = torch.tensor([r.completion_ids[-1] not in ends for r in rows], device=device)
        new["completion_mask"] = new["completion_mask"] * (~cut).unsqueeze(1).long()
    ids = torch.cat([new["prompt_ids"], new["completion_ids"]], dim=1)
    attention = torch.cat([new["prompt_mask"], new["completion_mask"]], dim=1)
    new.update(_segment_logps(trainer, batch, ids, attention, new["completion_ids"].size(1)))
    if batch.get("sampling_per_token_logps") is not None:
        sampled = _stack([r.logprobs for r in rows], 0.0, torch.float32, device)
        new["sampling_per_token_logps"] = sampled
        if batch.get("importance_sampling_ratio") is not None:
            mask = new["completion_mask"] * new["tool_mask"]
            ratio = _sampling_ratio(trainer, new["old_per_token_logps"], sampled, mask)
            new["importance_sampling_ratio"] = ratio
    return new


def _stack(
    lists: Sequence[Sequence[float]], value: float, dtype: Any, device: Any, *, left: bool = False
) -> Any:
    """``lists`` as one tensor, each padded with ``value`` to the longest (on the left or
    the right)."""
    import torch

    width = max(len(values) for values in lists)
    padded = [
        [value] * (width - len(v)) + list(v) if left else list(v) + [value] * (width - len(v))
        for v in lists
    ]
    return torch.tensor(padded, dtype=dtype, device=device)


def _joined(old: Any, new: Any, value: float, *, left: bool = False) -> Any:
    """The rows of ``old`` then ``new``, both padded with ``value`` to the wider one."""
    import torch

    width = max(old.size(1), new.size(1))

    def widen(tensor: Any) -> Any:
        extra = width - tensor.size(1)
        return torch.nn.functional.pad(tensor, (extra, 0) if left else (0, extra), value=value)

    return torch.cat([widen(old), widen(new).to(old)])


def _no_loss(row: TrainingRow) -> TrainingRow:
    """``row`` with every completion token masked out: it fills a batch, training nothing."""
    return dataclasses.replace(row, env_mask=[0] * len(row.env_mask))


def _empty_row(pad: int) -> TrainingRow:
    """A one-token row that carries no loss: it fills a batch that has no segment to copy."""
    return TrainingRow(
        prompt_ids=[pad], completion_ids=[pad], logprobs=[0.0], env_mask=[0], reward=None
    )


def _segment_logps(
    trainer: Any, batch: dict[str, Any], ids: Any, attention: Any, keep: int
) -> dict[str, Any]:
    """The old and reference per-token log-probabilities of new rows, where ``batch`` has
    them: computed as TRL computes them for the rows it generated."""
    import torch

    logps: dict[str, Any] = {}
    size = trainer.args.per_device_train_batch_size

    def compute(model: Any) -> Any:
        values, _, _ = trainer._get_per_token_logps_and_entropies(
            model, ids, attention, keep, batch_size=size
        )
        return values

    with torch.no_grad():
        if batch.get("old_per_token_logps") is not None:
            logps["old_per_token_logps"] = compute(trainer.model)
        if batch.get("ref_per_token_logps") is not None:
            if trainer.ref_model is not None:
                logps["ref_per_token_logps"] = compute(trainer.ref_model)
            else:  # a LoRA run: the reference is the base model, its adapter off
                from trl.trainer.utils import use_adapter

                model = trainer.accelerator.unwrap_model(trainer.model)
                name = "ref" if "ref" in model.peft_config else None
                with use_adapter(model, adapter_name=name):
                    logps["ref_per_token_logps"] = compute(trainer.model)
    return logps


def _sampling_ratio(trainer: Any, old: Any, sampled: Any, mask: Any) -> Any:
    """TRL's vLLM importance-sampling ratio of new rows, in its configured mode."""
    import torch

    diff = torch.nan_to_num((old - sampled) * mask, nan=0.0)
    mode = trainer.vllm_importance_sampling_mode
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    low, high = trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=low, max=high)
    low = -math.inf if low is None else low
    high = math.inf if high is None else high
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def correct_off_policy(trainer: Any, cap: float, *, fuse: bool = True) -> None:
    """Have ``trainer`` weigh each completion token's loss by its truncated importance ratio
    ``min(p_train / p_gen, cap)``: the probability the weights being trained give the token
    over the probability it was sampled with (the logprobs the rollouts recorded). It is
    TRL's correction for a vLLM sampler, which is what a sample generated by an earlier
    policy version needs too, and it logs the mismatch and the ratios (``sampling/*``).
    Without a vLLM sampler, TRL's generation hooks see an engine whose weights the run
    itself syncs, at every optimizer step.

    TRL gets ``p_train`` from a pass over the whole batch before the loss. When every
    sample of a generation batch trains in one optimizer step (one iteration, the usual
    case), those are the log-probabilities the loss's own forward pass computes, so the
    ratio is taken from that pass instead (:class:`_FusedRatio`), one forward pass fewer a
    step; otherwise (or with ``fuse=False``) TRL's pass runs."""
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = "token_truncate"
    trainer.vllm_importance_sampling_clip_max = cap
    if not trainer.use_vllm:
        trainer.use_vllm = True
        trainer.vllm_generation = _RunSyncedWeights()
        trainer._last_loaded_step = -1
    args = trainer.args
    one_update = (
        trainer.num_iterations == 1
        and args.gradient_accumulation_steps % args.steps_per_generation == 0
    )
    if fuse and one_update and not getattr(trainer, "use_liger_kernel", False):
        _FusedRatio(trainer).install()


_RATIO_KEYS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)


class _FusedRatio:
    """The importance ratio of :func:`correct_off_policy` taken from the loss's forward
    pass: TRL's pass before the loss is turned off (its correction flag is off while it
    prepares a batch), and while the loss runs with the flag on, the ratio of each
    micro-batch is put into its inputs right after the loss's log-probabilities are
    computed, the ones TRL's pass would have given (same weights: no optimizer step falls
    between). The ``sampling/*`` metrics are TRL's, over the step's tokens (every trainer
    process's, gathered as TRL gathers them)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._compute_loss = trainer._compute_loss
        self._logps = trainer._get_per_token_logps_and_entropies
        self._pending: dict[str, Any] | None = None
        self._step = -1  # the step ``_sums`` and ``_peaks`` are of
        self._sums: Any = None  # |logp difference| sum and count, ratio sum and count
        self._peaks: Any = None  # largest |logp difference|, largest ratio, -smallest ratio

    def install(self) -> None:
        trainer = self.trainer
        trainer.vllm_importance_sampling_correction = False  # (no pass before the loss)
        trainer._compute_loss = self.compute_loss
        trainer._get_per_token_logps_and_entropies = self.logps

    def compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        trainer = self.trainer
        if inputs.get("sampling_per_token_logps") is None:
            return self._compute_loss(model, inputs)
        self._pending = inputs
        trainer.vllm_importance_sampling_correction = True  # the loss applies the ratio
        try:
            return self._compute_loss(model, inputs)
        finally:
            trainer.vllm_importance_sampling_correction = False
            self._pending = None

    def logps(self, *args: Any, **kwargs: Any) -> Any:
        result = self._logps(*args, **kwargs)
        inputs, self._pending = self._pending, None  # (the loss's first pass is the policy's)
        if inputs is not None:
            inputs["importance_sampling_ratio"] = self._ratio(result[0].detach(), inputs)
        return result

    def _ratio(self, current: Any, inputs: dict[str, Any]) -> Any:
        import torch

        trainer = self.trainer
        sampled = inputs["sampling_per_token_logps"]
        mask = inputs["completion_mask"]
        if inputs.get("tool_mask") is not None:
            mask = mask * inputs["tool_mask"]
        ratio = _sampling_ratio(trainer, current, sampled, mask)
        delta = torch.abs(current - sampled)
        delta, kept = delta[mask.bool() & ~torch.isnan(delta)], ratio[mask.bool()]
        none = torch.tensor(-math.inf, device=current.device)  # (a peak of no tokens)
        local = torch.stack(
            [
                delta.sum(),
                torch.tensor(float(delta.numel()), device=current.device),
                kept.sum(),
                torch.tensor(float(kept.numel()), device=current.device),
                delta.max() if delta.numel() else none,
                kept.max() if kept.numel() else none,
                -kept.min() if kept.numel() else none,
            ]
        ).float()
        gathered = trainer.accelerator.gather(local.unsqueeze(0)).view(-1, 7)
        self._record(gathered[:, :4].sum(0), gathered[:, 4:].max(0).values)
        return ratio

    def _record(self, sums: Any, peaks: Any) -> None:
        """Fold one micro-batch's figures into its step's, which TRL logs (one entry a
        step per key, replaced as the step's micro-batches come)."""
        import torch

        step = int(self.trainer.state.global_step)
        fresh = step != self._step
        if fresh:
            self._step, self._sums, self._peaks = step, sums, peaks
        else:
            self._sums, self._peaks = self._sums + sums, torch.maximum(self._peaks, peaks)
        difference, tokens, ratios, scored = (float(v) for v in self._sums)
        largest, most, least = (float(v) if math.isfinite(v) else 0.0 for v in self._peaks)
        values = (difference / max(tokens, 1.0), largest, -least, ratios / max(scored, 1.0), most)
        metrics = self.trainer._metrics["train"]
        for key, value in zip(_RATIO_KEYS, values, strict=True):
            if fresh or not metrics[key]:
                metrics[key].append(value)
            else:
                metrics[key][-1] = value


class _RunSyncedWeights:
    """The generation engine TRL sees when the run serves its own policy copy: the run
    copies the weights into it after each optimizer step, so TRL's sync does nothing."""

    def sync_weights(self) -> None:
        return None


def served_model(trainer: Any) -> Any:
    """The module generation should run on: the trainer's model (its base for LoRA, whose
    adapter layers sit inside it)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def run(
    trainer: Any, plan: TrainPlan, resume_from: Path | None, watch: StepWatch | None = None
) -> None:
    """``trainer.train``, resuming from ``resume_from`` when given; with ``watch``, on a
    thread of its own while this one enforces the trainer step deadline."""
    import torch

    target = None if resume_from is None else str(resume_from)
    # The model, tokenizer, trainer and libraries live for the whole run: freezing them keeps
    # them out of every later full collection, which otherwise stalls a step for ~0.3 s on
    # even a tiny model (and splits its decode batch).
    gc.collect()
    gc.freeze()
    # the current CUDA device is a thread's own: the training thread keeps this one's
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def train() -> None:
        if device is not None:
            torch.cuda.set_device(device)
        _guard_memory(
            lambda: trainer.train(resume_from_checkpoint=target), plan, "a GRPO step", None
        )

    try:
        if watch is None:
            train()
        else:
            run_watched(train, watch)
    finally:
        gc.unfreeze()


def _guard_memory(call: Callable[[], Any], plan: TrainPlan, what: str, batch: int | None) -> None:
    import torch

    try:
        call()
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        text = str(exc).lower()
        if not isinstance(exc, torch.OutOfMemoryError) and not (
            "out of memory" in text or "can't allocate memory" in text
        ):
            raise
        if batch is not None:
            size = f"[warmup].batch_size = {batch}"
            fix = "lower [warmup].batch_size"
        else:
            size = (
                f"rollout_batch_size {plan.batch} × n_samples_per_prompt {plan.group} = "
                f"{plan.batch * plan.group} completions per step"
                + (
                    f" in micro-batches of {plan.options.micro_batch_size}"
                    if plan.options.micro_batch_size
                    else ""
                )
            )
            fix = (
                "pass --micro-batch-size N (a divisor, e.g. 8) to split each step, lower "
                "training.rollout_batch_size, or shorten training.max_response_length "
                f"({plan.config.training.max_response_length})"
            )
        raise OutOfMemoryError(f"out of memory in {what} with {size}: {fix}") from exc


def save_model(model: Any, tokenizer: Any, folder: Path, *, base_ref: str | None = None) -> None:
    """Hugging Face format, with the tokenizer. A LoRA model saves its adapter when the
    adapter sits on ``base_ref`` (the configured base model), which serving finds; sitting on
    other weights (a warm-up's), it saves the merged model, since an adapter alone would be
    applied to the wrong weights wherever the run's folder is not at hand."""
    adapters = getattr(model, "peft_config", None)
    if isinstance(adapters, dict) and base_ref is not None:
        config: Any = adapters[model.active_adapter]
        base = str(config.base_model_name_or_path or "")
        if base and base != base_ref:
            _save_merged(model, Path(base), folder)
            tokenizer.save_pretrained(folder)
            return
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _save_merged(model: Any, base: Path, folder: Path) -> None:
    """The adapter merged into ``base``, built the way ``local:`` loading builds it (a copy
    on the CPU: the training model is left as it is)."""
    from osmosis_ai.controller.policy.adapter import load_merged

    with tempfile.TemporaryDirectory(prefix="osmosis-adapter-") as scratch:
        model.save_pretrained(scratch)
        merged, _ = load_merged(Path(scratch), base=base)
    merged.save_pretrained(folder)
