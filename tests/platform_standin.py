"""A small in-memory platform speaking the ``/api/cli/*`` shapes of reference §6.

The CLI's unit tests drive it over real HTTP (uvicorn on 127.0.0.1): it checks tokens and
the ``X-Osmosis-Git`` scope, stores dataset bytes behind presigned-style URLs (simple PUT
or numbered parts with ETags), keeps secrets write-only, and records every request so
tests can look at headers and bodies. Knobs: ``multipart_part_size`` forces multipart,
``fail`` queues error answers for a path (``PUT /objects/*``: any upload), ``version_signal`` adds the version headers.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

NOW = "2030-01-01T12:00:00Z"
EXPIRES = "2099-01-01T00:00:00Z"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class StandIn:
    url: str = ""  # set once served; presigned URLs point back here
    tokens: dict[str, dict[str, Any]] = field(default_factory=dict)
    workspaces: dict[str, dict[str, Any]] = field(default_factory=dict)  # identity -> workspace
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> record
    objects: dict[str, bytes] = field(default_factory=dict)
    parts: dict[str, dict[int, bytes]] = field(default_factory=lambda: defaultdict(dict))
    secrets: list[dict[str, Any]] = field(default_factory=list)
    secret_values: dict[tuple[str, str], str] = field(default_factory=dict)
    base_models: list[dict[str, Any]] = field(default_factory=list)
    lora_models: list[dict[str, Any]] = field(default_factory=list)
    rollouts: list[dict[str, Any]] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    fail: dict[str, list[tuple[int, dict[str, Any]]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    multipart_part_size: int | None = None
    version_signal: tuple[str, str] | None = None
    device_pending: list[str] = field(default_factory=list)  # poll answers before the grant
    run_routes: bool = True
    aborted: list[str] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # --- setup helpers ------------------------------------------------------------------------

    def add_token(self, email: str = "ada@example.com", name: str = "Ada") -> str:
        token = f"osm_{secrets.token_hex(8)}"
        self.tokens[token] = {
            "id": f"tok_{next(self._ids)}",
            "user": {"id": f"u_{email}", "email": email, "name": name},
            "expires_at": EXPIRES,
            "revoked": False,
        }
        return token

    def add_workspace(self, identity: str, name: str = "demo", role: str = "owner") -> None:
        self.workspaces[identity] = {"id": f"ws_{next(self._ids)}", "name": name, "role": role}

    def token_id(self, token: str) -> str:
        return self.tokens[token]["id"]

    def of(self, method: str, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path == path]

    # --- the app ------------------------------------------------------------------------------

    def app(self) -> Starlette:
        routes = [
            Route("/api/cli/verify", self.verify),
            Route("/api/cli/device/authorize", self.device_authorize, methods=["POST"]),
            Route("/api/cli/device/token", self.device_token, methods=["POST"]),
            Route("/api/cli/tokens/{token_id}", self.revoke, methods=["DELETE"]),
            Route("/api/cli/datasets", self.datasets_route, methods=["GET", "POST"]),
            Route("/api/cli/datasets/{ref}", self.dataset_get),
            Route("/api/cli/datasets/{ref}/complete", self.dataset_complete, methods=["POST"]),
            Route("/api/cli/datasets/{ref}/abort", self.dataset_abort, methods=["POST"]),
            Route("/api/cli/datasets/{ref}/download", self.dataset_download),
            Route("/api/cli/datasets/{ref}/logs", self.dataset_logs),
            Route("/objects/{key:path}", self.object_route, methods=["GET", "PUT"]),
            Route(
                "/api/cli/environment-secrets",
                self.secrets_route,
                methods=["GET", "POST", "DELETE"],
            ),
            Route("/api/cli/models/base", self.base_list),
            Route("/api/cli/models/lora", self.lora_list),
            Route("/api/cli/models/base/{name:path}", self.base_get),
            Route("/api/cli/models/{name}", self.lora_get),
            Route("/api/cli/models/{name}/{verb}", self.lora_deploy, methods=["POST"]),
            Route("/api/cli/rollouts", self.rollouts_route),
            Route("/api/cli/eval-runs", self.submit, methods=["POST"]),
            Route("/api/cli/training-runs", self.submit, methods=["POST"]),
            Route("/test/status/{status:int}", self.status_route, methods=["GET", "POST"]),
        ]
        return Starlette(routes=routes, middleware=[])

    # --- plumbing -----------------------------------------------------------------------------

    async def _record(self, request: Request) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw and not request.url.path.startswith("/objects") else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.requests.append(
            Recorded(
                request.method,
                request.url.path,
                dict(request.query_params),
                {k.lower(): v for k, v in request.headers.items()},
                body if body is not None else (len(raw) if raw else None),
            )
        )
        return body

    def _answer(self, data: Any, status: int = 200) -> Response:
        response = JSONResponse(data, status_code=status)
        if self.version_signal is not None:
            response.headers["X-Osmosis-Version-Status"] = self.version_signal[0]
            response.headers["X-Osmosis-Version-Message"] = self.version_signal[1]
        return response

    def _error(self, status: int, message: str, **extra: Any) -> Response:
        return self._answer({"error": message, "message": message, **extra}, status)

    def _injected(self, request: Request) -> Response | None:
        queue = self.fail.get(f"{request.method} {request.url.path}")
        if not queue and request.url.path.startswith("/objects/"):
            queue = self.fail.get(f"{request.method} /objects/*")
        if queue:
            status, body = queue.pop(0)
            return self._answer(body, status)
        return None

    def _caller(self, request: Request) -> dict[str, Any] | Response:
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        record = self.tokens.get(token)
        if record is None:
            return self._error(401, "Invalid token", code="TOKEN_INVALID")
        if record["revoked"]:
            return self._error(401, "Token revoked", code="TOKEN_REVOKED")
        return record

    def _workspace(self, request: Request) -> dict[str, Any] | Response:
        identity = request.headers.get("x-osmosis-git")
        if not identity:
            return self._error(400, "X-Osmosis-Git is required", code="GIT_SCOPE_REQUIRED")
        workspace = self.workspaces.get(identity)
        if workspace is None:
            return self._error(404, "Repository not connected", code="GIT_REPOSITORY_NOT_CONNECTED")
        return workspace

    async def _scoped(self, request: Request) -> tuple[Any, Response | None]:
        body = await self._record(request)
        injected = self._injected(request)
        if injected is not None:
            return body, injected
        caller = self._caller(request)
        if isinstance(caller, Response):
            return body, caller
        workspace = self._workspace(request)
        if isinstance(workspace, Response):
            return body, workspace
        return body, None

    @staticmethod
    def _page(items: list[dict[str, Any]], request: Request, key: str) -> dict[str, Any]:
        limit = int(request.query_params.get("limit", 50))
        offset = int(request.query_params.get("offset", 0))
        chunk = items[offset : offset + limit]
        more = offset + limit < len(items)
        return {
            key: chunk,
            "total_count": len(items),
            "has_more": more,
            "next_offset": offset + limit if more else None,
        }

    # --- auth ---------------------------------------------------------------------------------

    async def verify(self, request: Request) -> Response:
        await self._record(request)
        injected = self._injected(request)
        if injected is not None:
            return injected
        caller = self._caller(request)
        if isinstance(caller, Response):
            return caller
        answer: dict[str, Any] = {
            "token_id": caller["id"],
            "user": caller["user"],
            "expires_at": caller["expires_at"],
        }
        identity = request.headers.get("x-osmosis-git")
        if identity:
            workspace = self.workspaces.get(identity)
            if workspace is None:
                return self._error(404, "Not connected", code="GIT_REPOSITORY_NOT_CONNECTED")
            answer["workspace"] = workspace
        return self._answer(answer)

    async def device_authorize(self, request: Request) -> Response:
        await self._record(request)
        return self._answer(
            {
                "device_code": "dev-123",
                "user_code": "ABCD-EFGH",
                "verification_uri": f"{self.url}/device",
                "verification_uri_complete": f"{self.url}/device?code=ABCD-EFGH",
                "expires_in": 600,
                "interval": 1,
            }
        )

    async def device_token(self, request: Request) -> Response:
        body = await self._record(request)
        if body.get("device_code") != "dev-123":
            return self._answer({"error": "expired_token"}, 400)
        if self.device_pending:
            return self._answer({"error": self.device_pending.pop(0)}, 400)
        token = self.add_token("device@example.com", "Dev Ice")
        record = self.tokens[token]
        return self._answer(
            {
                "token": token,
                "token_id": record["id"],
                "user": record["user"],
                "expires_at": record["expires_at"],
            }
        )

    async def revoke(self, request: Request) -> Response:
        await self._record(request)
        caller = self._caller(request)
        if isinstance(caller, Response):
            return caller
        for record in self.tokens.values():
            if record["id"] == request.path_params["token_id"]:
                record["revoked"] = True
                return Response(status_code=204)
        return self._error(404, "No such token")

    # --- datasets -----------------------------------------------------------------------------

    def _find(self, ref: str) -> dict[str, Any] | None:
        found = self.datasets.get(ref)
        if found is not None:
            return found
        return next((d for d in self.datasets.values() if d["file_name"] == ref), None)

    async def _scoped_dataset(self, request: Request) -> tuple[Any, dict[str, Any] | Response]:
        """The request's body and the dataset its ``ref`` names, or the answer refusing it."""
        body, refused = await self._scoped(request)
        if refused is not None:
            return body, refused
        record = self._find(request.path_params["ref"])
        return body, self._error(404, "Dataset not found") if record is None else record

    async def datasets_route(self, request: Request) -> Response:
        body, refused = await self._scoped(request)
        if refused is not None:
            return refused
        if request.method == "GET":
            return self._answer(self._page(list(self.datasets.values()), request, "datasets"))
        name = body["file_name"]
        existing = self._find(name)
        if existing is not None and body.get("overwrite_dataset_id") != existing["id"]:
            return self._error(
                409,
                f"Dataset {name} exists",
                code="CONFLICT",
                details={"existing_dataset_id": existing["id"]},
            )
        if existing is not None:
            del self.datasets[existing["id"]]
        dataset_id = f"ds_{next(self._ids)}"
        size = int(body["file_size"])
        record = {
            "id": dataset_id,
            "file_name": name,
            "file_size": size,
            "status": "uploading",
            "data_preview": None,
            "file_format": body["extension"],
            "original_file_format": body["extension"],
            "row_count": None,
            "original_file_size": None,
            "creator_name": "Ada",
            "created_at": NOW,
            "updated_at": NOW,
            "platform_url": f"{self.url}/demo/datasets/{dataset_id}",
            "internal_field": "not in the CLI's record",
        }
        self.datasets[dataset_id] = record
        part = self.multipart_part_size
        if part is not None and size > part:
            total = -(-size // part)
            upload = {
                "method": "multipart",
                "part_size": part,
                "total_parts": total,
                "presigned_urls": [
                    {
                        "part_number": n,
                        "presigned_url": f"{self.url}/objects/{dataset_id}?part={n}&sig=x",
                    }
                    for n in range(1, total + 1)
                ],
            }
        else:
            upload = {
                "method": "simple",
                "presigned_url": f"{self.url}/objects/{dataset_id}?sig=x",
                "upload_headers": {"Content-Type": "application/octet-stream"},
                "expires_in": 900,
            }
        return self._answer({**record, "upload": upload}, 201)

    async def object_route(self, request: Request) -> Response:
        raw = await request.body()
        self.requests.append(
            Recorded(
                request.method,
                request.url.path,
                dict(request.query_params),
                {k.lower(): v for k, v in request.headers.items()},
                len(raw),
            )
        )
        injected = self._injected(request)
        if injected is not None:
            return injected
        key = request.path_params["key"]
        if request.method == "GET":
            data = self.objects.get(key)
            return Response(status_code=404) if data is None else Response(data)
        part = request.query_params.get("part")
        etag = hashlib.md5(raw).hexdigest()
        if part is None:
            self.objects[key] = raw
        else:
            self.parts[key][int(part)] = raw
        return Response(status_code=200, headers={"ETag": f'"{etag}"'})

    async def dataset_complete(self, request: Request) -> Response:
        body, record = await self._scoped_dataset(request)
        if isinstance(record, Response):
            return record
        key = record["id"]
        if body.get("parts"):
            stored = self.parts[key]
            for part in body["parts"]:
                data = stored.get(part["PartNumber"])
                if data is None or hashlib.md5(data).hexdigest() != part["ETag"]:
                    return self._error(400, f"Part {part['PartNumber']} does not match")
            self.objects[key] = b"".join(stored[n] for n in sorted(stored))
        if len(self.objects.get(key, b"")) != record["file_size"]:
            return self._error(400, "Size mismatch")
        lines = self.objects[key].decode().splitlines()
        record.update(
            status="uploaded",
            row_count=len(lines),
            data_preview=[json.loads(line) for line in lines if line.strip()][:10]
            if record["file_format"] == "jsonl"
            else None,
        )
        return self._answer(record)

    async def dataset_abort(self, request: Request) -> Response:
        _, record = await self._scoped_dataset(request)
        if isinstance(record, Response):
            return record
        record["status"] = "cancelled"
        self.aborted.append(record["id"])
        return self._answer({})

    async def dataset_get(self, request: Request) -> Response:
        _, record = await self._scoped_dataset(request)
        return record if isinstance(record, Response) else self._answer(record)

    async def dataset_download(self, request: Request) -> Response:
        _, record = await self._scoped_dataset(request)
        if isinstance(record, Response):
            return record
        return self._answer(
            {
                "presigned_url": f"{self.url}/objects/{record['id']}?sig=y",
                "expires_in": 900,
                "file_name": f"{record['file_name']}.{record['file_format']}",
            }
        )

    async def dataset_logs(self, request: Request) -> Response:
        _, refused = await self._scoped(request)
        if refused is not None:
            return refused
        limit = int(request.query_params.get("limit", 50))
        start = int(request.query_params.get("cursor", 0))
        chunk = self.logs[start : start + limit]
        more = start + limit < len(self.logs)
        return self._answer({"logs": chunk, "next_cursor": str(start + limit) if more else None})

    # --- secrets ------------------------------------------------------------------------------

    async def secrets_route(self, request: Request) -> Response:
        body, refused = await self._scoped(request)
        if refused is not None:
            return refused
        if request.method == "GET":
            scope = request.query_params.get("scope", "all")
            items = [s for s in self.secrets if scope in ("all", s["scope"])]
            page = self._page(items, request, "environment_secrets")
            return self._answer({**page, "platform_url": f"{self.url}/demo/secrets"})
        name, scope = body["name"], body["scope"]
        if request.method == "DELETE":
            before = len(self.secrets)
            self.secrets = [s for s in self.secrets if (s["name"], s["scope"]) != (name, scope)]
            if len(self.secrets) == before:
                return self._error(404, "Secret not found")
            return Response(status_code=204)
        if body.get("value") == "echo-me":
            return self._error(400, f"Value {body['value']} is not allowed", field="value")
        self.secret_values[(name, scope)] = body["value"]
        record = {
            "id": f"sec_{next(self._ids)}",
            "name": name,
            "scope": scope,
            "created_at": NOW,
            "updated_at": NOW,
            "creator_name": "Ada",
            "updater_name": "Ada",
        }
        self.secrets = [s for s in self.secrets if (s["name"], s["scope"]) != (name, scope)]
        self.secrets.append(record)
        return self._answer({**record, "platform_url": f"{self.url}/demo/secrets"}, 201)

    # --- models, rollouts, runs ---------------------------------------------------------------

    async def base_list(self, request: Request) -> Response:
        _, refused = await self._scoped(request)
        return refused or self._answer(self._page(self.base_models, request, "models"))

    async def lora_list(self, request: Request) -> Response:
        _, refused = await self._scoped(request)
        if refused is not None:
            return refused
        page = self._page(self.lora_models, request, "models")
        return self._answer({**page, "active_deployments": 1, "max_active_deployments": 3})

    async def base_get(self, request: Request) -> Response:
        _, refused = await self._scoped(request)
        if refused is not None:
            return refused
        name = request.path_params["name"]
        found = next(
            (m for m in self.base_models if name in (m["model_name"], m["base_model"])), None
        )
        return self._error(404, "Model not found") if found is None else self._answer(found)

    async def lora_get(self, request: Request) -> Response:
        _, refused = await self._scoped(request)
        if refused is not None:
            return refused
        name = request.path_params["name"]
        found = next((m for m in self.lora_models if m["model_name"] == name), None)
        if found is None:
            return self._error(404, "Model not found")
        return self._answer({**found, "hf_upload_status": "none", "inference_model": f"x:{name}"})

    async def lora_deploy(self, request: Request) -> Response:
        _, refused = await self._scoped(request)
        if refused is not None:
            return refused
        name, verb = request.path_params["name"], request.path_params["verb"]
        found = next((m for m in self.lora_models if m["model_name"] == name), None)
        if found is None or verb not in ("deploy", "undeploy"):
            return self._error(404, "Model not found")
        found["deployment_status"] = "active" if verb == "deploy" else "inactive"
        return self._answer(
            {"id": found["id"], "model_name": name, "status": found["deployment_status"]}
        )

    async def rollouts_route(self, request: Request) -> Response:
        _, refused = await self._scoped(request)
        if refused is not None:
            return refused
        branch = request.query_params.get("branch")
        items = [r for r in self.rollouts if branch is None or r.get("branch") == branch]
        return self._answer(self._page(items, request, "rollouts"))

    async def submit(self, request: Request) -> Response:
        body, refused = await self._scoped(request)
        if refused is not None:
            return refused
        if not self.run_routes:
            return Response("Not Found", status_code=404)
        required = (body.get("secrets") or {}).get("required", [])
        provided = (body.get("secrets") or {}).get("provided", {})
        stored = {s["name"] for s in self.secrets}
        missing = [n for n in required if n not in provided and n not in stored]
        if missing:
            return self._error(
                404, f"Secret(s) not found: {', '.join(missing)}", code="SECRET_NOT_FOUND"
            )
        kind = "eval" if request.url.path.endswith("eval-runs") else "train"
        run = {
            "id": f"run_{next(self._ids)}",
            "name": f"{kind}-run-{len(self.runs) + 1}",
            "status": "pending",
            "created_at": NOW,
            "platform_url": f"{self.url}/demo/{kind}/{len(self.runs) + 1}",
        }
        self.runs.append({"kind": kind, "body": body, **run})
        return self._answer(run, 201)

    async def status_route(self, request: Request) -> Response:
        await self._record(request)
        body = json.loads(request.query_params.get("body", "{}"))
        return self._answer(body, request.path_params["status"])
