"""Platform benchmark: one `osmosis platform serve` process, measured from outside.

Figures, in one run against the same server:

* start-up: `osmosis platform serve` from spawn to the first 200 of ``/api/health``, on a
  fresh data dir (migrations included) and restarted on the migrated one;
* ``dataset list``: a page of 50 out of 1,000 datasets, ``--clients`` concurrent clients
  (closed loop, keep-alive) for ``--duration`` seconds: requests/s, p50/p99, errors, and
  the CPU the server and this process (the load generator, sharing the machine's cores)
  used meanwhile, in cores, so a generator that starves the server shows;
* a ``--upload-mb`` upload over loopback the way the CLI sends it (create, multipart PUTs
  streamed from the file, complete): MB/s, and the server's RSS growth during it;
* with ``--postgres`` (or ``--database-url``) the list figures again on PostgreSQL.

Targets (printed beside the figures, never asserted): list >= 500 req/s at p99 <= 250 ms,
upload >= 200 MB/s with RSS growth <= 50 MB, start-up <= 1.5 s.

    .venv/bin/python bench/platform_service.py
    .venv/bin/python bench/platform_service.py --quick --upload-mb 256
    .venv/bin/python bench/platform_service.py --postgres   # also on a PostgreSQL it starts
"""

# ruff: noqa: E402  (this file shares its name with the standard library's platform module)
from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder comes first on sys.path and would shadow ``import platform``.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psutil

from osmosis_ai.platform.auth import issue_token
from osmosis_ai.platform.services.accounts import add_member, create_user, create_workspace
from osmosis_ai.platform.settings import load_settings
from osmosis_ai.platform.store.database import open_database
from osmosis_ai.platform.store.orm import Dataset, utcnow
from osmosis_ai.rollout.http1 import LeanTransport
from osmosis_ai.testing.serving import free_port

ROOT = Path(__file__).resolve().parents[1]
OSMOSIS = Path(sys.executable).with_name("osmosis")
REPO = "bench/platform"
TARGETS = {"list_rps": 500.0, "list_p99_ms": 250.0, "upload_mbps": 200.0, "rss_mb": 50.0}
START_TARGET_S = 1.5


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    started_s: float

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(data_dir: Path, database_url: str | None, port: int) -> Server:
    command = [
        str(OSMOSIS), "platform", "serve", "--data-dir", str(data_dir),
        "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    if database_url:
        command += ["--database-url", database_url]
    url = f"http://127.0.0.1:{port}"
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    with httpx.Client(timeout=1) as client:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"osmosis platform serve exited with {process.returncode}")
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"{url}/api/health").status_code == 200:
                    break
            time.sleep(0.005)
    return Server(process, url, time.perf_counter() - began)


def seed(data_dir: Path, database_url: str | None, port: int, datasets: int) -> str:
    """A user in a workspace with ``datasets`` ready datasets; returns the user's token."""
    settings = load_settings(data_dir=data_dir, database_url=database_url, port=port)
    database = open_database(settings)
    try:
        with database.transaction() as session:
            user = create_user(session, "bench@example.com", name="Bench")
            workspace = create_workspace(session, "bench", repo=REPO, clone_url="/dev/null")
            add_member(session, workspace, user, role="owner")
            now = utcnow()
            preview = [
                {"user_prompt": f"{i} * 2 = ?", "ground_truth": str(2 * i)} for i in range(5)
            ]
            for index in range(datasets):
                created = now - dt.timedelta(seconds=datasets - index)
                session.add(
                    Dataset(
                        workspace_id=workspace.id,
                        file_name=f"dataset-{index:04d}",
                        extension="jsonl",
                        file_size=1000 + index,
                        status="uploaded",
                        row_count=100,
                        data_preview=preview,
                        file_format="jsonl",
                        original_file_format="jsonl",
                        original_file_size=1000 + index,
                        creator_id=user.id,
                        created_at=created,
                        updated_at=created,
                    )
                )
            token = issue_token(
                session, user, platform_url=settings.public_url, name="bench", now=now
            )
        return token.raw
    finally:
        database.dispose()


def headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "X-Osmosis-Git": REPO}


# --- dataset list under load -----------------------------------------------------------------


LIST_PATH = "/api/cli/datasets?limit=50&offset=0"
HEALTH_PATH = "/api/health"


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def list_load(
    url: str,
    token: str,
    clients: int,
    duration: float,
    warmup: float,
    server_pid: int,
    path: str = LIST_PATH,
) -> dict:
    """Closed-loop load from this process; also the CPU this process (the load generator)
    and the server used while it was measured, in cores (1.0 = one core busy)."""
    transport = LeanTransport(max_connections=clients)
    latencies: list[float] = []
    errors = 0
    target = f"{url}{path}"
    expect_page = path == LIST_PATH
    server, generator = psutil.Process(server_pid), psutil.Process()
    marks: list[tuple[float, float, float]] = []

    def mark() -> None:
        marks.append((time.perf_counter(), cpu_seconds(server), cpu_seconds(generator)))

    async with httpx.AsyncClient(transport=transport, headers=headers(token), timeout=30) as client:
        loop = asyncio.get_running_loop()
        opens = loop.time() + warmup
        closes = opens + duration
        loop.call_at(opens, mark)
        loop.call_at(closes, mark)

        async def worker() -> None:
            nonlocal errors
            while (now := loop.time()) < closes:
                began = time.perf_counter()
                try:
                    answer = await client.get(target)
                    ok = answer.status_code == 200 and (
                        not expect_page or len(answer.json()["datasets"]) == 50
                    )
                except httpx.HTTPError:
                    ok = False
                took = time.perf_counter() - began
                if now >= opens:
                    if ok:
                        latencies.append(took)
                    else:
                        errors += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
    (began, server_began, generator_began), (ended, server_ended, generator_ended) = marks
    latencies.sort()
    count = len(latencies)

    def pct(q: float) -> float:
        return latencies[min(count - 1, int(q * count))] * 1000 if count else float("nan")

    return {
        "requests_per_s": count / duration,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "errors": errors,
        "requests": count,
        "server_cpu": (server_ended - server_began) / (ended - began),
        "generator_cpu": (generator_ended - generator_began) / (ended - began),
    }


# --- one large upload --------------------------------------------------------------------------


def make_file(path: Path, megabytes: int) -> int:
    """A valid prompt dataset of about ``megabytes`` MB (rows of ~1 KB)."""
    filler = "x" * 900
    with path.open("w") as out:
        index = 0
        while out.tell() < megabytes * 1024 * 1024:
            row = {"user_prompt": f"{index} {filler}", "ground_truth": str(index)}
            out.write(json.dumps(row) + "\n")
            index += 1
    return path.stat().st_size


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.baseline = self.process.memory_info().rss
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class _Slice:
    """``size`` bytes of an open file from ``offset``, read in chunks as httpx sends them."""

    def __init__(self, path: Path, offset: int, size: int) -> None:
        self.path, self.offset, self.size = path, offset, size

    def __iter__(self) -> Iterator[bytes]:
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            left = self.size
            while left:
                chunk = handle.read(min(left, 1 << 20))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk


def upload(url: str, token: str, path: Path, pid: int) -> dict:
    size = path.stat().st_size
    with httpx.Client(base_url=url, headers=headers(token), timeout=600) as api:
        with RssSampler(pid) as rss:
            began = time.perf_counter()
            payload = {"file_name": "big", "file_size": size, "extension": "jsonl"}
            created = api.post("/api/cli/datasets", json=payload)
            created.raise_for_status()
            dataset = created.json()
            plan = dataset["upload"]
            parts: list[dict[str, object]] = []
            with httpx.Client(timeout=600) as storage:
                if plan["method"] == "simple":
                    sent = storage.put(
                        plan["presigned_url"],
                        content=_Slice(path, 0, size),
                        headers={**plan["upload_headers"], "Content-Length": str(size)},
                    )
                    sent.raise_for_status()
                else:
                    for entry in plan["presigned_urls"]:
                        offset = (entry["part_number"] - 1) * plan["part_size"]
                        sent = storage.put(
                            entry["presigned_url"],
                            content=_Slice(path, offset, entry["size"]),
                            headers={"Content-Length": str(entry["size"])},
                        )
                        sent.raise_for_status()
                        etag = sent.headers["etag"].strip('"')
                        parts.append({"PartNumber": entry["part_number"], "ETag": etag})
            sent_s = time.perf_counter() - began
            body = {"file_extension": "jsonl", **({"parts": parts} if parts else {})}
            done = api.post(f"/api/cli/datasets/{dataset['id']}/complete", json=body)
            done.raise_for_status()
            took = time.perf_counter() - began
        processed = _wait_processed(api, dataset["id"])
    return {
        "megabytes": size / 1e6,
        "method": plan["method"],
        "seconds": took,
        "send_s": sent_s,
        "complete_s": took - sent_s,
        "mb_per_s": size / 1e6 / took,
        "rss_growth_mb": (rss.peak - rss.baseline) / 1e6,
        "status_after_complete": done.json()["status"],
        "processing_s": processed[1],
        "final_status": processed[0],
    }


def disk_copy(source: Path, target: Path) -> float:
    """The same file copied on the same disk and fsynced: the ceiling of an upload's MB/s."""
    began = time.perf_counter()
    with source.open("rb") as reading, target.open("wb") as writing:
        while chunk := reading.read(1 << 20):
            writing.write(chunk)
        writing.flush()
        os.fsync(writing.fileno())
    took = time.perf_counter() - began
    size = target.stat().st_size
    target.unlink()
    return size / 1e6 / took


def _wait_processed(api: httpx.Client, dataset_id: str) -> tuple[str, float]:
    began = time.perf_counter()
    while True:
        status = api.get(f"/api/cli/datasets/{dataset_id}").json()["status"]
        if status != "processing":
            return status, time.perf_counter() - began
        time.sleep(0.2)


# --- the run -----------------------------------------------------------------------------------


def run_database(label: str, database_url: str | None, args: argparse.Namespace) -> dict:
    results: dict[str, object] = {"database": label}
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-platform-") as tmp:
        data_dir = Path(tmp) / "data"
        port = free_port()
        fresh = start_server(data_dir, database_url, port)
        fresh.stop()
        token = seed(data_dir, database_url, port, args.datasets)
        server = start_server(data_dir, database_url, port)
        results["start_fresh_s"] = fresh.started_s
        results["start_migrated_s"] = server.started_s
        try:
            load = (server.url, token, args.clients, args.duration, args.warmup, server.process.pid)
            results["list"] = asyncio.run(list_load(*load))
            results["health"] = asyncio.run(list_load(*load, path=HEALTH_PATH))
            if args.upload_mb and not args.skip_upload:
                source = Path(tmp) / "big.jsonl"
                make_file(source, args.upload_mb)
                results["upload"] = upload(server.url, token, source, server.process.pid)
                results["disk_copy_mbps"] = disk_copy(source, Path(tmp) / "copy.jsonl")
        finally:
            server.stop()
    return results


def cpu_shares(figures: dict) -> str:
    return (
        f"server {figures['server_cpu']:.2f}, load generator {figures['generator_cpu']:.2f} "
        f"(of {os.cpu_count()})"
    )


def report(results: dict) -> None:
    label = results["database"]
    print(f"\n== {label}")
    print(
        f"start-up  fresh {results['start_fresh_s']:.2f} s   "
        f"migrated {results['start_migrated_s']:.2f} s   (target <= {START_TARGET_S} s)"
    )
    figures = results["list"]
    print(
        f"dataset list  {figures['requests_per_s']:.0f} req/s  p50 {figures['p50_ms']:.1f} ms  "
        f"p99 {figures['p99_ms']:.1f} ms  errors {figures['errors']}  "
        f"(target >= {TARGETS['list_rps']:.0f} req/s, p99 <= {TARGETS['list_p99_ms']:.0f} ms)"
    )
    print(f"  CPU in cores: {cpu_shares(figures)}")
    health = results["health"]
    print(
        f"  baseline GET /api/health  {health['requests_per_s']:.0f} req/s  "
        f"p99 {health['p99_ms']:.1f} ms (the same server and clients, no auth, no database)"
    )
    print(f"  CPU in cores: {cpu_shares(health)}")
    if "upload" in results:
        up = results["upload"]
        print(
            f"upload  {up['megabytes']:.0f} MB {up['method']}  {up['mb_per_s']:.0f} MB/s  "
            f"server RSS +{up['rss_growth_mb']:.1f} MB  "
            f"(target >= {TARGETS['upload_mbps']:.0f} MB/s, <= {TARGETS['rss_mb']:.0f} MB)"
        )
        print(
            f"  sending {up['send_s']:.2f} s, complete {up['complete_s']:.2f} s; baseline: "
            f"the file copied on the same disk {results['disk_copy_mbps']:.0f} MB/s"
        )
        print(
            f"  then processing {up['processing_s']:.1f} s -> {up['final_status']} "
            f"(status when complete answered: {up['status_after_complete']})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--datasets", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--upload-mb", type=int, default=1024)
    parser.add_argument("--skip-upload", action="store_true")
    parser.add_argument("--quick", action="store_true", help="5 s of list load")
    parser.add_argument(
        "--postgres", action="store_true", help="also on a PostgreSQL started for the run"
    )
    parser.add_argument("--database-url", help="also on this PostgreSQL database (empty)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.warmup = 5.0, 1.0
    runs = [run_database("SQLite", None, args)]
    if args.database_url:
        runs.append(run_database("PostgreSQL", args.database_url, args))
    elif args.postgres:
        sys.path.insert(0, str(ROOT / "tests"))
        from platform_support import PostgresServer

        postgres = PostgresServer().start()
        try:
            runs.append(run_database("PostgreSQL", postgres.create_database(), args))
        finally:
            postgres.stop()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(
        f"platform bench: {os.cpu_count()} CPUs (load average {load} at the end), "
        f"{args.clients} clients, {args.datasets} datasets"
    )
    for results in runs:
        report(results)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
