"""``rollout/http.py`` over ``https``: a real TLS server on 127.0.0.1 with a certificate
made for the test, reached through aiohttp's pool (the fallback of the lean transport),
and httpx's own pool when ``httpx-aiohttp`` is missing."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from osmosis_ai.errors import UsageError
from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.asgi import Receive, Scope, Send, lifespan, read_body, send_body
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.http import aclose_shared_transport, async_client, post_json
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing.serving import free_port, serve_in_task
from rollouts import MetadataGrader, ScriptedBehaviour

pytest.importorskip("uvicorn", reason="the TLS server needs the server extra (uvicorn)")
x509 = pytest.importorskip("cryptography.x509")


@dataclass
class Certificate:
    cert: Path
    key: Path

    def trusting_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    """A self-signed certificate for 127.0.0.1, valid for a day."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "osmosis test 127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    paths = Certificate(folder / "cert.pem", folder / "key.pem")
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


class Echo:
    """Answers every request with its method, path, a header and its body, as JSON."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive) or b""
        headers = dict(scope["headers"])
        self.seen.append(scope["path"])
        answer = json.dumps(
            {
                "method": scope["method"],
                "path": scope["path"],
                "scheme": scope["scheme"],
                "x-probe": headers.get(b"x-probe", b"").decode(),
                "body": body.decode(),
            }
        ).encode()
        await send_body(send, 201, answer)


async def serve_tls(app: Any, certificate: Certificate) -> AsyncIterator[str]:
    serving = serve_in_task(
        app, ssl_certfile=str(certificate.cert), ssl_keyfile=str(certificate.key)
    )
    async with serving as url:
        yield url.replace("http://", "https://")


@pytest.fixture
async def echo_url(certificate: Certificate) -> AsyncIterator[str]:
    async for url in serve_tls(Echo(), certificate):
        yield url


async def test_https_goes_through_aiohttp_trusting_the_given_certificate(echo_url, certificate):
    async with async_client(verify=certificate.trusting_context(), timeout=10) as client:
        answers = [
            await client.post(f"{echo_url}/v1/x", json={"n": n}, headers={"x-probe": "p"})
            for n in range(3)
        ]
    for n, answer in enumerate(answers):
        assert answer.status_code == 201
        assert answer.json() == {
            "method": "POST",
            "path": "/v1/x",
            "scheme": "https",
            "x-probe": "p",
            "body": json.dumps({"n": n}, separators=(",", ":")),
        }
        # httpcore marks every answer with its network stream; aiohttp's transport does not
        assert "network_stream" not in answer.extensions


async def test_without_httpx_aiohttp_https_uses_httpx_pool(echo_url, certificate, monkeypatch):
    monkeypatch.setitem(sys.modules, "httpx_aiohttp", None)  # as if the extra were missing
    async with async_client(verify=certificate.trusting_context(), timeout=10) as client:
        answer = await client.get(f"{echo_url}/plain")
    assert answer.status_code == 201 and answer.json()["scheme"] == "https"
    assert "network_stream" in answer.extensions


async def test_an_untrusted_certificate_is_a_connect_error_saying_how_to_trust_it(echo_url):
    async with async_client(timeout=10) as client:
        with pytest.raises(httpx.ConnectError) as raised:
            await client.get(f"{echo_url}/x")
    message = str(raised.value)
    assert echo_url in message and "does not trust" in message
    assert "verify=ssl.create_default_context(cafile=...)" in message
    # the shared pool of post_json checks certificates the same way
    try:
        with pytest.raises(httpx.ConnectError, match="does not trust"):
            await post_json(f"{echo_url}/v1", {"q": 1})
    finally:
        await aclose_shared_transport()
    async with async_client(verify=False, timeout=10) as unchecked:
        assert (await unchecked.get(f"{echo_url}/x")).status_code == 201


async def test_a_refused_https_connection_is_a_connect_error_not_a_timeout():
    async with async_client(timeout=10) as client:
        with pytest.raises(httpx.ConnectError) as raised:
            await client.get(f"https://127.0.0.1:{free_port()}/x")
    assert not isinstance(raised.value, httpx.TimeoutException)


async def test_the_polling_protocol_over_https(certificate, artifact_root):
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    app = create_rollout_server(backend=backend, configure_logging=False)
    async for url in serve_tls(app, certificate):
        http = async_client(verify=certificate.trusting_context(), timeout=30)
        async with RolloutClient(url, http_client=http) as client:
            result = await client.run_rollout_async(
                [{"role": "user", "content": "What is 6 * 7?"}],
                "http://127.0.0.1:9/v1",
                label="42",
                metadata={"reward": 0.5},
                rollout_id="tls-1",
            )
            health = await client.health()
        await http.aclose()
    assert (result.status.value, result.sample and result.sample.reward) == ("success", 0.5)
    assert health["lifecycle"]["accepting_rollouts"] is True


async def test_bad_client_options_are_usage_errors_naming_the_value():
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_connections": 0}, "max_connections must be a whole number >= 1, got 0"),
        ({"max_connections": True}, "got True"),
        ({"verify": "/etc/ca.pem"}, "got str '/etc/ca.pem': for a CA file pass"),
        ({"http2": True}, "does not take http2=True"),
        ({"limits": httpx.Limits(max_connections=3)}, "pass max_connections= instead"),
        ({"transport": httpx.AsyncHTTPTransport()}, "build httpx.AsyncClient(transport=...)"),
    ]
    for options, message in cases:
        with pytest.raises(UsageError) as raised:
            async_client(**options)
        assert message in str(raised.value), (options, str(raised.value))
    with pytest.raises(UsageError, match=r"needs an http:// or https:// URL, got '127.0.0.1:8/v1'"):
        await post_json("127.0.0.1:8/v1", {})
    with pytest.raises(UsageError, match=r"timeout must be a number of seconds > 0, got 0"):
        await post_json("http://127.0.0.1:9/v1", {}, timeout=0)
