"""``/objects/{key}``: the signed URLs of the object store, served by the platform itself.

* ``PUT ?op=put&upload_id&size&content_type`` the body of a simple upload (the request must
  carry the ``Content-Type`` it was signed with, as the create answer's ``upload_headers``
  say);
* ``PUT ?op=part&upload_id&part_number&size[&offset]`` one part of a multipart upload,
  answered with its ``ETag`` header (with ``offset`` it is written straight into place);
* ``GET``/``HEAD ?op=get[&name]`` the object (ranges supported), saved as ``name``.

Bodies stream to disk in chunks as they arrive (``request.stream()``), never whole in
memory. Every failure answers the platform's error envelope: 403 for an expired or altered
URL, 400 for a body longer or shorter than signed, 404 for an upload that was completed or
aborted. These routes need no bearer token: the signature is the credential.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route, Router

from osmosis_ai.platform.api.deps import Platform
from osmosis_ai.platform.crypto import load_or_create_key
from osmosis_ai.platform.errors import InvalidRequestError, PlatformError
from osmosis_ai.platform.objects import (
    ObjectStore,
    SignatureRejectedError,
    UploadSizeMismatchError,
    UrlSigner,
)

CONTENT_TYPE = "application/octet-stream"
SIGNING_KEY_FILE = "signing.key"


def object_store(platform: Platform) -> ObjectStore:
    """The platform's object store (under ``<data dir>/objects``), made once per app."""
    store = platform.extras.get("objects")
    if not isinstance(store, ObjectStore):
        store = platform.extras["objects"] = ObjectStore(platform.settings.objects_dir)
    return store


def url_signer(platform: Platform) -> UrlSigner:
    """The signer of object URLs, keyed by ``<data dir>/signing.key`` (made on first start)."""
    signer = platform.extras.get("url_signer")
    if not isinstance(signer, UrlSigner):
        key = load_or_create_key(platform.settings.key_dir / SIGNING_KEY_FILE)
        signer = platform.extras["url_signer"] = UrlSigner(key)
    return signer


def mount_objects(app: Starlette, platform: Platform) -> None:
    """Serve the signed object URLs at ``/objects`` of ``app``."""
    app.mount("/objects", objects_router(object_store(platform), url_signer(platform)))


def objects_router(store: ObjectStore, signer: UrlSigner) -> Router:
    """The ASGI routes to mount at ``/objects``."""

    async def put(request: Request) -> Response:
        key: str = request.path_params["key"]
        try:
            query = _single_values(request)
            op = query.get("op", "")
            if op == "put":
                fields = signer.verify("put", key, query)
                _check_content_type(request, fields.get("content_type", CONTENT_TYPE))
                size = _declared(request, fields)
                upload_id = _upload_for(store, fields, key)
                await store.receive_whole(upload_id, _body(request), size=size)
                return Response(status_code=200)
            if op == "part":
                fields = signer.verify("part", key, query)
                size = _declared(request, fields)
                upload_id = _upload_for(store, fields, key)
                offset = _int(fields, "offset") if "offset" in fields else None
                etag = await store.receive_part(
                    upload_id, _int(fields, "part_number"), _body(request), size=size, offset=offset
                )
                return Response(status_code=200, headers={"ETag": f'"{etag}"'})
            raise SignatureRejectedError(f"this URL is not signed for a PUT (op={op!r})")
        except PlatformError as error:
            return _error(error)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is listening; nothing was kept

    async def get(request: Request) -> Response:
        key: str = request.path_params["key"]
        try:
            fields = signer.verify("get", key, _single_values(request))
            info = store.stat(key)
        except PlatformError as error:
            return _error(error)
        name = fields.get("name") or key.rsplit("/", 1)[-1]
        return FileResponse(
            store.path(info.key),
            media_type=CONTENT_TYPE,
            filename=name,
        )

    return Router(
        routes=[
            Route("/{key:path}", put, methods=["PUT"]),
            Route("/{key:path}", get, methods=["GET", "HEAD"]),
        ]
    )


async def _body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk


def _single_values(request: Request) -> dict[str, str]:
    query = request.query_params
    repeated = sorted({name for name in query if len(query.getlist(name)) > 1})
    if repeated:
        raise SignatureRejectedError(
            f"the URL repeats parameters {repeated}; use the URL as issued"
        )
    return dict(query)


def _int(fields: Mapping[str, str], name: str) -> int:
    try:
        return int(fields[name])
    except (KeyError, ValueError):
        raise SignatureRejectedError(f"the URL has no valid {name!r}") from None


def _declared(request: Request, fields: Mapping[str, str]) -> int:
    """The signed size; a ``Content-Length`` that differs is refused before any byte is read."""
    size = _int(fields, "size")
    length = request.headers.get("content-length")
    if length is not None and length.strip() != str(size):
        raise UploadSizeMismatchError(
            f"Content-Length {length} differs from the {size} bytes this URL was signed for; "
            "request a new upload URL with the file's real size",
            field="Content-Length",
        )
    return size


def _check_content_type(request: Request, expected: str) -> None:
    got = request.headers.get("content-type")
    if got != expected:
        raise SignatureRejectedError(
            f"this URL needs the header Content-Type: {expected} (got {got!r}); send the "
            "upload_headers the platform answered with"
        )


def _upload_for(store: ObjectStore, fields: Mapping[str, str], key: str) -> str:
    upload_id = fields.get("upload_id", "")
    if store.upload_key(upload_id) != key:
        raise InvalidRequestError(f"upload {upload_id!r} is not for object {key!r}")
    return upload_id


def _error(error: PlatformError) -> JSONResponse:
    return JSONResponse(error.envelope(), status_code=error.status_code)
