"""The sandbox's network: endpoints, the routes a restricted network keeps open, and the host
side that relays them.

``no-network`` gives the sandbox its own network namespace (loopback only); ``allowlist`` does
the same and forwards ports 80 and 443 of each allowed host name or IPv4 address (the name
resolves inside through ``/etc/hosts``) and of every address of an allowed IPv4 CIDR range
(made local inside). :class:`Forwarder` moves between policies as phases change. In both,
each endpoint in ``forward_endpoints`` stays
reachable at its own address and port: this process listens inside the namespace (the socket
is created by a short-lived thread that joins it) and relays each connection to the real
endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import os
import socket
import struct
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from osmosis_ai.rollout.backend.harbor.errors import SandboxError

__all__ = [
    "ALLOWLIST_PORTS",
    "Endpoint",
    "Forwarder",
    "Route",
    "add_loopback_address",
    "listen_in_netns",
    "parse_endpoint",
    "plan_routes",
]

ALLOWLIST_PORTS = (80, 443)
_CLONE_NEWNET = 0x40000000


# -- endpoints -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """A TCP endpoint (host name or address, port) the sandbox must be able to reach."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(value: object) -> Endpoint:
    """An :class:`Endpoint` from a URL, ``"host:port"``, ``(host, port)`` or an Endpoint."""
    if isinstance(value, Endpoint):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2:  # pyright: ignore[reportUnknownArgumentType]
        host, port = value  # pyright: ignore[reportUnknownVariableType]
        return _checked_endpoint(str(host), port, value)
    if isinstance(value, str):
        text = value.strip()
        parsed = urlsplit(text if "://" in text else f"tcp://{text}")
        try:
            port = parsed.port
        except ValueError:
            port = None
        if port is None and parsed.scheme in ("http", "https"):
            port = 443 if parsed.scheme == "https" else 80
        if parsed.hostname and port is not None:
            return _checked_endpoint(parsed.hostname, port, value)
    raise ValueError(
        f"forward_endpoints entry {value!r} is not an endpoint: give a URL "
        "(http://127.0.0.1:8000/v1), 'host:port' or a (host, port) pair"
    )


def _checked_endpoint(host: str, port: object, original: object) -> Endpoint:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"forward_endpoints entry {original!r}: the port must be 1-65535")
    if not host:
        raise ValueError(f"forward_endpoints entry {original!r}: the host is empty")
    return Endpoint(host, port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _ipv4(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 4
    except ValueError:
        return False


@dataclass(frozen=True)
class Route:
    """Listen inside the sandbox at (listen_host, port); relay to target. A route with
    ``networks`` listens on every address (``0.0.0.0``) and relays a connection to the address
    it was made to, on the same port, when that address is in one of them (an allowlisted
    CIDR range, made local inside); other connections are closed."""

    listen_host: str
    port: int
    target: Endpoint
    networks: tuple[str, ...] = ()

    def destination(self, local_address: str) -> Endpoint | None:
        """Where a connection accepted at ``local_address`` goes, or None."""
        if not self.networks:
            return self.target
        try:
            address = ipaddress.ip_address(local_address)
        except ValueError:
            return None
        for network in self.networks:
            if address in ipaddress.ip_network(network, strict=False):
                return Endpoint(local_address, self.port)
        return None


def _cidr(entry: str) -> str | None:
    """``entry`` as an IPv4 range wider than one address (``10.0.0.0/8``), or None."""
    if "/" not in entry:
        return None
    try:
        network = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None
    if network.version != 4 or network.prefixlen == 32:
        return None
    return str(network)


def plan_routes(
    endpoints: Iterable[Endpoint], allowed_hosts: Iterable[str]
) -> tuple[list[Route], dict[str, str], list[str]]:
    """Forwarding routes, /etc/hosts names, and extra loopback addresses (and, for CIDR
    entries, ranges) to make local inside."""
    routes: dict[tuple[str, int], Route] = {}
    names: dict[str, str] = {}
    addresses: list[str] = []
    next_alias = [2]

    def listen_address(host: str) -> str:
        if _is_loopback(host):
            return "127.0.0.1" if host == "localhost" else host
        if _ipv4(host):
            if host not in addresses:
                addresses.append(host)
            return host
        if host not in names:
            names[host] = f"127.0.100.{next_alias[0]}"
            next_alias[0] += 1
        return names[host]

    def add(host: str, port: int) -> None:
        listen = listen_address(host)
        routes.setdefault((listen, port), Route(listen, port, Endpoint(host, port)))

    networks: list[str] = []
    for endpoint in endpoints:
        add(endpoint.host, endpoint.port)
    for entry in allowed_hosts:
        if (network := _cidr(entry)) is not None:
            if network not in networks:
                networks.append(network)
            continue
        host = entry.removesuffix("/32")
        for port in ALLOWLIST_PORTS:
            add(host, port)
    if networks:
        addresses += networks
        for port in ALLOWLIST_PORTS:
            anywhere = Endpoint("0.0.0.0", port)
            routes[("0.0.0.0", port)] = Route("0.0.0.0", port, anywhere, tuple(networks))
    return list(routes.values()), names, addresses


# -- the host side of forwarding -------------------------------------------------------------


def listen_in_netns(netns_path: str, addresses: Sequence[tuple[str, int]]) -> list[socket.socket]:
    """Listening TCP sockets created inside the network namespace at ``netns_path``.

    A new thread joins the namespace (only that thread switches), creates the sockets and
    ends; the sockets keep the namespace they were made in.
    """
    result: list[socket.socket] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns({netns_path}): {os.strerror(code)}")
            finally:
                os.close(fd)
            for host, port in addresses:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                # an address's own listener and a range's listener on every address share a
                # port; the kernel hands a connection to the most specific one. Only sockets
                # of this (host) user may join them.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((host, port))
                sock.listen(128)
                sock.setblocking(False)
                result.append(sock)
        except BaseException as exc:
            failure.append(exc)
            for sock in result:
                sock.close()

    thread = threading.Thread(target=work, name="sandbox-netns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise SandboxError(f"could not listen inside the sandbox network: {failure[0]}")
    return result


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


class Forwarder:
    """The trial's own network namespace seen from the host: the loopback addresses added to
    it and, per route, a listener inside it whose connections are relayed to the route's
    endpoint from the host. :meth:`apply` moves it to another set of routes (a new phase's
    policy): listeners of routes that are gone close, with the connections they relay."""

    def __init__(self, netns_path: str) -> None:
        self._netns = netns_path
        self._addresses: set[str] = set()
        self._servers: dict[Route, asyncio.Server] = {}
        self._tasks: dict[Route, set[asyncio.Task[None]]] = {}

    async def apply(self, routes: Sequence[Route], addresses: Sequence[str]) -> None:
        for address in addresses:
            if address not in self._addresses:
                # the host's own ip, in the trial's network namespace only (the trial's
                # root has no capability to add addresses)
                await asyncio.to_thread(add_loopback_address, self._netns, address)
                self._addresses.add(address)
        wanted = set(routes)
        for route in [r for r in self._servers if r not in wanted]:
            await self._close(route)
        new = [r for r in dict.fromkeys(routes) if r not in self._servers]
        if not new:
            return
        sockets = await asyncio.to_thread(
            listen_in_netns, self._netns, [(r.listen_host, r.port) for r in new]
        )
        for sock, route in zip(sockets, new, strict=True):
            self._tasks[route] = set()
            self._servers[route] = await asyncio.start_server(
                lambda r, w, route=route: self._relay(r, w, route), sock=sock
            )

    async def _relay(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: Route
    ) -> None:
        tasks = self._tasks.get(route)
        task = asyncio.current_task()
        if tasks is None or task is None:
            writer.close()
            return
        tasks.add(task)  # pyright: ignore[reportArgumentType]
        try:
            local = writer.get_extra_info("sockname")
            target = route.destination(str(local[0]) if local else "")
            if target is None:
                _refuse(writer)
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(target.host, target.port)
            except OSError:
                writer.close()
                return
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.close()
                writer.close()
        finally:
            tasks.discard(task)  # pyright: ignore[reportArgumentType]

    async def _close(self, route: Route) -> None:
        server = self._servers.pop(route)
        server.close()
        for task in list(self._tasks.pop(route, ())):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), timeout=1.0)

    async def close(self) -> None:
        for route in list(self._servers):
            await self._close(route)


def _refuse(writer: asyncio.StreamWriter) -> None:
    """Reset an accepted connection (as a refused one would be): nothing was relayed."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def add_loopback_address(netns: str, address: str) -> None:
    """Make ``address`` (or a CIDR range) local in the network namespace at ``netns``."""
    command = (
        ["ip", "route", "replace", "local", address, "dev", "lo"]
        if "/" in address
        else ["ip", "addr", "add", f"{address}/32", "dev", "lo"]
    )
    result = subprocess.run(
        ["nsenter", f"--net={netns}", *command],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        raise SandboxError(
            f"could not add {address} to the sandbox's loopback: {result.stderr.strip()}"
        )
