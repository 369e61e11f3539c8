"""The OpenAI-compatible endpoint of deployed models: ``POST /v1/chat/completions``,
``POST /v1/completions`` and ``GET /v1/models``.

Callers send ``Authorization: Bearer`` with a platform API token (they reach the deployed
models of the workspaces they belong to) or a workspace's serving key
(:func:`~osmosis_ai.platform.services.deployments.workspace_serving_key`, what managed runs
use). ``model`` names the deployed LoRA model; the request goes as is to that deployment's
model server (:mod:`osmosis_ai.platform.serving`), started first if it is not up, and its
answer, streamed (SSE) or not, comes back as is. Errors are OpenAI-style
(``{"error": {"message", "type", "code"}}``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from sqlalchemy import select
from starlette.background import BackgroundTask

from osmosis_ai.errors import OsmosisError
from osmosis_ai.platform.api.deps import Platform, authenticated, bearer_token, current_platform
from osmosis_ai.platform.errors import AuthenticationError, NotFoundError, PlatformError
from osmosis_ai.platform.services import deployments
from osmosis_ai.platform.store.orm import Membership, Model

router = APIRouter(tags=["inference"])

MANAGER_KEY = "deployment_manager"
CLIENT_KEY = "inference_client"
MAX_REQUEST_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class _Caller:
    user_id: str | None = None  # a platform token's user
    workspace_id: str | None = None  # a serving key's workspace


class _OpenAIError(OsmosisError):
    def __init__(self, status: int, message: str, kind: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.code = status, kind, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": str(self), "type": self.kind, "code": self.code}}
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(body, status_code=self.status, headers=headers)


def _from_platform(error: PlatformError) -> _OpenAIError:
    kinds = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
    kind = kinds.get(error.status_code, "server_error" if error.status_code >= 500 else "")
    return _OpenAIError(
        error.status_code, error.message, kind or "invalid_request_error", error.code
    )


# -- the deployment manager of this app ---------------------------------------------------


async def start_serving(platform: Platform) -> object:
    """Make and start the app's deployment manager (model servers of deployed models)."""
    manager = platform.extras.get(MANAGER_KEY)
    if manager is None:
        from osmosis_ai.platform.api.objects import object_store
        from osmosis_ai.platform.serving import DeploymentManager

        manager = DeploymentManager(platform.settings, platform.database, object_store(platform))
        platform.extras[MANAGER_KEY] = manager
        platform.extras[deployments.CHANGED_HOOK] = manager.changed
        await manager.start()
    return manager


async def stop_serving(platform: Platform) -> None:
    """Stop every model server and the client that forwards to them."""
    from osmosis_ai.platform.serving import DeploymentManager

    platform.extras.pop(deployments.CHANGED_HOOK, None)
    manager = platform.extras.pop(MANAGER_KEY, None)
    if isinstance(manager, DeploymentManager):
        await manager.close()
    client = platform.extras.pop(CLIENT_KEY, None)
    import httpx

    if isinstance(client, httpx.AsyncClient):
        await client.aclose()


def _client(platform: Platform) -> object:
    import httpx

    client = platform.extras.get(CLIENT_KEY)
    if not isinstance(client, httpx.AsyncClient):
        timeout = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        client = platform.extras[CLIENT_KEY] = httpx.AsyncClient(timeout=timeout, limits=limits)
    return client


# -- who is asking --------------------------------------------------------------------------


async def _caller(request: Request, platform: Platform) -> _Caller:
    raw = bearer_token(request)
    if raw is not None and raw.startswith(deployments.SERVING_KEY_PREFIX):
        from starlette.concurrency import run_in_threadpool

        workspace = await run_in_threadpool(
            deployments.serving_key_workspace, platform.settings.key_dir, raw
        )
        if workspace is None:
            raise AuthenticationError("The serving key is not valid on this platform.")
        return _Caller(workspace_id=workspace)
    principal = await authenticated(request, platform)
    return _Caller(user_id=principal.user_id)


@dataclass(frozen=True)
class _Served:
    id: str
    name: str
    base_model: str | None
    created: int


def _visible(platform: Platform, caller: _Caller, name: str | None) -> list[_Served]:
    """Deployed models the caller may reach (only ``name`` when given)."""
    with platform.read() as session:
        query = select(Model).where(
            Model.kind == "lora", Model.deployment_status == deployments.ACTIVE
        )
        if name is not None:
            query = query.where(Model.name == name)
        if caller.workspace_id is not None:
            query = query.where(Model.workspace_id == caller.workspace_id)
        else:
            member = select(Membership.workspace_id).where(Membership.user_id == caller.user_id)
            query = query.where(Model.workspace_id.in_(member))
        return [
            _Served(
                m.id, deployments.inference_model(m), m.base_model, int(m.created_at.timestamp())
            )
            for m in session.scalars(query.order_by(Model.name))
        ]


def _not_deployed(name: str) -> _OpenAIError:
    return _OpenAIError(
        404,
        f"The model {name!r} does not exist or is not deployed in a workspace you can reach. "
        f"Deploy it with: osmosis model deploy {name} (osmosis model list --type lora shows "
        "the LoRA models and their deployment status).",
        "not_found_error",
        "model_not_found",
    )


# -- routes ------------------------------------------------------------------------------------


@router.get("/v1/models", include_in_schema=False)
async def list_models(request: Request) -> Response:
    platform = await current_platform(request)
    try:
        caller = await _caller(request, platform)
    except PlatformError as exc:
        return _from_platform(exc).response()
    from starlette.concurrency import run_in_threadpool

    models = await run_in_threadpool(_visible, platform, caller, None)
    data = [
        {
            "id": m.name,
            "object": "model",
            "created": m.created,
            "owned_by": "osmosis",
            "root": m.base_model,
        }
        for m in models
    ]
    return JSONResponse({"object": "list", "data": data})


@router.post("/v1/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    return await _forward(request, "chat/completions")


@router.post("/v1/completions", include_in_schema=False)
async def completions(request: Request) -> Response:
    return await _forward(request, "completions")


async def _forward(request: Request, route: str) -> Response:
    platform = await current_platform(request)
    try:
        return await _forward_checked(request, platform, route)
    except _OpenAIError as exc:
        return exc.response()
    except PlatformError as exc:
        return _from_platform(exc).response()


async def _forward_checked(request: Request, platform: Platform, route: str) -> Response:
    import httpx
    from starlette.concurrency import run_in_threadpool

    from osmosis_ai.platform.serving import DeploymentManager

    caller = await _caller(request, platform)
    body = await request.body()
    if len(body) > MAX_REQUEST_BYTES:
        raise _OpenAIError(
            413, f"request body is over {MAX_REQUEST_BYTES} bytes", "invalid_request_error"
        )
    try:
        parsed: object = json.loads(body)
    except ValueError as exc:
        raise _OpenAIError(
            400, f"request body is not valid JSON: {exc}", "invalid_request_error"
        ) from exc
    name = parsed.get("model") if isinstance(parsed, dict) else None  # pyright: ignore[reportUnknownMemberType]
    if not isinstance(name, str) or not name:
        raise _OpenAIError(
            400,
            'the request names no model: set "model" to a deployed LoRA model\'s name '
            "(osmosis model list --type lora)",
            "invalid_request_error",
            "model_required",
        )
    found = await run_in_threadpool(_visible, platform, caller, name)
    if not found:
        raise _not_deployed(name)
    manager = await start_serving(platform)
    assert isinstance(manager, DeploymentManager)
    try:
        base_url = await manager.endpoint(found[0].id)
    except NotFoundError:
        raise _not_deployed(name) from None
    client = _client(platform)
    assert isinstance(client, httpx.AsyncClient)
    upstream = client.build_request(
        "POST",
        f"{base_url}/{route}",
        content=body,
        headers={
            "content-type": "application/json",
            "accept": request.headers.get("accept", "*/*"),
        },
    )
    try:
        answer = await client.send(upstream, stream=True)
    except httpx.HTTPError as exc:
        manager.changed()  # a server that died is started again
        raise _OpenAIError(
            502,
            f"the server of model {name!r} did not answer: {exc}",
            "server_error",
            "upstream_unavailable",
        ) from exc
    headers = {
        k: v
        for k, v in answer.headers.items()
        if k.lower() in ("content-type", "cache-control", "x-accel-buffering")
    }
    return StreamingResponse(
        answer.aiter_raw(),
        status_code=answer.status_code,
        headers=headers,
        background=BackgroundTask(answer.aclose),
    )
