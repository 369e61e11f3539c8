"""The deployment manager: one model server per deployed LoRA model, run beside the platform.

The platform server (``osmosis platform serve``) owns one :class:`DeploymentManager`. For
each deployed model (``deployment_status = 'active'``) it

* materializes the checkpoint: the files under its object-store prefix
  (``runs/<run>/checkpoints/step-<N>/``) are copied, whole or not at all, into
  ``<data dir>/deployments/<model id>/checkpoint/`` (kept while the source is unchanged);
* starts a model server on 127.0.0.1: the local policy server
  (:mod:`osmosis_ai.controller.policy`, torch on CPU, or on ``cuda`` when
  ``OSMOSIS_PLATFORM_SERVING_DEVICE`` says so), or vLLM (:func:`choose_engine`: a GPU and
  the ``vllm`` package, or ``OSMOSIS_PLATFORM_SERVING_ENGINE=vllm``); its log is
  ``<data dir>/deployments/<model id>/server.log``;
* stops it when the model is undeployed, and stops them all when the platform stops.

Servers start at deploy (in the background) and, for a deployment whose server is not up
(a crash, a restart of the platform), on the first request for it. When the platform
starts, :meth:`DeploymentManager.start` starts a server for every model still deployed.
A local policy server exits by itself when the platform dies (its stdin closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sqlalchemy.orm import Session

from osmosis_ai.platform.errors import NotFoundError, PlatformError
from osmosis_ai.platform.objects import ObjectStore
from osmosis_ai.platform.services import deployments
from osmosis_ai.platform.services.models import PlatformModelNotFoundError, get_base_model
from osmosis_ai.platform.settings import PlatformSettings
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import Model
from osmosis_ai.procs import free_port, stop_process_async

Engine = Literal["local", "vllm"]
ENGINE_ENV = "OSMOSIS_PLATFORM_SERVING_ENGINE"  # auto (default) | local | vllm
DEVICE_ENV = "OSMOSIS_PLATFORM_SERVING_DEVICE"  # the local engine's torch device (cpu)
THREADS_ENV = "OSMOSIS_PLATFORM_SERVING_THREADS"  # the local engine's torch threads
DEPLOYMENTS_DIR = "deployments"
DEFAULT_START_TIMEOUT_S = 900.0
STOP_GRACE_S = 10.0
_SOURCE_FILE = "source.json"


class ModelServerError(PlatformError):
    """A deployed model's server could not start."""

    status_code = 503
    default_code = "MODEL_SERVER_UNAVAILABLE"


def gpu_present() -> bool:
    """Whether this machine shows an NVIDIA GPU (a device node, or the driver's listing)."""
    if Path("/dev/nvidia0").exists():
        return True
    listing = Path("/proc/driver/nvidia/gpus")
    return listing.is_dir() and any(listing.iterdir())


def choose_engine(environ: Mapping[str, str] | None = None) -> Engine:
    """``local`` or ``vllm``: as ``OSMOSIS_PLATFORM_SERVING_ENGINE`` says, else vLLM when a
    GPU is present and the ``vllm`` package is installed, else the local policy server."""
    env = os.environ if environ is None else environ
    wanted = env.get(ENGINE_ENV, "auto").strip().lower() or "auto"
    if wanted in ("local", "vllm"):
        return "vllm" if wanted == "vllm" else "local"
    if wanted != "auto":
        raise ModelServerError(
            f"{ENGINE_ENV}={wanted!r} is not an engine: use auto, local or vllm.",
            code="SERVING_ENGINE_INVALID",
        )
    has_vllm = importlib.util.find_spec("vllm") is not None
    return "vllm" if has_vllm and gpu_present() else "local"


@dataclass(frozen=True)
class DeploymentSpec:
    """What to serve for one deployed model, read from the database."""

    model_id: str
    name: str
    workspace_id: str
    source: deployments.CheckpointSource
    base_dir: Path | None  # the registered base model's folder, when it has one


@dataclass(eq=False)
class ModelServer:
    """A running model server of one deployment."""

    spec: DeploymentSpec
    process: asyncio.subprocess.Process
    base_url: str  # http://127.0.0.1:PORT/v1
    drains: list[asyncio.Task[None]] = field(default_factory=list[asyncio.Task[None]])

    @property
    def alive(self) -> bool:
        return self.process.returncode is None


def deployment_spec(session: Session, model: Model) -> DeploymentSpec:
    """What serving LoRA model ``model`` takes: its checkpoint, and its base model's folder
    when the base is registered on this platform."""
    source = deployments.checkpoint_source(session, model)
    base: Path | None = None
    if model.base_model and model.workspace_id:
        try:
            base = Path(get_base_model(session, model.workspace_id, model.base_model).path)
        except PlatformModelNotFoundError:  # trained from a folder (model_path local:<dir>) instead
            named = Path(model.base_model.removeprefix("local:")).expanduser()
            base = named if named.is_absolute() and named.is_dir() else None
    return DeploymentSpec(
        model_id=model.id,
        name=deployments.inference_model(model),
        workspace_id=model.workspace_id or "",
        source=source,
        base_dir=base,
    )


class DeploymentManager:
    """Starts, finds and stops the model servers of deployed models (one asyncio loop)."""

    def __init__(
        self,
        settings: PlatformSettings,
        database: Database,
        objects: ObjectStore,
        *,
        environ: Mapping[str, str] | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        self.database = database
        self.objects = objects
        self.environ = dict(os.environ if environ is None else environ)
        self.start_timeout_s = start_timeout_s
        self.root = settings.data_dir / DEPLOYMENTS_DIR
        self._servers: dict[str, ModelServer] = {}
        self._starting: dict[str, asyncio.Task[ModelServer]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reconciling: asyncio.Task[None] | None = None
        self._again = False
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Bind to the running loop and start a server for every model still deployed."""
        self._loop = asyncio.get_running_loop()
        self.changed()

    async def close(self) -> None:
        """Stop every model server (the platform is stopping)."""
        self._closed = True
        if self._reconciling is not None:
            self._reconciling.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reconciling
        for task in list(self._starting.values()):
            task.cancel()
        for task in list(self._starting.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._starting.clear()
        servers = list(self._servers.values())
        self._servers.clear()
        await asyncio.gather(*(self._stop(s) for s in servers), return_exceptions=True)

    def changed(self) -> None:
        """A deployment changed: start and stop servers to match (callable from any thread)."""
        loop = self._loop
        if loop is None or self._closed:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._schedule()
        else:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(self._schedule)

    def _schedule(self) -> None:
        if self._closed:
            return
        if self._reconciling is not None and not self._reconciling.done():
            self._again = True
            return
        self._reconciling = asyncio.create_task(self._reconcile_loop())

    async def _reconcile_loop(self) -> None:
        while True:
            self._again = False
            try:
                await self.reconcile()
            except Exception as exc:  # logged; the next change or request tries again
                self._log_platform(f"reconciling deployments failed: {exc}")
            if not self._again:
                return

    async def reconcile(self) -> None:
        """Stop servers of models no longer deployed; start (in the background) the rest."""
        specs = await asyncio.to_thread(self._active_specs)
        wanted = {s.model_id: s for s in specs}
        for model_id in [m for m in self._servers if m not in wanted]:
            await self._stop(self._servers.pop(model_id))
        for model_id in [m for m in self._starting if m not in wanted]:
            self._starting.pop(model_id).cancel()
        for spec in specs:
            server = self._servers.get(spec.model_id)
            if (server is None or not server.alive) and spec.model_id not in self._starting:
                self._begin(spec)

    # -- finding a server ----------------------------------------------------------------

    async def endpoint(self, model_id: str) -> str:
        """The base URL of deployed model ``model_id``'s server, starting it if it is not up."""
        server = self._servers.get(model_id)
        if server is not None and server.alive:
            return server.base_url
        task = self._starting.get(model_id)
        if task is None:
            spec = await asyncio.to_thread(self._spec, model_id)
            task = self._begin(spec)
        return (await asyncio.shield(task)).base_url

    def running(self) -> dict[str, str]:
        """Model id → base URL of every live server."""
        return {m: s.base_url for m, s in self._servers.items() if s.alive}

    def _begin(self, spec: DeploymentSpec) -> asyncio.Task[ModelServer]:
        task = asyncio.create_task(self._launch(spec), name=f"deploy-{spec.name}")
        self._starting[spec.model_id] = task

        def done(finished: asyncio.Task[ModelServer]) -> None:
            if self._starting.get(spec.model_id) is finished:
                del self._starting[spec.model_id]
            if not finished.cancelled() and finished.exception() is not None:
                self._log(spec, f"could not start: {finished.exception()}")

        task.add_done_callback(done)
        return task

    # -- the database side ---------------------------------------------------------------

    def _active_specs(self) -> list[DeploymentSpec]:
        with self.database.read() as session:
            models = deployments.active_models(session)
            specs: list[DeploymentSpec] = []
            for model in models:
                try:
                    specs.append(deployment_spec(session, model))
                except PlatformError as exc:
                    self._log_platform(f"deployment {model.name}: {exc}")
            return specs

    def _spec(self, model_id: str) -> DeploymentSpec:
        with self.database.read() as session:
            model = session.get(Model, model_id)
            if model is None or not deployments.is_active(model):
                raise NotFoundError(f"model {model_id!r} is not deployed")
            return deployment_spec(session, model)

    # -- materializing -------------------------------------------------------------------

    def folder(self, model_id: str) -> Path:
        return self.root / model_id

    def materialize(self, spec: DeploymentSpec) -> Path:
        """The checkpoint folder to serve: a local source as is, an object-store one copied
        into ``<data dir>/deployments/<model id>/checkpoint`` (reused while unchanged)."""
        if spec.source.folder is not None:
            return spec.source.folder
        prefix = spec.source.object_prefix
        assert prefix is not None
        objects = self.objects.list(prefix)
        if not objects:
            raise ModelServerError(
                f"Model {spec.name!r}: no checkpoint files under objects/{prefix}; the "
                "training run did not upload that checkpoint (see osmosis train info).",
                code="CHECKPOINT_MISSING",
            )
        folder = self.folder(spec.model_id)
        target = folder / "checkpoint"
        stamp = json.dumps(
            {"prefix": prefix, "files": [[o.key, o.size, o.modified_at] for o in objects]},
            sort_keys=True,
        )
        record = folder / _SOURCE_FILE
        with contextlib.suppress(OSError):
            if target.is_dir() and record.read_text() == stamp:
                return target
        folder.mkdir(parents=True, exist_ok=True)
        temp = folder / f".checkpoint.{os.getpid()}"
        shutil.rmtree(temp, ignore_errors=True)
        base = prefix.rstrip("/") + "/"
        for info in objects:
            relative = info.key.removeprefix(base)
            destination = temp / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.objects.path(info.key), destination)
        shutil.rmtree(target, ignore_errors=True)
        temp.rename(target)
        record.write_text(stamp)
        return target

    # -- processes -----------------------------------------------------------------------

    def prepare(self, spec: DeploymentSpec) -> tuple[Path, bool, Path | None]:
        """The checkpoint folder, whether it is a LoRA adapter, and the base model folder
        (the registered one, else the one the adapter names when it exists here)."""
        from osmosis_ai.controller.policy.adapter import adapter_base, is_adapter

        checkpoint = self.materialize(spec)
        adapter = is_adapter(checkpoint)
        base = spec.base_dir
        if adapter and base is None:
            named = adapter_base(checkpoint)
            if named is not None and Path(named).is_dir():
                base = Path(named)
        self.folder(spec.model_id).mkdir(parents=True, exist_ok=True)
        return checkpoint, adapter, base

    async def _launch(self, spec: DeploymentSpec) -> ModelServer:
        checkpoint, adapter, base = await asyncio.to_thread(self.prepare, spec)
        engine = choose_engine(self.environ)
        log = await asyncio.to_thread(open, self.folder(spec.model_id) / "server.log", "ab")
        try:
            if engine == "vllm":
                server = await self._start_vllm(spec, checkpoint, base, adapter, log)
            else:
                server = await self._start_local(spec, checkpoint, base, log)
        finally:
            log.close()
        old = self._servers.pop(spec.model_id, None)
        if old is not None:
            await self._stop(old)
        self._servers[spec.model_id] = server
        self._log(spec, f"serving at {server.base_url} ({engine})")
        return server

    def _child_env(self) -> dict[str, str]:
        env = dict(self.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        return env

    async def _start_local(
        self, spec: DeploymentSpec, checkpoint: Path, base: Path | None, log: object
    ) -> ModelServer:
        argv = [
            sys.executable,
            "-m",
            "osmosis_ai.controller.policy",
            str(checkpoint),
            "--exit-on-stdin-eof",
            "--name",
            spec.name,
            "--device",
            self.environ.get(DEVICE_ENV, "cpu") or "cpu",
        ]
        if base is not None:
            argv += ["--base", str(base)]
        threads = self.environ.get(THREADS_ENV, "").strip()
        if threads:
            argv += ["--threads", threads]
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,  # pyright: ignore[reportArgumentType]
            env=self._child_env(),
            start_new_session=True,
        )
        try:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), self.start_timeout_s)
            url = line.decode("utf-8", "replace").strip()
            if not url.startswith("http://127.0.0.1:"):
                await process.wait()
                raise self._failed(spec, process.returncode)
        except BaseException:
            await _terminate(process)
            raise
        server = ModelServer(spec, process, url)
        server.drains.append(asyncio.create_task(_drain(process.stdout)))
        return server

    async def _start_vllm(
        self, spec: DeploymentSpec, checkpoint: Path, base: Path | None, adapter: bool, log: object
    ) -> ModelServer:
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        if adapter:
            if base is None:
                raise ModelServerError(
                    f"Model {spec.name!r} is a LoRA adapter whose base model is not "
                    "registered here: add it with osmosis platform model add NAME --path DIR.",
                    code="BASE_MODEL_MISSING",
                )
            argv += ["--model", str(base), "--enable-lora"]
            argv += ["--lora-modules", f"{spec.name}={checkpoint}"]
        else:
            argv += ["--model", str(checkpoint), "--served-model-name", spec.name]
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,  # pyright: ignore[reportArgumentType]
            stderr=asyncio.subprocess.STDOUT,
            env=self._child_env(),
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}/v1"
        try:
            await asyncio.wait_for(_wait_ready(process, url), self.start_timeout_s)
        except BaseException:
            await _terminate(process)
            raise
        if process.returncode is not None:
            raise self._failed(spec, process.returncode)
        return ModelServer(spec, process, url)

    def _failed(self, spec: DeploymentSpec, code: int | None) -> ModelServerError:
        log = self.folder(spec.model_id) / "server.log"
        tail = ""
        with contextlib.suppress(OSError):
            tail = log.read_text(errors="replace")[-1500:].strip()
        return ModelServerError(
            f"The server of model {spec.name!r} exited (code {code}) before it listened; "
            f"see {log}" + (f":\n{tail}" if tail else ""),
            details={"log": str(log)},
        )

    async def _stop(self, server: ModelServer) -> None:
        await _terminate(server.process)
        for task in server.drains:
            task.cancel()
        self._log(server.spec, "stopped")

    # -- logs ----------------------------------------------------------------------------

    def _log(self, spec: DeploymentSpec, message: str) -> None:
        folder = self.folder(spec.model_id)
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            with (folder / "manager.log").open("a") as out:
                out.write(message + "\n")

    def _log_platform(self, message: str) -> None:
        with contextlib.suppress(OSError):
            self.root.mkdir(parents=True, exist_ok=True)
            with (self.root / "manager.log").open("a") as out:
                out.write(message + "\n")


async def _terminate(process: asyncio.subprocess.Process, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the server: its stdin closed (how the policy server learns its platform is gone)
    and its process group stopped (:func:`~osmosis_ai.procs.stop_process_async`)."""
    if process.stdin is not None:
        process.stdin.close()
    await stop_process_async(process, grace_s)


async def _drain(stream: asyncio.StreamReader | None) -> None:
    if stream is None:
        return
    while await stream.read(65536):
        pass


async def _wait_ready(process: asyncio.subprocess.Process, url: str) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=5.0) as client:
        while process.returncode is None:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{url}/models")).status_code == 200:
                    return
            await asyncio.sleep(1.0)
