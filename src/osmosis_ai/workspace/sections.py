"""The typed config sections (``[evaluation]``, ``[training]``, ...) and their value rules.

Each field carries a :class:`Rule` in its metadata, so a section is declared once. TOML
values arrive already typed, so rules check and never coerce (``"8"`` is not ``8``).
:func:`parse_sections` reads a kind's sections (with their ``[advanced]`` aliases) from
parsed tables: the config loader and the platform's submit check both go through it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from osmosis_ai.workspace.issues import ConfigIssue, ConfigKind, closest, describe_value

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")

LossType = Literal["grpo", "dapo", "dr_grpo", "bnpo"]
LOSS_TYPES: tuple[str, ...] = ("grpo", "dapo", "dr_grpo", "bnpo")
REPORT_TARGETS: tuple[str, ...] = ("tensorboard", "wandb", "mlflow", "trackio")


@dataclass(frozen=True)
class Rule:
    """What a value must be: ``expected`` completes "must be ..." in messages."""

    expected: str
    accepts: Callable[[object], bool]
    convert: Callable[[Any], object] = lambda value: value


def integer(minimum: int | None = None) -> Rule:
    expected = "an integer" if minimum is None else f"an integer ≥ {minimum}"
    return Rule(
        expected,
        lambda v: type(v) is int and (minimum is None or v >= minimum),
    )


def number(
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> Rule:
    bounds = [
        f"{op} {b:g}" for op, b in ((">", gt), ("≥", ge), ("<", lt), ("≤", le)) if b is not None
    ]
    expected = "a finite number" + (" " + " and ".join(bounds) if bounds else "")

    def accepts(value: object) -> bool:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        v = float(value)
        return (
            math.isfinite(v)
            and (gt is None or v > gt)
            and (ge is None or v >= ge)
            and (lt is None or v < lt)
            and (le is None or v <= le)
        )

    return Rule(expected, accepts, float)


def boolean() -> Rule:
    return Rule("true or false", lambda v: type(v) is bool)


def one_of(options: tuple[str, ...]) -> Rule:
    return Rule(f"one of {_listed(options)}", lambda v: isinstance(v, str) and v in options)


def subset_of(options: tuple[str, ...]) -> Rule:
    def accepts(value: object) -> bool:
        return isinstance(value, list) and all(
            isinstance(item, str) and item in options for item in value
        )

    return Rule(f"a list of {_listed(options)}", accepts, tuple)


def module_names() -> Rule:
    return Rule(
        "a list of module names",
        lambda v: isinstance(v, list) and all(isinstance(item, str) and item for item in v),
        tuple,
    )


def modules_or(keyword: str) -> Rule:
    def accepts(value: object) -> bool:
        if value == keyword:
            return True
        return (
            isinstance(value, list)
            and len(value) > 0
            and all(isinstance(item, str) and item for item in value)
        )

    return Rule(
        f"{keyword!r} or a non-empty list of module names",
        accepts,
        lambda v: v if isinstance(v, str) else tuple(v),
    )


def setting(default: T, rule: Rule) -> T:
    """Declare a section field with its default and its rule."""
    return field(default=default, metadata={"rule": rule})


def _listed(options: tuple[str, ...]) -> str:
    return ", ".join(repr(option) for option in options)


@dataclass(frozen=True)
class EvaluationSection:
    """``[evaluation]``: ``limit`` first rows (None = all), ``n`` runs per row, ``batch_size``
    rows in flight, ``pass_threshold`` (reward ≥ it passes), timeouts in seconds (None =
    unbounded)."""

    limit: int | None = setting(None, integer(1))
    n: int = setting(1, integer(1))
    batch_size: int = setting(1, integer(1))
    pass_threshold: float = setting(1.0, number())
    agent_workflow_timeout_s: float | None = setting(None, number(gt=0))
    grader_timeout_s: float | None = setting(None, number(gt=0))


@dataclass(frozen=True)
class TrainingSection:
    """``[training]``: optimiser and batch shape; ``loss_type`` picks the policy loss,
    ``kl_coef`` weights the KL penalty (0 = none), ``report_to`` lists metric sinks;
    ``lr_warmup_steps`` ramps the learning rate linearly from 0 to ``lr`` over the first
    GRPO steps (0 = none), so the optimizer's first steps cannot throw a warmed-up policy far
    (Adam's first update moves every weight by about ``lr``, whatever the gradient);
    ``no_signal_patience`` fails the run after that many consecutive steps without a learning
    signal (None: the smaller of 25 and 20 % of the steps, at least 1; 0 = never);
    ``max_staleness`` is the number of policy versions a sample may lag behind the weights it
    trains (0 = the synchronous loop: every step trains rollouts of its own weights);
    ``importance_ratio_cap`` truncates the per-token importance ratio (training-time over
    generation-time probability) that corrects a stale sample's loss."""

    lr: float = setting(1e-6, number(gt=0))
    lr_warmup_steps: int = setting(0, integer(0))
    total_epochs: int = setting(1, integer(1))
    n_samples_per_prompt: int = setting(8, integer(1))
    rollout_batch_size: int = setting(32, integer(1))
    max_prompt_length: int = setting(8192, integer(1))
    max_response_length: int = setting(8192, integer(1))
    agent_workflow_timeout_s: float = setting(450.0, number(gt=0))
    grader_timeout_s: float = setting(150.0, number(gt=0))
    loss_type: LossType = setting("dapo", one_of(LOSS_TYPES))  # noqa: RUF009 (immutable str)
    kl_coef: float = setting(0.0, number(ge=0))
    seed: int = setting(0, integer(0))
    report_to: tuple[str, ...] = setting((), subset_of(REPORT_TARGETS))
    no_signal_patience: int | None = setting(None, integer(0))
    max_staleness: int = setting(0, integer(0))
    importance_ratio_cap: float = setting(2.0, number(ge=1))


@dataclass(frozen=True)
class SamplingSection:
    """``[sampling]``: rollout sampling temperature and nucleus top-p."""

    rollout_temperature: float = setting(1.0, number(ge=0))
    rollout_top_p: float = setting(1.0, number(gt=0, le=1))


@dataclass(frozen=True)
class CheckpointsSection:
    """``[checkpoints]``: evaluate / save every N training steps (0 = never)."""

    eval_interval: int = setting(10, integer(0))
    checkpoint_save_freq: int = setting(20, integer(0))


@dataclass(frozen=True)
class LoraSection:
    """``[lora]``: train a LoRA adapter instead of the full model when ``enabled``."""

    enabled: bool = setting(False, boolean())
    rank: int = setting(8, integer(1))
    alpha: int = setting(16, integer(1))
    dropout: float = setting(0.0, number(ge=0, lt=1))
    target_modules: str | tuple[str, ...] = setting("all-linear", modules_or("all-linear"))
    # Modules trained whole beside the adapter (peft's modules_to_save), e.g. the embeddings.
    modules_to_save: tuple[str, ...] = setting((), module_names())


@dataclass(frozen=True)
class WarmupSection:
    """``[warmup]``: supervised steps on the dataset labels before RL (0 = skip)."""

    sft_steps: int = setting(0, integer(0))
    lr: float = setting(1e-3, number(gt=0))
    batch_size: int = setting(8, integer(1))


def text() -> Rule:
    return Rule("a string", lambda v: isinstance(v, str))


@dataclass(frozen=True)
class RaySection:
    """``[advanced.ray]``: ``osmosis train run`` across a Ray cluster (``--ray`` and its
    options override these). ``address``: ``""`` (one machine unless ``--ray``), ``"auto"``,
    ``"local"`` (start a cluster here) or ``host:port``; ``0`` workers or servers: one per
    node of the cluster."""

    address: str = setting("", text())
    trainer_workers: int = setting(0, integer(0))
    rollout_servers: int = setting(0, integer(0))
    max_failures: int = setting(3, integer(0))


def parse_section(
    cls: type[D], section: str, raw: Mapping[str, object], issues: list[ConfigIssue]
) -> D:
    """Build ``cls`` from a TOML table, adding an issue per unknown key or bad value.

    Bad values fall back to the default so that one run reports every problem.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, object] = {}
    for key, value in raw.items():
        spec = fields.get(key)
        if spec is None:
            issues.append(unknown_key(section, key, fields))
            continue
        rule: Rule = spec.metadata["rule"]
        if rule.accepts(value):
            values[key] = rule.convert(value)
        else:
            message = f"{section}.{key} must be {rule.expected}, got {describe_value(value)}"
            issues.append(ConfigIssue(f"{section}.{key}", message))
    return cls(**values)


def unknown_key(
    section: str, key: str, known: Mapping[str, object] | tuple[str, ...]
) -> ConfigIssue:
    """The "Unrecognized key" issue, with the closest known key as its correction."""
    guess = closest(key, known)
    return ConfigIssue(
        f"{section}.{key}", "Unrecognized key", f"{section}.{guess}" if guess else None
    )


# Settings of `osmosis train run` that the hosted platform's CLI refuses in their own sections
# but forwards inside [advanced]: each is also read from there by the same name, so one
# config works with both (``[advanced] loss_type``, ``[advanced.warmup]``, ``[advanced.lora]``).
ADVANCED_TRAINING_KEYS: tuple[str, ...] = (
    "loss_type",
    "kl_coef",
    "seed",
    "report_to",
    "lr_warmup_steps",
    "no_signal_patience",
    "max_staleness",
    "importance_ratio_cap",
)
ADVANCED_TABLES: tuple[str, ...] = ("warmup", "lora")
# Settings of `osmosis train run` that exist only under [advanced] (``[advanced.ray]``).
ADVANCED_ONLY_TABLES: tuple[str, ...] = ("ray",)
# The typed sections of each kind of config, by their table names.
TYPED_SECTIONS: dict[ConfigKind, dict[str, type[DataclassInstance]]] = {
    "eval": {"evaluation": EvaluationSection},
    "training": {
        "training": TrainingSection,
        "sampling": SamplingSection,
        "checkpoints": CheckpointsSection,
        "lora": LoraSection,
        "warmup": WarmupSection,
    },
}


def parse_sections(
    kind: ConfigKind, tables: Mapping[str, object], issues: list[ConfigIssue]
) -> dict[str, Any]:
    """The typed sections of a ``kind`` config, by field name of its config class.

    ``tables`` maps section names to tables, as TOML parses a file (a section that is not a
    table reads as empty: the caller reports it). Training settings are also read from
    ``[advanced]`` (:data:`ADVANCED_TRAINING_KEYS`, ``[advanced.warmup]``,
    ``[advanced.lora]``, ``[advanced.ray]``); a setting given in both places is an issue.
    """

    def table(name: str) -> dict[str, object]:
        value = tables.get(name, {})
        return dict(value) if isinstance(value, dict) else {}  # pyright: ignore[reportUnknownArgumentType]

    if kind == "eval":
        return {
            "evaluation": parse_section(
                EvaluationSection, "evaluation", table("evaluation"), issues
            )
        }
    advanced = table("advanced")
    aliased = {key: advanced[key] for key in ADVANCED_TRAINING_KEYS if key in advanced}
    return {
        "training": _aliased(
            TrainingSection, "training", table("training"), aliased, "advanced", issues
        ),
        "sampling": parse_section(SamplingSection, "sampling", table("sampling"), issues),
        "checkpoints": parse_section(
            CheckpointsSection, "checkpoints", table("checkpoints"), issues
        ),
        "lora": _aliased(
            LoraSection,
            "lora",
            table("lora"),
            _advanced_table(advanced, "lora", issues),
            "advanced.lora",
            issues,
        ),
        "warmup": _aliased(
            WarmupSection,
            "warmup",
            table("warmup"),
            _advanced_table(advanced, "warmup", issues),
            "advanced.warmup",
            issues,
        ),
        "ray": parse_section(
            RaySection, "advanced.ray", _advanced_table(advanced, "ray", issues), issues
        ),
    }


def _advanced_table(
    advanced: Mapping[str, object], name: str, issues: list[ConfigIssue]
) -> dict[str, object]:
    """The table ``[advanced.<name>]`` (``{}`` when absent or not a table: an issue)."""
    where = f"advanced.{name}"
    value = advanced.get(name, {})
    if not isinstance(value, dict):
        issues.append(
            ConfigIssue(where, f"{where} must be a table ([{where}]), got {describe_value(value)}")
        )
        return {}
    return dict(value)  # pyright: ignore[reportUnknownArgumentType]


def _aliased(  # noqa: PLR0917 (private, every caller names its six parts in order)
    cls: type[D],
    section: str,
    own: Mapping[str, object],
    extra: Mapping[str, object],
    where: str,
    issues: list[ConfigIssue],
) -> D:
    """``[section]`` with the settings ``extra`` also gives under ``[where]``; a setting
    given in both places is an issue."""
    for key in sorted(set(own) & set(extra)):
        issues.append(
            ConfigIssue(
                f"{where}.{key}",
                f"{key} is set both in [{section}] and in [{where}]; keep one ([{where}] "
                "works with osmosis train run and with platform submits)",
            )
        )
    parsed = parse_section(cls, section, own, issues)
    if not extra:
        return parsed
    from_advanced = parse_section(cls, where, extra, issues)
    known = {f.name for f in dataclasses.fields(cls)}
    return dataclasses.replace(
        parsed,
        **{key: getattr(from_advanced, key) for key in extra if key in known and key not in own},
    )
