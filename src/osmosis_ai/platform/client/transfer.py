"""Dataset bytes through presigned URLs: one PUT or numbered parts up, a streamed GET down.

Files are streamed in 1 MiB chunks and never read whole; a failed PUT is retried with
backoff (1, 2, 4, 8 s) on 429, 5xx and transport errors. Presigned URLs carry their own
signature, so no bearer token goes with them; plaintext URLs to non-loopback hosts are
refused unless insecure transfers were allowed.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from urllib.parse import urlsplit

import httpx

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.platform.client.api import (
    PlatformClient,
    Progress,
    UploadInstructions,
    is_insecure_url,
    network_error,
)
from osmosis_ai.platform.client.errors import PlatformClientError, UnsafeAnswerError

CHUNK = 1 << 20
RETRY_STATUSES = (429, 500, 502, 503, 504)
ATTEMPTS = 5

Part = dict[str, object]  # {"PartNumber": n, "ETag": "..."}
ProgressBar = Callable[[int, str], AbstractContextManager[Progress | None]]
"""Shows a transfer of ``total`` bytes described as ``description``; yields its callback."""


def progress_of(
    bar: ProgressBar | None, total: int, description: str
) -> AbstractContextManager[Progress | None]:
    return nullcontext() if bar is None else bar(total, description)


def transfers_for(client: PlatformClient) -> Transfers:
    """The transfers of ``client``'s platform: insecure URLs allowed as it allows them."""
    return Transfers(allow_insecure=client.allow_insecure_transfers, sleep=client.sleep)


def safe_name(name: object, what: str = "file name") -> str:
    """A name from the platform, reduced to its last path component."""
    base = PurePosixPath(str(name).replace("\\", "/")).name
    if base in ("", ".", ".."):
        raise UnsafeAnswerError(f"The platform sent a bad {what}: {name!r}")
    return base


def safe_relative(path: object) -> PurePosixPath:
    """A file path from the platform, refused unless it stays under the download's root."""
    text = str(path or "")
    if (
        not text
        or text.startswith("/")
        or "\\" in text
        or any(part in ("", ".", "..") for part in text.split("/"))
    ):
        raise UnsafeAnswerError(f"The platform sent an unsafe file path: {text!r}")
    return PurePosixPath(text)


@dataclass
class _Source:
    """The open file being uploaded and the progress of the whole upload."""

    handle: BinaryIO
    size: int
    progress: Progress | None

    def chunks(self, offset: int, length: int) -> Iterator[bytes]:
        self.handle.seek(offset)
        left = length
        while left > 0:
            chunk = self.handle.read(min(left, CHUNK))
            if not chunk:
                raise PlatformClientError(
                    "VALIDATION", "The file got shorter while it was being uploaded."
                )
            left -= len(chunk)
            if self.progress is not None:
                self.progress(offset + length - left, self.size)
            yield chunk


class Transfers:
    """Uploads and downloads through presigned URLs (see the module docstring)."""

    def __init__(
        self,
        *,
        allow_insecure: bool = False,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        timeout: float = 600.0,
    ) -> None:
        self.allow_insecure = allow_insecure
        self.sleep = sleep
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=30.0),
            transport=transport,
            headers={"User-Agent": f"osmosis-cli/{PACKAGE_VERSION}"},
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Transfers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def upload(
        self, instructions: UploadInstructions, path: Path, *, progress: Progress | None = None
    ) -> list[Part] | None:
        """Send ``path`` as instructed; the parts' ``{PartNumber, ETag}`` for multipart."""
        with path.open("rb") as handle:
            source = _Source(handle, os.fstat(handle.fileno()).st_size, progress)
            if instructions.method == "multipart":
                return self._upload_parts(instructions, source)
            if instructions.method != "simple":
                raise PlatformClientError(
                    "PLATFORM_ERROR",
                    f"The platform asked for upload method {instructions.method!r}; this CLI "
                    "knows 'simple' and 'multipart'. Upgrade osmosis-ai.",
                )
            url = instructions.presigned_url
            if not url:
                raise PlatformClientError(
                    "PLATFORM_ERROR", "The platform sent no upload URL for a simple upload."
                )
            self.check_url(url, "upload")
            headers = {**(instructions.upload_headers or {}), "Content-Length": str(source.size)}
            self._put(url, source, offset=0, length=source.size, headers=headers)
            return None

    def _upload_parts(self, instructions: UploadInstructions, source: _Source) -> list[Part]:
        part_size, total, size = instructions.part_size, instructions.total_parts, source.size
        if not part_size or not total or part_size <= 0 or total <= 0:
            raise PlatformClientError(
                "PLATFORM_ERROR", "The platform sent a multipart upload without part sizes."
            )
        if not part_size * (total - 1) < size <= part_size * total:
            raise PlatformClientError(
                "PLATFORM_ERROR",
                f"The platform planned {total} parts of {part_size} bytes, which does not fit "
                f"this {size}-byte file.",
            )
        urls = {part.part_number: part for part in instructions.presigned_urls or []}
        missing = [number for number in range(1, total + 1) if number not in urls]
        if missing:
            raise PlatformClientError(
                "PLATFORM_ERROR", f"The platform sent no upload URL for parts {missing[:10]}."
            )
        parts: list[Part] = []
        for number in range(1, total + 1):
            offset = (number - 1) * part_size
            length = min(part_size, size - offset)
            part = urls[number]
            if part.size is not None and part.size != length:
                raise PlatformClientError(
                    "PLATFORM_ERROR",
                    f"Part {number}: the platform signed {part.size} bytes, the file has "
                    f"{length} there.",
                )
            self.check_url(part.presigned_url, f"part {number} upload")
            response = self._put(
                part.presigned_url,
                source,
                offset=offset,
                length=length,
                headers={"Content-Length": str(length)},
            )
            etag = response.headers.get("etag", "").strip().strip('"')
            if not etag:
                raise PlatformClientError(
                    "PLATFORM_ERROR", f"Part {number}: the object store returned no ETag."
                )
            parts.append({"PartNumber": number, "ETag": etag})
        return parts

    def _put(
        self, url: str, source: _Source, *, offset: int, length: int, headers: dict[str, str]
    ) -> httpx.Response:
        failure = "no attempt made"
        for attempt in range(ATTEMPTS):
            if attempt:
                self.sleep(min(2.0 ** (attempt - 1), 8.0))
            try:
                response = self._http.put(
                    url, content=source.chunks(offset, length), headers=headers
                )
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {exc}"
                continue
            if response.is_success:
                return response
            if response.status_code in RETRY_STATUSES:
                failure = f"HTTP {response.status_code}"
                continue
            raise PlatformClientError(
                "PLATFORM_ERROR",
                f"The object store refused the upload with HTTP {response.status_code}: "
                f"{response.text.strip()[:200]}",
                status_code=response.status_code,
                details={"status_code": response.status_code},
            )
        raise PlatformClientError(
            "NETWORK", f"The upload failed after {ATTEMPTS} attempts (last: {failure})."
        )

    def download(
        self,
        url: str,
        destination: Path,
        *,
        overwrite: bool = False,
        expected_size: int | None = None,
        progress: Progress | None = None,
    ) -> Path:
        """Stream ``url`` into ``destination`` through a temp file beside it.

        Raises ``FileExistsError`` when ``destination`` exists and ``overwrite`` is off.
        """
        self.check_url(url, "download")
        if destination.exists() and not overwrite:
            raise FileExistsError(destination)
        destination.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                self._get_into(url, out, expected_size, progress)
            got = tmp.stat().st_size
            if expected_size is not None and got != expected_size:
                raise PlatformClientError(
                    "PLATFORM_ERROR",
                    f"The download has {got} bytes where the platform promised "
                    f"{expected_size}; try again.",
                )
            if destination.exists() and not overwrite:
                raise FileExistsError(destination)
            tmp.replace(destination)
        finally:
            tmp.unlink(missing_ok=True)
        return destination

    def _get_into(
        self, url: str, out: BinaryIO, expected_size: int | None, progress: Progress | None
    ) -> None:
        try:
            with self._http.stream("GET", url) as response:
                if response.is_error:
                    raise PlatformClientError(
                        "PLATFORM_ERROR",
                        f"The object store refused the download with HTTP {response.status_code}.",
                        status_code=response.status_code,
                        details={"status_code": response.status_code},
                    )
                total = expected_size or int(response.headers.get("content-length") or 0)
                done = 0
                for chunk in response.iter_bytes(CHUNK):
                    out.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done, total)
        except httpx.HTTPError as exc:
            raise network_error(exc, url.split("?", 1)[0]) from exc

    def check_url(self, url: str, what: str) -> None:
        if not url.lower().startswith(("http://", "https://")):
            raise PlatformClientError("PLATFORM_ERROR", f"The platform sent an invalid {what} URL.")
        if is_insecure_url(url) and not self.allow_insecure:
            raise PlatformClientError(
                "VALIDATION",
                f"Refusing a non-HTTPS {what} URL to a non-loopback host "
                f"({urlsplit(url).netloc}). Set OSMOSIS_ALLOW_INSECURE_PLATFORM_URL=1 to allow "
                "plaintext transfers.",
            )
