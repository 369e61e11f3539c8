"""One training invocation's session: its steps trained in this process.

The session follows a run from its plan to its result: the rollout server and controller
service (started while the model loads) → optional supervised warm-up → validation → GRPO
steps (each: rollouts through the protocol against the current policy, rewards from the
grader, one TRL update) → final checkpoint, validation and reward plot. Ctrl-C finishes the
step, saves, and stops; a second one quits.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

from osmosis_ai.deadlines import TRAIN_STEP
from osmosis_ai.rundir.timestamps import iso_utc
from osmosis_ai.train import engine
from osmosis_ai.train.bridge import RolloutBridge, TrainingUpstream
from osmosis_ai.train.chart import save_png
from osmosis_ai.train.collect import RolloutCollector, StepStats
from osmosis_ai.train.events import (
    EvalSummary,
    EventSink,
    LogEvent,
    StageEvent,
    StepEvent,
    TrainEvent,
    TrainRunResult,
    ValidationEvent,
    WarningEvent,
)
from osmosis_ai.train.plan import TrainPlan
from osmosis_ai.train.rundir import RunDir, save_atomically
from osmosis_ai.train.step_watch import StepWatch
from osmosis_ai.train.stopping import NO_LEARNING_SIGNAL, Background, SignalWatch, StopRequest
from osmosis_ai.train.validation import PinnedValidations

# Rollout servers that honor it (the bundled templates do) skip per-rollout trajectory files
# during training; a workspace can set it to "1" in [env] to keep them.
TRAJECTORIES_ENV = "OSMOSIS_SAVE_TRAJECTORIES"

# TRL's log keys → metrics.jsonl keys (reference §6.5 names where one exists).
METRIC_NAMES = {
    "reward": "training_reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "entropy": "entropy",
    "kl": "kl",
    "completions/mean_length": "response_length",
    "clip_ratio/region_mean": "clip_ratio",
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
    "step_time": "step_seconds",
    # with max_staleness >= 1: training-time vs generation-time logprobs, and the truncated
    # importance ratios that corrected the loss
    "sampling/sampling_logp_difference/mean": "logprob_mismatch",
    "sampling/sampling_logp_difference/max": "logprob_mismatch_max",
    "sampling/importance_sampling_ratio/mean": "importance_ratio_mean",
    "sampling/importance_sampling_ratio/max": "importance_ratio_max",
}


class Session:
    """One invocation, its steps trained in this process. On a Ray cluster the driver
    (:class:`~osmosis_ai.train.ray.driver.DriverSession`) and each trainer worker
    (:class:`~osmosis_ai.train.ray.worker.WorkerSession`) are subclasses: ``leads`` is the
    worker that writes metrics and checkpoints and validates, ``world`` the worker count,
    ``dispatch_ahead`` whether a step's rollouts may start during the previous update."""

    leads = True
    world = 1
    dispatch_ahead = True
    sharded = False  # FSDP across the trainer workers (GPUs)

    def __init__(self, plan: TrainPlan, rundir: RunDir, emit: EventSink) -> None:
        self.plan, self.rundir, self._emit = plan, rundir, emit
        self.journal = rundir.journal
        self.started = time.monotonic()
        self.rewards: list[float | None] = []
        self.validations: list[EvalSummary] = []
        self.warnings: list[str] = []
        self.stop = StopRequest(self._on_stop_request, plan.options.stop)
        self.signal = SignalWatch(plan.no_signal_patience)
        self.pending_validation: EvalSummary | None = None
        self.validating: PinnedValidations | None = None  # beside asynchronous training
        self.model: Any = None
        self.tokenizer: Any = None
        self.trainer: Any = None
        self.policy: Any = None
        self.collector: RolloutCollector | None = None
        self.steps_done = 0
        self.warmup_steps = 0
        self.resume_point: Path | None = None
        self._warned: set[str] = set()

    # -- events ----------------------------------------------------------------------------

    def emit(self, event: TrainEvent) -> None:
        self._emit(event)

    def stage(self, message: str, **details: object) -> None:
        self.journal.info("run", message, **details)
        self.emit(StageEvent(self.journal.redact(message)))

    def warn(self, code: str, message: str) -> None:
        self.journal.warning("run", message, code=code)
        self.warnings.append(message)
        self.emit(WarningEvent(code, self.journal.redact(message)))

    def _server_output(self, line: str) -> None:
        self.journal.output("rollout-server", line)
        if self.plan.options.verbose:
            self.emit(LogEvent(f"[rollout-server] {self.journal.redact(line)}"))

    # -- the invocation ----------------------------------------------------------------------

    def execute(self) -> TrainRunResult:
        plan = self.plan
        for code, message in plan.warnings:
            self.warn(code, message)
        verb = "resuming" if plan.resumed else "new run"
        self.stage(
            f"{plan.run_name}: {plan.steps} steps of {plan.batch} prompts × {plan.group} "
            f"samples ({verb})"
        )
        with self.stop if plan.options.handle_signals else contextlib.nullcontext():
            try:
                status = self._train()
            except KeyboardInterrupt:
                self.rundir.set_status("interrupted", steps_done=self.steps_done)
                raise
            except BaseException as exc:
                self.journal.error("run", f"training failed: {type(exc).__name__}: {exc}")
                self.rundir.set_status(
                    "failed", steps_done=self.steps_done, error=self.journal.redact(str(exc))
                )
                raise
        error = error_message = None
        if status == NO_LEARNING_SIGNAL:
            if not self.signal.streak:  # a Ray driver: the trainer workers watched
                self.signal.recount(self.rundir.read_metrics())
            status, error, error_message = "failed", NO_LEARNING_SIGNAL, self.signal.message()
            self.journal.error("run", f"training failed: {error_message}", code=error)
            self.rundir.set_status(
                status, steps_done=self.steps_done, error=error, message=error_message
            )
        else:
            self.rundir.set_status(status, steps_done=self.steps_done)
        plot = (
            self.rundir.plot_path
            if save_png(self.rundir.plot_path, self.rewards, self.validations)
            else None
        )
        if plot is None:
            self.warn(
                "PLOT_SKIPPED",
                "matplotlib is not installed: no reward.png (pip install matplotlib)",
            )
        return TrainRunResult(
            run_name=plan.run_name,
            run_dir=self.rundir.path,
            status=status,
            steps_done=self.steps_done,
            total_steps=plan.steps,
            resumed=plan.resumed,
            duration_ms=round((time.monotonic() - self.started) * 1000),
            rewards=tuple(self.rewards),
            validations=tuple(self.validations),
            checkpoints=tuple(self.rundir.list_checkpoints()),
            warmup_steps=self.warmup_steps,
            plot_path=plot,
            warnings=tuple(self.warnings),
            error=error,
            error_message=error_message,
        )

    def _train(self) -> str:
        """Train the run's steps; returns its status."""
        plan, config, rundir = self.plan, self.plan.config, self.rundir
        engine.quiet()
        engine.set_threads(plan.options.torch_threads)
        device = engine.resolve_device(plan.options.device)
        report_to: list[str] = []  # report_to's trackers record the run's events (.reporting)
        training = config.training
        orphan = rundir.reap_orphan()
        if orphan is not None:
            self.stage(
                f"stopped the rollout server (pid {orphan}) a killed invocation left running"
            )
        upstream = TrainingUpstream(
            temperature=config.sampling.rollout_temperature,
            top_p=config.sampling.rollout_top_p,
            max_tokens=training.max_response_length,
        )
        bridge = self._bridge(upstream)
        self.journal.add_secrets(*bridge.secrets)
        starting = Background(bridge.start)
        try:
            self._prepare_model(device)
            starting.wait()
            where = (
                f"rollout servers reachable: {len(bridge.servers)}"
                if bridge.servers
                else f"rollout server healthy on port {bridge.port}"
            )
            self.stage(f"{where} ({bridge.generation} protocol)")
            if self.stop.requested:
                return "interrupted"
            return self._reinforce(bridge, upstream, device, report_to)
        finally:
            starting.wait(raise_error=False)
            bridge.close()
            rundir.forget_server()

    def _bridge(self, upstream: TrainingUpstream) -> RolloutBridge:
        plan, config, rundir = self.plan, self.plan.config, self.rundir
        assert config.rollout_dir is not None and config.entrypoint_path is not None
        self.stage(
            f"starting rollout server ({config.entrypoint_path.name}) and controller on 127.0.0.1"
        )
        return RolloutBridge(
            rollout_dir=config.rollout_dir,
            entrypoint=config.entrypoint_path,
            artifact_root=rundir.rollouts,
            upstream=upstream,
            env=self.server_env(),
            port=plan.options.rollout_port,
            on_output=self._server_output,
            on_spawn=rundir.record_server,
        )

    def step_deadline_s(self) -> float:
        """The trainer step deadline (``OSMOSIS_TRAIN_STEP_TIMEOUT_S``)."""
        return TRAIN_STEP.seconds()

    def server_env(self) -> dict[str, str]:
        """The environment the rollout server gets on top of its own."""
        return {TRAJECTORIES_ENV: "0", **self.plan.config.env, **self.plan.secrets}

    def _resume_from(self) -> Path | None:
        return self.rundir.last_resume_point() if self.plan.resumed else None

    def _prepare_model(self, device: str) -> None:
        plan, rundir = self.plan, self.rundir
        self.resume_point = self._resume_from()
        warmed = (rundir.warmup / "config.json").is_file() or (
            rundir.warmup / "adapter_config.json"
        ).is_file()
        base = str(rundir.warmup) if warmed else plan.model_ref
        self.stage(f"loading model {base}")
        self.model, self.tokenizer = engine.load_model(base, device)
        sft_steps = plan.config.warmup.sft_steps
        if warmed or sft_steps == 0 or self.resume_point is not None:
            return
        self.stage(f"warm-up: {sft_steps} supervised steps on the dataset's labels")
        model, steps, stopped = engine.warm_up(
            self.model,
            self.tokenizer,
            plan,
            device,
            emit=self.emit,
            should_stop=lambda: self.stop.requested,
        )
        self.warmup_steps = steps
        if stopped:
            return
        save_atomically(
            rundir.warmup, lambda folder: engine.save_model(model, self.tokenizer, folder)
        )
        self.journal.info("warmup", "warm-up done", steps=steps, saved=str(rundir.warmup))
        self.model, self.tokenizer = engine.load_model(str(rundir.warmup), device)

    def _reinforce(
        self, bridge: RolloutBridge, upstream: TrainingUpstream, device: str, report_to: list[str]
    ) -> str:
        from osmosis_ai.train.callbacks import RunCallback

        plan, training = self.plan, self.plan.config.training
        tokenizer = self.tokenizer
        vllm_url = plan.options.vllm_server_url
        staleness = training.max_staleness
        self._serve(self.model, upstream)
        if vllm_url is not None:  # TRL syncs the server's weights before each step's rollouts
            upstream.serve_openai(
                f"{vllm_url.rstrip('/')}/v1",
                plan.model_ref,
                lambda: int(self.trainer.state.global_step),
            )
        self.collector = self._collector(bridge, vllm=vllm_url is not None)
        if staleness and vllm_url is None and self.leads:
            self.validating = PinnedValidations(bridge, self.collector)
        if self.resume_point is not None:
            self._resume_steps(self.resume_point)
        elif plan.config.checkpoints.eval_interval > 0 and vllm_url is None and self.leads:
            self._validate(0)  # (a vLLM server holds the pre-warm-up weights until step 1)
        watch = StepWatch(self.step_deadline_s())
        self.collector.watch = watch
        callback = RunCallback(self, watch)
        args = engine.grpo_config(
            plan, self.rundir.resume_dir, device, report_to, world=self.world, sharded=self.sharded
        )
        self.trainer = engine.build_trainer(
            self.model,
            tokenizer,
            plan,
            args,
            rollout_func=self.collector,
            callbacks=[callback],
            segments=self.collector.take_segments,
        )
        if vllm_url is None and engine.served_model(self.trainer) is not self.model:
            self._serve(engine.served_model(self.trainer), upstream)
        if staleness:
            engine.correct_off_policy(self.trainer, training.importance_ratio_cap)
        overlap = f", max_staleness {staleness}" if staleness else ""
        self.stage(
            f"GRPO: {plan.steps - self.steps_done} steps ({training.loss_type}, "
            f"lr {training.lr:g}, kl {training.kl_coef:g}{overlap})"
        )
        try:
            engine.run(self.trainer, plan, self.resume_point, watch)
        except BaseException:
            self._abandon_validations()
            raise
        finally:
            self.collector.drop_ahead()
        self._finish_validations()
        stopped = callback.stopped_early
        silent = self.signal.tripped
        last = self.steps_done
        saved = any(p.name == f"step-{last:06d}" for p in self.rundir.list_checkpoints())
        if last and not saved and self.leads:
            self._export(last)
        if silent:
            return NO_LEARNING_SIGNAL
        if not stopped and plan.config.checkpoints.eval_interval > 0 and self.leads:
            self._validate(last)
        if stopped:
            self.stage(
                f"interrupted: stopped after step {last}; checkpoint saved, resume with --resume"
            )
            return "interrupted"
        return "success" if last >= plan.steps else "partial"

    def _serve(self, model: Any, upstream: TrainingUpstream) -> None:
        """Serve ``model`` as the rollouts' policy (itself, or with ``max_staleness`` a copy:
        rollouts then generate while the trainer updates, and the copy takes the new weights
        after every optimizer step, :meth:`updating`)."""
        self.policy = self._local_policy(
            copy.deepcopy(model) if self.plan.config.training.max_staleness else model
        )
        if self.plan.options.vllm_server_url is None:
            upstream.serve_local(self.policy)

    def _local_policy(self, model: Any) -> Any:
        from osmosis_ai.controller.policy import LocalPolicy

        plan, training = self.plan, self.plan.config.training
        return LocalPolicy.from_model(
            model,
            self.tokenizer,
            name=plan.model_ref,
            max_model_len=training.max_prompt_length + training.max_response_length,
            seed=training.seed,
        )

    def _resume_steps(self, resume_point: Path) -> None:
        done = int(resume_point.name.rpartition("-")[2])
        if self.leads:
            kept = self.rundir.keep_metrics_until(done)
            self.rewards = [r.get("training_reward") for r in kept]
        self.steps_done = done
        with self.updating(done):
            pass  # the served policy's version continues from the checkpoint's step
        self.stage(f"resuming after step {done} ({resume_point.name})")

    def _collector(self, bridge: RolloutBridge, *, vllm: bool) -> RolloutCollector:
        plan, training = self.plan, self.plan.config.training
        staleness = training.max_staleness
        return RolloutCollector(
            bridge,
            plan.rows,
            fallback_prompt=lambda row: self.policy.encode(
                self.policy.render(row.initial_messages)
            ),
            stop_id=int(self.tokenizer.eos_token_id),
            agent_timeout_sec=training.agent_workflow_timeout_s,
            grader_timeout_sec=training.grader_timeout_s,
            max_response_length=training.max_response_length,
            group_size=plan.group,
            strict=plan.options.strict_token_chain,
            on_failure=lambda rollout_id, reason: self.journal.warning(
                "rollout", reason, rollout_id=rollout_id
            ),
            next_rows=self._next_rows if self.dispatch_ahead and (not vllm or staleness) else None,
            sampler_logprobs=vllm or staleness > 0,
            max_staleness=staleness,
        )

    def _next_rows(self, step: int) -> list[int] | None:
        """The rows of ``step``'s prompts (each sampled ``group`` times, in TRL's order) when
        its rollouts may be dispatched while the previous step updates: not past the last
        step, not across a stop request, nor (training synchronously, the next step's calls
        held) across a validation."""
        plan, interval = self.plan, self.plan.config.checkpoints.eval_interval
        if step > plan.steps or self.stop.requested:
            return None
        if interval and (step - 1) % interval == 0 and not plan.config.training.max_staleness:
            return None
        rows = plan.order[(step - 1) * plan.batch : step * plan.batch]
        return [row for row in rows for _ in range(plan.group)]

    # -- StepHooks (called by the trainer's callback) ---------------------------------------

    def updating(self, version: int) -> contextlib.AbstractContextManager[None]:
        if self.policy is None or self.plan.options.vllm_server_url is not None:
            return contextlib.nullcontext()
        if self.plan.config.training.max_staleness:
            return self._synced(version)
        return self.policy.updating(version)

    @contextlib.contextmanager
    def _synced(self, version: int) -> Generator[None]:
        """The optimizer step runs while rollouts generate on the policy's copy; then the
        copy takes the weights it trained (the trainable ones: all, or LoRA's adapters) and
        becomes ``version``, between two generation batches."""
        yield
        trained: list[tuple[str, Any]] = []
        if self.trainer is not None:
            served = engine.served_model(self.trainer)
            trained = [(n, p.detach()) for n, p in served.named_parameters() if p.requires_grad]
        self.policy.update_weights(trained, version)

    def after_step(self, step: int) -> bool:
        self.steps_done = step
        checkpoints = self.plan.config.checkpoints
        if not self.leads:
            return self.stop.requested
        if (
            checkpoints.eval_interval
            and step % checkpoints.eval_interval == 0
            and step < self.plan.steps
        ):
            if self.validating is not None:
                self._launch_validation(step)
            else:
                self.pending_validation = self._validate(step)
        if checkpoints.checkpoint_save_freq and step % checkpoints.checkpoint_save_freq == 0:
            self._export(step)
        return self.stop.requested

    def record_step(self, step: int, logs: dict[str, Any]) -> bool:
        """Record the step (the lead only); ``True`` when the run has had no learning signal
        for its patience: every worker decides alike (their step stats are summed), so all
        stop after the same step."""
        stats: StepStats | None = self.collector.last if self.collector else None
        silent = self.signal.observe(
            step,
            groups=stats.groups if stats is not None else 0,
            groups_without_signal=stats.groups_without_signal if stats is not None else 0,
            grad_norm=logs.get("grad_norm"),
            reward=logs.get("reward"),
        )
        if not self.leads:
            return self.signal.tripped
        record: dict[str, Any] = {"step": step, "time": iso_utc()}
        for source, name in METRIC_NAMES.items():
            if source in logs:
                record[name] = logs[source]
        if stats is not None:
            record.update(stats.to_metrics())
        record["steps_without_signal"] = self.signal.streak
        if silent and not self.signal.tripped:
            patience = self.signal.patience
            limit = (
                f"; the run fails after {patience} such steps in a row "
                "([training] no_signal_patience)"
                if patience
                else ""
            )
            self.warn_once(
                "NO_SIGNAL",
                f"step {step}: no learning signal (every group's rewards are equal, or the "
                f"gradients are zero), so the update changes nothing. Expected early with a weak "
                f"policy; if it persists, warm up with [warmup] sft_steps, or give the grader "
                f"partial credit{limit}",
            )
        validation, self.pending_validation = self.pending_validation, None
        if self.validating is not None:  # those done by now, the latest in this record
            for validation in self.validating.collect():
                self._validated(validation)
        if validation is not None:
            record["validation_reward"] = validation.mean_reward
            record["validation_pass_rate"] = validation.pass_rate
            if validation.policy_version is not None:
                record["validation_policy_version"] = validation.policy_version
        self.rundir.append_metrics(record)
        self.rewards.append(record.get("training_reward"))
        self.emit(StepEvent(step, self.plan.steps, record, time.monotonic() - self.started))
        if self.signal.tripped:
            self.stage(
                f"no learning signal for {self.signal.streak} steps in a row: stopping after "
                f"step {step}, saving"
            )
        return self.signal.tripped

    def warn_once(self, code: str, message: str) -> None:
        if code in self._warned:
            self.journal.warning("run", message, code=code)
            return
        self._warned.add(code)
        self.warn(code, message)

    # -- helpers ---------------------------------------------------------------------------

    def _on_stop_request(self, signum: int) -> None:
        self.journal.warning(
            "signal", "stop requested: finishing the step, then saving", signal=signum
        )

    def _validate(self, step: int) -> EvalSummary:
        assert self.collector is not None
        plan = self.plan
        summary = self.collector.evaluate(plan.eval_indices, plan.options.eval_samples, step)
        self._validated(summary)
        return summary

    def _validated(self, summary: EvalSummary) -> None:
        self.validations.append(summary)
        self.journal.info("validation", "validation done", **summary.to_json())
        self.emit(ValidationEvent(summary))

    def _launch_validation(self, step: int) -> None:
        """Validate ``step`` beside training: a copy of the served policy, pinned at the
        version it has now (``step``'s, just synced), answers the validation rollouts."""
        assert self.validating is not None
        plan, version = self.plan, self.policy.version
        pinned = self._local_policy(copy.deepcopy(self.policy.model))
        pinned.update_weights([], version)
        self.validating.launch(step, pinned, plan.eval_indices, plan.options.eval_samples)
        self.journal.info(
            "validation", "validation started beside training", step=step, policy_version=version
        )

    def _finish_validations(self) -> None:
        """Wait for the validations still running beside training (each wait bounded by
        the rollout I/O stall deadline) and report them."""
        if self.validating is not None:
            for summary in self.validating.collect(wait=True):
                self._validated(summary)

    def _abandon_validations(self) -> None:
        if self.validating is None:
            return
        with contextlib.suppress(Exception):  # the run's own failure is the one to report
            dropped = self.validating.abandon()
            if dropped:
                self.journal.warning(
                    "validation", "validations running beside training abandoned", count=dropped
                )

    def _export(self, step: int) -> None:
        trainer, tokenizer = self.trainer, self.tokenizer
        path = self.rundir.export(
            f"step-{step:06d}",
            lambda folder: engine.save_model(
                trainer.model, tokenizer, folder, base_ref=self.plan.model_ref
            ),
        )
        self.journal.info("checkpoint", "saved a checkpoint", step=step, path=str(path))
