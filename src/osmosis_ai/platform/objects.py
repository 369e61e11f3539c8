"""The object store: files the platform keeps (uploaded datasets, produced outputs).

Objects live on the local filesystem under ``<root>/objects/<key>``; uploads in flight live
under ``<root>/staging`` (same filesystem, so finishing one is a rename). Every write goes
to a temp file, is fsynced and renamed into place only when whole: a refused, truncated or
interrupted upload leaves nothing behind under its key.

Keys are relative POSIX paths (``datasets/<workspace>/<id>/data.jsonl``). A key is refused
with :class:`InvalidObjectKeyError` unless it is already normal: no ``..`` or ``.`` segment, no
leading ``/``, no empty segment, no backslash, NUL or control character, at most 1024 bytes.
The resolved path must stay under the root even through symlinks.

Clients reach objects through expiring URLs the platform signs and serves itself
(:class:`UrlSigner`, HMAC-SHA256 with ``signing.key`` of the data dir). The URL names an
operation and its limits (``op=put`` with the exact ``size``; ``op=part`` with the upload
id, part number and size; ``op=get``); altering any of them, or using it after
``expires``, is answered 403. The HTTP side is :mod:`osmosis_ai.platform.api.objects`.

Multipart uploads follow S3's shape: each part is PUT on its own URL and answered with an
``ETag`` (a digest of the part); completing names ``[(part_number, etag)]``, and the parts
are joined in part-number order only if every ETag matches what was stored. A part URL that
also signs the part's ``offset`` has the part written straight into its place in the object,
so completing a multi-GB upload is a rename, not a copy.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar, TypeVarTuple
from urllib.parse import quote, urlencode

from osmosis_ai.platform.errors import InvalidRequestError, NotFoundError, PermissionDeniedError
from osmosis_ai.rundir.durable import fsync_dir

MAX_KEY_BYTES = 1024
MAX_SEGMENT_BYTES = 255  # one file or folder name on Linux filesystems
DEFAULT_EXPIRES_IN = 3600
_WRITE_BUFFER = 1 << 20
_UPLOAD_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
_WHOLE = "whole.body"
_ASSEMBLY = "assembly.body"  # the object being written part by part, in place
_ETAG = re.compile(r"^[0-9a-f]{32}$")
_R = TypeVar("_R")
_Args = TypeVarTuple("_Args")


class InvalidObjectKeyError(InvalidRequestError):
    """An object key that is not a normal relative path under the store's root."""

    default_code = "INVALID_OBJECT_KEY"

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(
            f"invalid object key {key!r}: {reason}; use a relative path such as "
            "'datasets/<id>/data.jsonl'",
            field="key",
        )


class UploadSizeMismatchError(InvalidRequestError):
    """An upload body longer or shorter than the size it was signed for."""

    default_code = "UPLOAD_SIZE_MISMATCH"

    @classmethod
    def too_long(cls, size: int) -> UploadSizeMismatchError:
        return cls(
            f"the upload is larger than the {size} bytes it was signed for; "
            "request a new upload URL with the file's real size"
        )

    @classmethod
    def cut_short(cls, received: int, size: int) -> UploadSizeMismatchError:
        return cls(f"the upload ended after {received} of {size} bytes; send the whole file")

    @classmethod
    def incomplete(cls, total: int, size: int, *, field: str | None) -> UploadSizeMismatchError:
        return cls(
            f"the upload holds {total} bytes but declared {size}; "
            "upload the whole file before completing",
            field=field,
        )


class InvalidUploadPartError(InvalidRequestError):
    """A multipart completion that names a missing part or a wrong ETag."""

    default_code = "INVALID_PART"


class ObjectNotFoundError(NotFoundError):
    default_code = "OBJECT_NOT_FOUND"


class SignatureRejectedError(PermissionDeniedError):
    """A signed URL that expired, was altered, or is used for another operation."""

    default_code = "SIGNATURE_REJECTED"


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified_at: float


def check_key(key: str) -> str:
    """``key`` itself when it is a valid object key; :class:`InvalidObjectKeyError` otherwise."""
    if not key:
        raise InvalidObjectKeyError(key, "it is empty")
    if len(key.encode("utf-8", errors="replace")) > MAX_KEY_BYTES:
        raise InvalidObjectKeyError(key[:64] + "…", f"it is longer than {MAX_KEY_BYTES} bytes")
    if "\x00" in key:
        raise InvalidObjectKeyError(key, "it contains a NUL byte")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in key):
        raise InvalidObjectKeyError(key, "it contains a control character")
    if "\\" in key:
        raise InvalidObjectKeyError(key, "it contains a backslash")
    if key.startswith("/"):
        raise InvalidObjectKeyError(key, "it is an absolute path")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            shown = "an empty" if not segment else f"a {segment!r}"
            raise InvalidObjectKeyError(key, f"it has {shown} path segment")
        if len(segment.encode("utf-8", errors="replace")) > MAX_SEGMENT_BYTES:
            raise InvalidObjectKeyError(
                key[:64] + "…",
                f"a path segment is longer than {MAX_SEGMENT_BYTES} bytes in UTF-8 (a file "
                "name's limit on disk)",
            )
    return key


class ObjectStore:
    """Objects on the local filesystem under ``root``, written atomically."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self._objects = self.root / "objects"
        self._staging = self.root / "staging"
        self._uploads = self._staging / "uploads"
        for folder in (self._objects, self._staging, self._uploads):
            folder.mkdir(parents=True, exist_ok=True)

    # -- keys ---------------------------------------------------------------------------

    def path(self, key: str) -> Path:
        """Where ``key`` lives; refuses keys that would leave the root."""
        path = self._objects / check_key(key)
        resolved = path.resolve()
        if not resolved.is_relative_to(self._objects):
            raise InvalidObjectKeyError(key, "it resolves outside the object store")
        return resolved

    # -- whole objects ------------------------------------------------------------------

    def put(self, key: str, data: bytes | Iterable[bytes]) -> ObjectInfo:
        """Store ``data`` under ``key`` (replacing any object there)."""
        target = self.path(key)
        chunks = [data] if isinstance(data, bytes) else data
        temp = self._temp_file()
        try:
            with temp.open("wb", buffering=_WRITE_BUFFER) as out:
                for chunk in chunks:
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            self._publish(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        return self.stat(key)

    def put_files(self, items: Sequence[tuple[str, Path]]) -> None:
        """Store each local file under its key (replacing any object there), in bulk.

        A file on the store's filesystem is hard-linked in instead of copied (its bytes are
        flushed where they lie); every other is copied. Each file is made durable, and each
        folder that changed is synced once for the whole batch instead of once per file: the
        cost of keeping many small files (an eval's trajectories) stays a fraction of a copy.
        Later changes to a source file replaced by rename leave the stored object as it was.
        """
        folders: set[Path] = set()
        for key, source in items:
            target = self.path(key)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.parent.resolve().is_relative_to(self._objects):
                raise InvalidObjectKeyError(key, "it resolves outside the object store")
            temp = self._staging / f"link-{secrets.token_hex(8)}.tmp"
            try:
                try:
                    os.link(source, temp)
                except OSError:  # another filesystem, or links refused: copy the bytes
                    with source.open("rb") as handle, temp.open("wb") as out:
                        _copy(handle, out)
                        out.flush()
                        os.fsync(out.fileno())
                else:
                    fd = os.open(temp, os.O_RDONLY)
                    try:
                        os.fsync(fd)  # cheap when its writer flushed it already
                    finally:
                        os.close(fd)
                os.replace(temp, target)
            finally:
                temp.unlink(missing_ok=True)
            folders.add(target.parent)
        for folder in folders:
            fsync_dir(folder)

    async def receive(self, key: str, chunks: AsyncIterable[bytes], *, size: int) -> ObjectInfo:
        """Stream exactly ``size`` bytes from ``chunks`` into ``key``.

        More or fewer bytes raise :class:`UploadSizeMismatchError`; on any failure, including
        the client going away, nothing is kept.
        """
        target = self.path(key)
        temp, _ = await self._receive_to_temp(chunks, size, self._staging, digest=False)
        try:
            await _in_thread(self._publish, temp, target)
        finally:
            temp.unlink(missing_ok=True)
        return self.stat(key)

    def open(self, key: str) -> BinaryIO:
        """The object's bytes, for reading."""
        try:
            return self.path(key).open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(f"no object {key!r}") from None

    def stat(self, key: str) -> ObjectInfo:
        path = self.path(key)
        try:
            status = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"no object {key!r}") from None
        if not path.is_file():
            raise ObjectNotFoundError(f"no object {key!r}")
        return ObjectInfo(key, status.st_size, status.st_mtime)

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except ObjectNotFoundError:
            return False
        return True

    def delete(self, key: str) -> bool:
        """Remove ``key``; False when there was nothing to remove."""
        path = self.path(key)
        try:
            path.unlink()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
        self._prune_empty(path.parent)
        return True

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object whose key starts with ``prefix/``; returns how many."""
        removed = 0
        for info in self.list(prefix):
            removed += self.delete(info.key)
        return removed

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects under the folder ``prefix`` (every object when empty), sorted by key."""
        base = self._objects if not prefix else self.path(prefix.rstrip("/"))
        if not base.is_dir():
            return []
        found: list[ObjectInfo] = []
        for path in base.rglob("*"):
            if path.is_file():
                status = path.stat()
                key = path.relative_to(self._objects).as_posix()
                found.append(ObjectInfo(key, status.st_size, status.st_mtime))
        return sorted(found, key=lambda info: info.key)

    # -- uploads in flight ---------------------------------------------------------------

    def start_upload(self, key: str, upload_id: str | None = None) -> str:
        """Open an upload for ``key``; returns its id (``upload_id`` when given).

        The body arrives whole (:meth:`receive_whole`) or in parts (:meth:`receive_part`)
        and becomes the object only at :meth:`complete_upload`. Once an upload is completed
        or aborted its id is dead, so a URL signed for it can no longer change any object.
        """
        check_key(key)
        upload_id = upload_id or secrets.token_hex(16)
        folder = self._upload_folder(upload_id)
        try:
            folder.mkdir()
        except FileExistsError:
            raise InvalidRequestError(f"upload {upload_id!r} is already open") from None
        (folder / "key").write_text(key, encoding="utf-8")
        return upload_id

    def upload_key(self, upload_id: str) -> str:
        """The key an upload in flight will be stored under."""
        try:
            return (self._upload_folder(upload_id) / "key").read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(
                f"no upload {upload_id!r} in flight: it was completed or aborted, or never "
                "started; create the upload again"
            ) from None

    async def receive_whole(
        self, upload_id: str, chunks: AsyncIterable[bytes], *, size: int
    ) -> None:
        """Receive an upload's whole body of exactly ``size`` bytes (a resend replaces it)."""
        folder = self._upload_folder(upload_id)
        self.upload_key(upload_id)
        temp, _ = await self._receive_to_temp(chunks, size, folder, digest=False)
        try:
            os.replace(temp, folder / _WHOLE)
        finally:
            _discard(temp)

    async def receive_part(
        self,
        upload_id: str,
        part_number: int,
        chunks: AsyncIterable[bytes],
        *,
        size: int,
        offset: int | None = None,
    ) -> str:
        """Receive one part of exactly ``size`` bytes; returns its ETag (unquoted).

        With ``offset`` (where the part starts in the object) the part is written straight
        into place, so completing needs no copy; without it the part is kept apart and
        completing joins the parts. Sending a part number again replaces the part (and its
        ETag).
        """
        folder = self._upload_folder(upload_id)
        self.upload_key(upload_id)
        if part_number < 1:
            raise InvalidUploadPartError(f"part numbers start at 1, got {part_number}")
        for old in [*folder.glob(f"{part_number}-*.part"), *folder.glob(f"{part_number}-*.at")]:
            old.unlink(missing_ok=True)
        if offset is not None:
            if offset < 0:
                raise InvalidUploadPartError(f"a part cannot start before byte 0 (offset {offset})")
            etag = await self._receive_in_place(chunks, size, folder / _ASSEMBLY, offset)
            marker = folder / f"{part_number}-{etag}.at"
            temp = folder / f".{marker.name}.tmp"
            temp.write_text(f"{offset} {size}", encoding="ascii")
            os.replace(temp, marker)
            return etag
        temp, etag = await self._receive_to_temp(chunks, size, folder, digest=True)
        try:
            os.replace(temp, folder / f"{part_number}-{etag}.part")
        finally:
            _discard(temp)
        return etag

    def complete_upload(
        self,
        upload_id: str,
        parts: Sequence[tuple[int, str]] | None = None,
        *,
        size: int | None = None,
    ) -> ObjectInfo:
        """Make the upload the object under its key, and close the upload.

        Without ``parts`` the whole body must have arrived. With ``parts`` ((part number,
        ETag), any order) every named part must have been received with exactly that ETag
        (quotes around it are ignored); they are joined in part-number order. ``size``,
        when given, must be the object's length. On a refusal the upload stays open.
        """
        folder = self._upload_folder(upload_id)
        key = self.upload_key(upload_id)
        placed = None if parts is None else self._placed(folder, parts)
        if placed is not None:
            return self._complete_in_place(folder, key, placed, size)
        files = [self._whole(folder)] if parts is None else self._parts(folder, parts)
        total = sum(path.stat().st_size for path in files)
        if size is not None and total != size:
            raise UploadSizeMismatchError.incomplete(
                total, size, field="parts" if parts is not None else None
            )
        target = self.path(key)
        if parts is None:
            self._publish(files[0], target)
        else:
            temp = self._temp_file()
            try:
                with temp.open("wb") as out:
                    for path in files:
                        with path.open("rb") as part:
                            _copy(part, out)
                    out.flush()
                    os.fsync(out.fileno())
                self._publish(temp, target)
            finally:
                _discard(temp)
        shutil.rmtree(folder, ignore_errors=True)
        return self.stat(key)

    def abort_upload(self, upload_id: str) -> bool:
        """Drop an upload in flight and what it received; False when there was none."""
        folder = self._upload_folder(upload_id)
        if not folder.is_dir():
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return True

    def _whole(self, folder: Path) -> Path:
        path = folder / _WHOLE
        if not path.is_file():
            raise UploadSizeMismatchError(
                "nothing was uploaded yet: PUT the file to its upload URL before completing"
            )
        return path

    def _placed(
        self, folder: Path, parts: Sequence[tuple[int, str]]
    ) -> list[tuple[int, int]] | None:
        """(offset, size) of each named part when all were written in place; else None."""
        self._check_numbers(parts)
        spans: list[tuple[int, int]] = []
        for number, etag in sorted(parts):
            marker = folder / f"{number}-{etag.strip().strip(chr(34))}.at"
            if not marker.is_file():
                if not any(folder.glob("*.at")):
                    return None  # parts kept apart: they are joined by copying
                held = [_part_etag(found) for found in folder.glob(f"{number}-*.at")]
                raise _part_mismatch(number, etag, held)
            offset, _, size = marker.read_text(encoding="ascii").partition(" ")
            spans.append((int(offset), int(size)))
        return spans

    def _complete_in_place(
        self, folder: Path, key: str, spans: list[tuple[int, int]], size: int | None
    ) -> ObjectInfo:
        end = 0
        for offset, length in spans:
            if offset != end:
                raise InvalidUploadPartError(
                    f"the parts do not join up: one starts at byte {offset}, not {end}; "
                    "complete with every part of the upload",
                    field="parts",
                )
            end += length
        if size is not None and end != size:
            raise UploadSizeMismatchError.incomplete(end, size, field="parts")
        assembly = folder / _ASSEMBLY
        with assembly.open("r+b") as handle:
            handle.truncate(end)
            os.fsync(handle.fileno())
        self._publish(assembly, self.path(key))
        shutil.rmtree(folder, ignore_errors=True)
        return self.stat(key)

    def _check_numbers(self, parts: Sequence[tuple[int, str]]) -> None:
        if not parts:
            raise InvalidUploadPartError(
                "a multipart completion needs at least one part", field="parts"
            )
        numbers = [number for number, _ in parts]
        if len(set(numbers)) != len(numbers):
            raise InvalidUploadPartError(
                f"part numbers repeat in the completion: {sorted(numbers)}", field="parts"
            )

    def _parts(self, folder: Path, parts: Sequence[tuple[int, str]]) -> list[Path]:
        self._check_numbers(parts)
        files: list[Path] = []
        for number, etag in sorted(parts):
            tag = etag.strip().strip('"')
            path = folder / f"{number}-{tag}.part"
            if not _ETAG.match(tag) or not path.is_file():
                held = [
                    _part_etag(found)
                    for pattern in (f"{number}-*.part", f"{number}-*.at")
                    for found in folder.glob(pattern)
                ]
                raise _part_mismatch(number, etag, held)
            files.append(path)
        return files

    # -- internals ----------------------------------------------------------------------

    def _upload_folder(self, upload_id: str) -> Path:
        if not _UPLOAD_ID.match(upload_id):
            raise InvalidRequestError(
                f"invalid upload id {upload_id!r}: use 8 to 64 letters, digits, '-' or '_'"
            )
        return self._uploads / upload_id

    def _temp_file(self) -> Path:
        fd, name = tempfile.mkstemp(dir=self._staging, prefix="upload-", suffix=".tmp")
        os.close(fd)
        return Path(name)

    async def _receive_to_temp(
        self, chunks: AsyncIterable[bytes], size: int, folder: Path, *, digest: bool
    ) -> tuple[Path, str]:
        if size < 0:
            raise UploadSizeMismatchError(f"an upload size cannot be negative ({size})")
        fd, name = tempfile.mkstemp(dir=folder, prefix="upload-", suffix=".tmp")
        temp = Path(name)
        hasher = hashlib.sha256() if digest else None
        received = 0
        try:
            with os.fdopen(fd, "wb", buffering=_WRITE_BUFFER) as out:
                async for chunk in chunks:
                    received += len(chunk)
                    if received > size:
                        raise UploadSizeMismatchError.too_long(size)
                    if hasher is not None:
                        hasher.update(chunk)
                    out.write(chunk)
                if received < size:
                    raise UploadSizeMismatchError.cut_short(received, size)
                out.flush()
                await _in_thread(os.fsync, out.fileno())
        except BaseException:
            _discard(temp)
            raise
        etag = hasher.hexdigest()[:32] if hasher is not None else ""
        return temp, etag

    async def _receive_in_place(
        self, chunks: AsyncIterable[bytes], size: int, path: Path, offset: int
    ) -> str:
        """Write exactly ``size`` bytes at ``offset`` of ``path``; the ETag of those bytes."""
        if size < 0:
            raise UploadSizeMismatchError(f"an upload size cannot be negative ({size})")
        hasher = hashlib.sha256()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            received = 0
            pending = bytearray()
            position = offset
            async for chunk in chunks:
                received += len(chunk)
                if received > size:
                    raise UploadSizeMismatchError.too_long(size)
                hasher.update(chunk)
                pending += chunk
                if len(pending) >= _WRITE_BUFFER:
                    position += _pwrite_all(fd, pending, position)
                    pending.clear()
            if received < size:
                raise UploadSizeMismatchError.cut_short(received, size)
            _pwrite_all(fd, pending, position)
            await _in_thread(os.fsync, fd)
        finally:
            os.close(fd)
        return hasher.hexdigest()[:32]

    def _publish(self, temp: Path, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.parent.resolve().is_relative_to(self._objects):
            raise InvalidObjectKeyError(str(target), "it resolves outside the object store")
        os.replace(temp, target)
        fsync_dir(target.parent)

    def _prune_empty(self, folder: Path) -> None:
        while folder != self._objects and folder.is_relative_to(self._objects):
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent


def _discard(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _part_mismatch(number: int, etag: str, held: list[str]) -> InvalidUploadPartError:
    reason = f"its stored ETag is {held[0]!r}" if held else "it was never received"
    return InvalidUploadPartError(
        f"part {number} does not match ETag {etag!r}: {reason}; "
        "send the ETag its upload was answered with",
        field="parts",
    )


def _part_etag(path: Path) -> str:
    return path.name.partition("-")[2].removesuffix(".part").removesuffix(".at")


def _pwrite_all(fd: int, data: bytes | bytearray, position: int) -> int:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        position += written
        view = view[written:]
    return len(data)


def _copy(source: BinaryIO, target: BinaryIO) -> None:
    """Append ``source`` to ``target``: in the kernel where the OS can, else by chunks."""
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        target.flush()
        start = target.tell()
        try:
            while copy_range(source.fileno(), target.fileno(), 1 << 30):
                pass
        except OSError:  # e.g. a filesystem without it: start this part again by chunks
            source.seek(0)
            target.seek(start)
            target.truncate()
        else:
            target.seek(0, os.SEEK_END)
            return
    shutil.copyfileobj(source, target, _WRITE_BUFFER)


async def _in_thread(function: Callable[[*_Args], _R], *args: *_Args) -> _R:
    import anyio.to_thread

    return await anyio.to_thread.run_sync(function, *args)


# -- signed URLs --------------------------------------------------------------------------


class UrlSigner:
    """Signs and checks expiring object URLs with HMAC-SHA256.

    The signature covers the operation, the object key, every parameter and the expiry
    time; ``clock`` (seconds since the epoch) is injectable for tests.
    """

    def __init__(self, key: bytes, *, clock: Callable[[], float] = time.time) -> None:
        if len(key) < 16:
            raise ValueError("a signing key needs at least 16 bytes")
        self._key = key
        self._clock = clock

    def query(
        self, op: str, key: str, params: Mapping[str, str] | None = None, *, expires_in: int
    ) -> str:
        """The query string (``op``, ``params``, ``expires``, ``signature``) for one URL."""
        fields = {**(params or {}), "op": op, "expires": str(int(self._clock()) + expires_in)}
        fields["signature"] = self._signature(check_key(key), fields)
        return urlencode(fields)

    def url(
        self,
        base_url: str,
        op: str,
        key: str,
        params: Mapping[str, str] | None = None,
        *,
        expires_in: int = DEFAULT_EXPIRES_IN,
    ) -> str:
        """A full URL under ``{base_url}/objects/`` for ``op`` on ``key``."""
        query = self.query(op, key, params, expires_in=expires_in)
        return f"{base_url.rstrip('/')}/objects/{quote(key)}?{query}"

    def verify(self, op: str, key: str, query: Mapping[str, str]) -> dict[str, str]:
        """The signed parameters of a URL for ``op`` on ``key``; 403 unless intact and fresh."""
        check_key(key)
        fields = dict(query)
        given = fields.pop("signature", "")
        if fields.get("op") != op:
            raise SignatureRejectedError(
                f"this URL is not signed for {op!r}; request a new one from the platform"
            )
        expected = self._signature(key, fields)
        # As bytes: compare_digest raises TypeError on a str with non-ASCII characters.
        if not given or not hmac.compare_digest(given.encode(), expected.encode()):
            raise SignatureRejectedError(
                "the URL's signature does not match: it was altered or not issued by this "
                "platform; request a new one"
            )
        try:
            expires = int(fields["expires"])
        except (KeyError, ValueError):
            raise SignatureRejectedError("the URL has no valid 'expires'") from None
        if self._clock() > expires:
            raise SignatureRejectedError(
                "the URL expired; request a new one from the platform",
                code="URL_EXPIRED",
            )
        return fields

    def _signature(self, key: str, fields: Mapping[str, str]) -> str:
        canonical = json.dumps([key, sorted(fields.items())], ensure_ascii=True)
        mac = hmac.new(self._key, canonical.encode("ascii"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode("ascii").rstrip("=")
