"""Rollout-server benchmark: our server against a do-nothing ceiling, one table, one run.

Measures ``import osmosis_ai.rollout`` in fresh interpreters, starts the scripted model
(0 ms and 50 ms latency; a multiply tool call, then ``#### 42``), the rollout servers and
the trivial server (``bench/trivial_server.py``), each in its own process, then runs
``bench/loadgen.py`` (its own process too) for every generation x concurrency against the
ceiling and against each workflow, sampling the servers' RSS and CPU. Workflows: ``bare``
(``bench/rollouts/bare/main.py``, at each model latency) and the bundled multiply templates
``openai-agents`` and ``strands`` (unmodified template code, 0 ms model), each also served
by another osmosis-ai build when ``--baseline-python`` names an interpreter that has one.
Prints the table and the targets, as ratios measured in the same run::

    python bench/rollout_server.py [--quick] [--generations polling,callback]
                                   [--workflows bare,openai-agents,strands]
                                   [--baseline-python PATH] [--url URL] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from osmosis_ai.testing.serving import free_port

BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable
MIB = 1024 * 1024
IMPORT_RUNS = 5
IMPORT_PLAIN = "import osmosis_ai.rollout"
IMPORT_AUTHOR = (
    "from osmosis_ai.rollout import AgentWorkflow, Grader, LocalBackend, "
    "AgentWorkflowOutput, GraderContext"
)
TARGET_IMPORT_MS = 150.0
TARGET_P50_MS = 10.0
TARGET_RATIO = 0.5
TARGET_RSS_MIB = 150.0
TARGET_FRAMEWORK_SPEEDUP = 5.0
SATURATING = 16  # a closed loop this wide keeps a rollout server busy
TEMPLATES = BENCH.parent / "src" / "osmosis_ai" / "templates"
FRAMEWORKS = {  # workflow -> (bundled template, the module its framework needs)
    "openai-agents": ("multiply-local-openai", "agents"),
    "strands": ("multiply-local-strands", "strands"),
}
WORKFLOWS = ("bare", *FRAMEWORKS)


@dataclass
class Settings:
    generations: list[str]
    concurrencies: list[int]
    latencies: list[float]
    duration: float
    warmup: float
    min_rollouts: int
    url: str | None
    server_pid: int | None
    json_path: Path | None
    model_clients: int
    rollout_timeout: float
    workflows: list[str] = field(default_factory=lambda: list(WORKFLOWS))
    baseline_python: str | None = None
    baseline_generations: list[str] = field(default_factory=lambda: ["polling"])
    workers: int = 1
    generator: str = "httpx"
    repeat: int = 1


@dataclass
class Cell:
    generation: str
    server: str  # "ours" | "ceiling" | "baseline"
    concurrency: int
    model_latency_ms: float | None
    result: dict[str, Any]
    rss_start_mib: float | None
    rss_peak_mib: float | None
    server_cpu_ms_per_rollout: float | None
    ratio: float | None = None  # to the ceiling
    workflow: str = "-"
    speedup: float | None = None  # ours / baseline, same workflow, generation, concurrency
    rates: list[float] = field(default_factory=list)  # every round's rate (--repeat)
    speedups: list[float] = field(default_factory=list)  # every round's ours / baseline

    @property
    def rate(self) -> float:
        return float(self.result.get("rollouts_per_s") or 0.0)


@dataclass
class Target:
    name: str
    passed: bool | None
    figure: str
    informational: bool = False  # a figure printed beside the targets, not one of them


@dataclass
class Report:
    environment: dict[str, Any]
    imports: dict[str, Any]
    cells: list[Cell] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    wall_s: float = 0.0


# -- processes -------------------------------------------------------------------------------


class Processes:
    """Every child this run started; all are ended on exit, by pid."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.children: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Any:
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches only the runner, which ends them
            cwd=BENCH.parent,
        )
        log.close()
        self.children.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc in self.children:
            self.children.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.children)):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.stop(proc)

    def tail(self, name: str, lines: int = 20) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_healthy(
    url: str, proc: subprocess.Popen[bytes] | None, what: str, limit_s: float = 30.0
) -> None:
    deadline = time.monotonic() + limit_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what} exited with code {proc.returncode} during start-up")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/health").status_code == 200:
                    return
            time.sleep(0.05)
    raise RuntimeError(f"{what} at {url} did not answer GET /health within {limit_s:g} s")


class Sampler:
    """Samples a server's RSS (peak) and CPU time while a cell runs: its process and its
    children (worker processes), summed; shared copy-on-write pages count once per process."""

    def __init__(self, pid: int | None) -> None:
        self.proc = psutil.Process(pid) if pid is not None else None
        self.start_rss: float | None = None
        self.peak_rss: float | None = None
        self.cpu_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._cpu0 = 0.0

    def _family(self) -> list[psutil.Process]:
        assert self.proc is not None
        return [self.proc, *self.proc.children(recursive=True)]

    def _cpu(self) -> float:
        total = 0.0
        for proc in self._family():
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def _rss(self) -> float:
        total = 0
        for proc in self._family():
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total / MIB

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(psutil.Error):
                self.peak_rss = max(self.peak_rss or 0.0, self._rss())

    def __enter__(self) -> Sampler:
        if self.proc is not None:
            with contextlib.suppress(psutil.Error):
                self.start_rss = self.peak_rss = self._rss()
                self._cpu0 = self._cpu()
                self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join(2.0)
        with contextlib.suppress(psutil.Error):
            self.peak_rss = max(self.peak_rss or 0.0, self._rss())
            self.cpu_s = self._cpu() - self._cpu0


def pid_listening_on(url: str) -> int | None:
    """The pid listening on the URL's port, when the OS lets us see it."""
    port = httpx.URL(url).port
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return conn.pid
    return None


# -- measurements ----------------------------------------------------------------------------


def time_import(statement: str, runs: int = IMPORT_RUNS) -> list[float]:
    """Milliseconds ``statement`` takes in ``runs`` fresh interpreters."""
    code = f"import time\nt = time.perf_counter()\n{statement}\nprint(time.perf_counter() - t)"
    out: list[float] = []
    for _ in range(runs):
        done = subprocess.run(
            [PYTHON, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        out.append(float(done.stdout.strip()) * 1000.0)
    return out


def heaviest_imports(statement: str, top: int = 6) -> list[tuple[str, float]]:
    """The packages with the largest cumulative import time (``-X importtime``), in ms."""
    done = subprocess.run(
        [PYTHON, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    totals: dict[str, float] = {}
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].strip()
        if "." in name and not name.startswith("osmosis_ai"):
            continue
        totals[name] = max(totals.get(name, 0.0), int(parts[1]) / 1000.0)
    return sorted(totals.items(), key=lambda item: -item[1])[:top]


def run_cell(
    settings: Settings,
    generation: str,
    server: str,
    url: str,
    pid: int | None,
    concurrency: int,
    chat_url: str,
    latency: float | None,
    procs: Processes,
    expect_reward: bool,
    workflow: str = "-",
) -> Cell:
    argv = [
        PYTHON,
        str(BENCH / "loadgen.py"),
        "--url",
        url,
        "--generation",
        generation,
        "--concurrency",
        str(concurrency),
        "--duration",
        str(settings.duration),
        "--warmup",
        str(settings.warmup),
        "--min-rollouts",
        str(settings.min_rollouts),
        "--chat-url",
        chat_url,
        "--timeout",
        str(settings.rollout_timeout),
        "--generator",
        settings.generator,
    ]
    if expect_reward:
        argv += ["--expect-reward", "1.0"]
    limit = settings.warmup + max(settings.duration * 3, settings.duration + 6)
    limit += 2 * settings.rollout_timeout + 60
    with Sampler(pid) as sampler:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        procs.children.append(proc)
        try:
            out, err = proc.communicate(timeout=limit)
        finally:
            procs.stop(proc)
    if proc.returncode != 0 or not out.strip():
        tail = err.decode(errors="replace")[-2000:]
        result: dict[str, Any] = {"errors": 1, "error_kinds": {"loadgen_crashed": 1}, "log": tail}
    else:
        result = json.loads(out.decode().strip().splitlines()[-1])
    cpu_ms = None
    if sampler.cpu_s is not None and result.get("finished_total"):
        # Server CPU over the whole loadgen run per rollout it finished (warm-up and drain too).
        cpu_ms = 1000.0 * sampler.cpu_s / result["finished_total"]
    return Cell(
        generation=generation,
        server=server,
        concurrency=concurrency,
        model_latency_ms=latency,
        result=result,
        rss_start_mib=sampler.start_rss,
        rss_peak_mib=sampler.peak_rss,
        server_cpu_ms_per_rollout=cpu_ms,
        workflow=workflow,
    )


def environment() -> dict[str, Any]:
    def have(name: str) -> bool:
        return importlib.util.find_spec(name) is not None

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "uvloop": have("uvloop"),
        "httptools": have("httptools"),
        "sniffio": have("sniffio"),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Server:
    """One rollout server under test: a workflow served by ours or by the baseline build."""

    workflow: str
    server: str  # "ours" | "baseline"
    url: str
    pid: int | None
    proc: subprocess.Popen[bytes] | None
    latencies: list[float]


def workflow_script(workflow: str) -> Path:
    if workflow == "bare":
        return BENCH / "rollouts" / "bare" / "main.py"
    template = FRAMEWORKS[workflow][0]
    return TEMPLATES / template / "rollouts" / template / "main.py"


def runnable_workflows(settings: Settings) -> list[str]:
    """The requested workflows whose framework is installed here; says which are skipped."""
    chosen: list[str] = []
    for workflow in settings.workflows:
        module = FRAMEWORKS[workflow][1] if workflow in FRAMEWORKS else None
        if module is not None and importlib.util.find_spec(module) is None:
            print(
                f"skipping the {workflow} workflow: `{module}` is not installed here "
                f"(pip install -e '.[{workflow}]')"
            )
            continue
        chosen.append(workflow)
    return chosen


def start_servers(
    settings: Settings, generation: str, procs: Processes, artifacts: Path
) -> list[Server]:
    """Every server of one generation, started and healthy (fresh state per generation)."""
    if settings.url is not None:
        url = settings.url.rstrip("/")
        pid = settings.server_pid or pid_listening_on(url)
        return [Server("url", "ours", url, pid, None, settings.latencies)]
    servers: list[Server] = []
    for workflow in runnable_workflows(settings):
        builds = [("ours", PYTHON)]
        if (
            workflow in FRAMEWORKS
            and settings.baseline_python
            and generation in settings.baseline_generations
        ):
            builds.append(("baseline", settings.baseline_python))
        for server, python in builds:
            port = free_port()
            name = f"{workflow}-{server}-{generation}"
            proc = procs.start(
                name,
                [python, str(BENCH / "serve_template.py"), str(workflow_script(workflow))],
                env={
                    "_OSMOSIS_ROLLOUT_PORT": str(port),
                    "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(artifacts / name),
                    "BENCH_MODEL_CLIENTS": str(settings.model_clients),
                    # our build only: the original has no worker processes
                    "OSMOSIS_ROLLOUT_WORKERS": str(settings.workers if server == "ours" else 1),
                    # offline: LiteLLM (in the original build) would retry a download
                    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                },
            )
            url = f"http://127.0.0.1:{port}"
            # the original build imports LiteLLM at start-up: 12-15 s here when idle
            wait_healthy(url, proc, f"{name} rollout server", 30.0 if server == "ours" else 300.0)
            latencies = settings.latencies if workflow == "bare" else settings.latencies[:1]
            servers.append(Server(workflow, server, url, proc.pid, proc, latencies))
    return servers


def benchmark(settings: Settings, report: Report, procs: Processes, artifacts: Path) -> None:
    models: dict[float, str] = {}
    for latency in settings.latencies:
        port = free_port()
        proc = procs.start(
            f"model-{latency:g}ms",
            [
                PYTHON,
                str(BENCH / "scripted_model.py"),
                "--port",
                str(port),
                "--latency-ms",
                str(latency),
            ],
        )
        wait_healthy(f"http://127.0.0.1:{port}", proc, f"scripted model ({latency:g} ms)")
        models[latency] = f"http://127.0.0.1:{port}/v1"

    trivial_port = free_port()
    trivial = procs.start(
        "trivial", [PYTHON, str(BENCH / "trivial_server.py"), "--port", str(trivial_port)]
    )
    trivial_url = f"http://127.0.0.1:{trivial_port}"
    wait_healthy(trivial_url, trivial, "trivial server")
    first_chat = models[settings.latencies[0]]

    for generation in settings.generations:
        servers = start_servers(settings, generation, procs, artifacts)
        for concurrency in settings.concurrencies:
            ceiling = run_cell(
                settings,
                generation,
                "ceiling",
                trivial_url,
                trivial.pid,
                concurrency,
                first_chat,
                None,
                procs,
                expect_reward=True,
            )
            ceiling.rates = [ceiling.rate]
            report.cells.append(ceiling)
            print_row(ceiling)
            # Every round measures each server once, a baseline right after its twin of ours,
            # so a ratio compares two runs seconds apart; the rows are the median rounds.
            rounds: dict[tuple[str, str, float], list[Cell]] = {}
            for round_ in range(settings.repeat):
                for server in servers:
                    for latency in server.latencies:
                        cell = run_cell(
                            settings,
                            generation,
                            server.server,
                            server.url,
                            server.pid,
                            concurrency,
                            models[latency],
                            latency,
                            procs,
                            expect_reward=settings.url is None,
                            workflow=server.workflow,
                        )
                        cell.ratio = cell.rate / ceiling.rate if ceiling.rate > 0 else None
                        runs = rounds.setdefault((server.server, server.workflow, latency), [])
                        runs.append(cell)
                        if settings.repeat == 1:
                            continue
                        print(
                            f"{'':>12}round {round_ + 1}/{settings.repeat}: {server.server} "
                            f"{server.workflow} {cell.rate:.1f}/s",
                            file=sys.stderr,
                            flush=True,
                        )
            for server in servers:
                for latency in server.latencies:
                    runs = rounds[(server.server, server.workflow, latency)]
                    cell = median_round(runs)
                    if server.server == "baseline":
                        mine = _find(
                            report, generation, "ours", concurrency, latency, server.workflow
                        )
                        if mine is not None:
                            ours = rounds[("ours", server.workflow, latency)]
                            mine.speedups = [
                                a.rate / b.rate for a, b in zip(ours, runs, strict=True) if b.rate
                            ]
                            if mine.speedups:
                                mine.speedup = statistics.median(mine.speedups)
                    report.cells.append(cell)
                    print_row(cell)
        for server in servers:
            if server.proc is not None:
                procs.stop(server.proc)
        shutil.rmtree(artifacts, ignore_errors=True)


def median_round(runs: list[Cell]) -> Cell:
    """The round whose rate is the median (the lower middle one of an even count), with
    every round's rate and errors."""
    ordered = sorted(runs, key=lambda c: c.rate)
    cell = ordered[(len(ordered) - 1) // 2]
    cell.rates = [c.rate for c in runs]
    if len(runs) > 1:
        cell.result = {**cell.result, "errors": sum(c.result.get("errors", 0) for c in runs)}
    return cell


# -- output ----------------------------------------------------------------------------------

COLUMNS = [
    ("generation", 10),
    ("workflow", 13),
    ("model", 6),
    ("conc", 5),
    ("server", 8),
    ("rollouts/s", 11),
    ("p50 ms", 9),
    ("p95 ms", 9),
    ("p99 ms", 9),
    ("errors", 7),
    ("RSS MiB", 13),
    ("vs ceiling", 11),
    ("srv CPU ms/r", 13),
    ("gen CPU", 8),
    ("vs baseline", 11),
]


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def header() -> str:
    return "  ".join(f"{name:>{width}}" for name, width in COLUMNS)


def print_header() -> None:
    print(header())
    print("-" * len(header()), flush=True)


def row(cell: Cell) -> str:
    res = cell.result
    rss = "-"
    if cell.rss_peak_mib is not None:
        rss = f"{_fmt(cell.rss_start_mib, 0)}->{_fmt(cell.rss_peak_mib, 0)}"
    errors = str(res.get("errors", "-"))
    if res.get("retried_429"):
        errors += f" (+{res['retried_429']} 429)"
    values = [
        cell.generation,
        cell.workflow,
        "-" if cell.model_latency_ms is None else f"{cell.model_latency_ms:g}ms",
        str(cell.concurrency),
        cell.server,
        _fmt(res.get("rollouts_per_s")),
        _fmt(res.get("p50_ms")),
        _fmt(res.get("p95_ms")),
        _fmt(res.get("p99_ms")),
        errors,
        rss,
        "-" if cell.ratio is None else f"{100 * cell.ratio:.0f}%",
        _fmt(cell.server_cpu_ms_per_rollout, 2),
        "-" if res.get("generator_cpu_pct") is None else f"{res['generator_cpu_pct']:.0f}%",
        "-" if cell.speedup is None else f"{cell.speedup:.2f}x",
    ]
    return "  ".join(f"{v:>{w}}" for v, (_, w) in zip(values, COLUMNS, strict=True))


def print_row(cell: Cell) -> None:
    print(row(cell), flush=True)
    kinds = cell.result.get("error_kinds") or {}
    if kinds:
        examples = cell.result.get("error_examples") or {}
        for kind, count in kinds.items():
            print(f"{'':>12}! {count} x {kind}: {examples.get(kind, cell.result.get('log', ''))}")


def _find(
    report: Report,
    generation: str,
    server: str,
    conc: int,
    latency: float | None,
    workflow: str = "-",
) -> Any:
    key = (generation, server, conc, latency, workflow)
    for cell in report.cells:
        if (
            cell.generation,
            cell.server,
            cell.concurrency,
            cell.model_latency_ms,
            cell.workflow,
        ) == key:
            return cell
    return None


def evaluate(report: Report, settings: Settings) -> None:
    targets = report.targets
    plain = report.imports["plain_median_ms"]
    targets.append(
        Target(
            f"import osmosis_ai.rollout <= {TARGET_IMPORT_MS:g} ms",
            plain <= TARGET_IMPORT_MS,
            f"median {plain:.0f} ms (author import: {report.imports['author_median_ms']:.0f} ms)",
        )
    )
    measured = "url" if settings.url is not None else "bare"
    for generation in settings.generations:
        cell = _find(report, generation, "ours", 1, 0.0, measured)
        p50 = None if cell is None else cell.result.get("p50_ms")
        targets.append(
            Target(
                f"{generation}: p50 <= {TARGET_P50_MS:g} ms at c=1, 0 ms model",
                None if p50 is None else p50 <= TARGET_P50_MS,
                "not measured" if p50 is None else f"p50 {p50:.1f} ms",
            )
        )
        cell = _find(report, generation, "ours", 64, 0.0, measured)
        ceiling = _find(report, generation, "ceiling", 64, None)
        ratio = None if cell is None else cell.ratio
        figure = (
            "not measured"
            if ratio is None
            else f"{100 * ratio:.0f}% ({cell.rate:.0f} vs {ceiling.rate:.0f} rollouts/s)"
        )
        if ratio is not None and settings.generator != "httpx":
            # the ceiling is what the generator can drive: this target is set for httpx's
            ratio, figure = None, f"{figure}; read with --generator httpx"
        targets.append(
            Target(
                f"{generation}: >= {100 * TARGET_RATIO:.0f}% of ceiling at c=64, 0 ms model",
                None if ratio is None else ratio >= TARGET_RATIO,
                figure,
            )
        )
        at_256 = [
            c
            for c in report.cells
            if c.generation == generation
            and c.server == "ours"
            and c.workflow == measured
            and c.concurrency == 256
        ]
        errors = sum(int(c.result.get("errors") or 0) for c in at_256)
        completed = sum(int(c.result.get("completed") or 0) for c in at_256)
        targets.append(
            Target(
                f"{generation}: 0 errors at c=256",
                None if not at_256 else errors == 0 and completed > 0,
                "not measured" if not at_256 else f"{errors} errors, {completed} completed",
            )
        )
    evaluate_frameworks(report, settings)
    peaks = [
        c.rss_peak_mib
        for c in report.cells
        if c.server == "ours" and c.workflow == measured and c.rss_peak_mib
    ]
    peak = max(peaks) if peaks else None
    targets.append(
        Target(
            f"server RSS <= {TARGET_RSS_MIB:g} MiB",
            None if peak is None else peak <= TARGET_RSS_MIB,
            "not measured" if peak is None else f"peak {peak:.0f} MiB",
        )
    )


def evaluate_frameworks(report: Report, settings: Settings) -> None:
    """Framework workflows: ours against the baseline build at the same concurrency.

    The target is throughput capacity, read where the closed loop keeps both servers busy
    (c >= SATURATING). c = 1 is printed beside it for information: one rollout at a time,
    the ratio is one of a single rollout's latency, which no number of workers shortens
    (the original is saturated there already, ours is not)."""
    for workflow in FRAMEWORKS:
        for generation in settings.generations:
            cells = [
                c
                for c in report.cells
                if (c.workflow, c.generation, c.server) == (workflow, generation, "ours")
            ]
            if not cells:
                continue
            best = max(cells, key=lambda c: c.rate)
            rates = ", ".join(f"c={c.concurrency} {c.rate:.1f}/s" for c in cells)
            target = f"{TARGET_FRAMEWORK_SPEEDUP:g}x the baseline"
            groups = [
                (
                    f">= {target}, c >= {SATURATING}",
                    [c for c in cells if c.concurrency >= SATURATING],
                    False,
                ),
                (
                    "ratio at c = 1 (latency)",
                    [c for c in cells if c.concurrency == 1],
                    True,
                ),
            ]
            for label, group, informational in groups:
                if not group:
                    continue
                name = f"{generation} {workflow}: {label}"
                speedups = [c.speedup for c in group if c.speedup is not None]
                if not speedups:
                    why = (
                        "--baseline-python not given"
                        if settings.baseline_python is None
                        else f"not in --baseline-generations "
                        f"{','.join(settings.baseline_generations)}"
                    )
                    figure = f"no baseline ({why}); ours {rates}"
                    report.targets.append(Target(name, None, figure, informational))
                    continue
                each = ", ".join(
                    f"c={c.concurrency} {c.speedup:.2f}x{_spread(c.speedups)}"
                    for c in group
                    if c.speedup is not None
                )
                figure = f"{each}; ours {rates}; peak {best.rate:.1f}/s"
                if informational:
                    report.targets.append(Target(name, None, figure, informational=True))
                else:
                    passed = min(speedups) >= TARGET_FRAMEWORK_SPEEDUP
                    report.targets.append(Target(name, passed, figure))


def _spread(values: list[float]) -> str:
    """`` (min-max of N rounds)`` when there were several rounds."""
    if len(values) < 2:
        return ""
    return f" ({min(values):.2f}-{max(values):.2f}, {len(values)} rounds)"


def print_targets(report: Report) -> None:
    print("\ntargets (plain HTTP model calls)")
    for target in report.targets:
        verdict = (
            "info"
            if target.informational
            else {True: "PASS", False: "MISS", None: "n/a "}[target.passed]
        )
        print(f"  {verdict}  {target.name:<52} {target.figure}")


# -- CLI -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        description="Benchmark the rollout server against a trivial ceiling; prints one table."
    )
    parser.add_argument("--quick", action="store_true", help="short cells (~1 minute in all)")
    parser.add_argument("--generations", default="polling,callback")
    parser.add_argument("--concurrency", default="1,16,64,256", help="comma-separated levels")
    parser.add_argument("--latencies", default="0,50", help="scripted model latencies, ms")
    parser.add_argument("--duration", type=float, help="measuring window per cell, seconds")
    parser.add_argument("--warmup", type=float, help="unmeasured lead-in per cell, seconds")
    parser.add_argument("--url", help="drive this running rollout server instead of ours")
    parser.add_argument("--server-pid", type=int, help="pid of --url's server, for RSS")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--model-clients",
        type=int,
        default=1,
        help="httpx clients the bare workflow spreads model calls over (default 1: one shared)",
    )
    parser.add_argument(
        "--rollout-timeout", type=float, default=30.0, help="a rollout slower than this errs"
    )
    parser.add_argument(
        "--workflows",
        default=",".join(WORKFLOWS),
        help=f"comma-separated, of {', '.join(WORKFLOWS)} (framework ones need their extra)",
    )
    parser.add_argument(
        "--baseline-python",
        help="an interpreter with another osmosis-ai build (e.g. the original) and the "
        "frameworks installed: it serves the same template files, for the speed-up column",
    )
    parser.add_argument(
        "--baseline-generations",
        default="polling",
        help="generations the baseline build speaks (default polling: the original 0.3.8 "
        "serves only the polling generation)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes of our rollout servers (OSMOSIS_ROLLOUT_WORKERS; default 1)",
    )
    parser.add_argument(
        "--generator",
        choices=("httpx", "lean"),
        default="httpx",
        help="the load generator's HTTP client: httpx (default; the ceiling targets are "
        "set for it) or lean (a tenth of its CPU, leaving the cores to the servers)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds per cell (default 1): each round runs every server once, a baseline "
        "right after its twin; rows show the median round, the speed-up the median of the "
        "rounds' ratios (for a machine whose speed drifts)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat takes a whole number >= 1; got {args.repeat}")
    if args.workers < 1:
        parser.error(f"--workers takes a whole number >= 1; got {args.workers}")
    workflows = [w.strip() for w in args.workflows.split(",") if w.strip()]
    unknown = sorted(set(workflows) - set(WORKFLOWS))
    if unknown or not workflows:
        parser.error(f"--workflows takes {', '.join(WORKFLOWS)}; got {args.workflows!r}")
    generations = [g.strip() for g in args.generations.split(",") if g.strip()]
    if not generations or any(g not in ("polling", "callback") for g in generations):
        parser.error("--generations takes polling, callback or both, comma-separated")
    return Settings(
        generations=generations,
        concurrencies=[int(c) for c in args.concurrency.split(",")],
        latencies=[float(x) for x in args.latencies.split(",")],
        duration=args.duration or (1.0 if args.quick else 4.0),
        warmup=args.warmup if args.warmup is not None else (0.3 if args.quick else 1.0),
        min_rollouts=10 if args.quick else 30,
        url=args.url,
        server_pid=args.server_pid,
        json_path=args.json,
        model_clients=max(1, args.model_clients),
        rollout_timeout=args.rollout_timeout,
        workflows=workflows,
        baseline_python=args.baseline_python,
        baseline_generations=[g.strip() for g in args.baseline_generations.split(",")],
        workers=args.workers,
        generator=args.generator,
        repeat=args.repeat,
    )


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt (even where SIGINT was ignored at start)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="osmosis-bench-"))
    procs = Processes(workdir)
    env = environment()
    print(
        f"python {env['python']}, {env['cpus']} CPUs, uvloop={env['uvloop']}, "
        f"httptools={env['httptools']}, sniffio={env['sniffio']}, "
        f"load average {env['loadavg_start']}"
    )
    if not env["sniffio"]:
        print(
            "note: sniffio is not installed, so httpcore retries `import sniffio` (a sys.path "
            "scan) on every request, in the generator and in the servers alike"
        )
    plain = time_import(IMPORT_PLAIN)
    author = time_import(IMPORT_AUTHOR)
    imports = {
        "plain_ms": [round(x, 1) for x in plain],
        "plain_median_ms": statistics.median(plain),
        "author_ms": [round(x, 1) for x in author],
        "author_median_ms": statistics.median(author),
        "author_heaviest_ms": heaviest_imports(IMPORT_AUTHOR),
    }
    print(
        f"\n`{IMPORT_PLAIN}`: median {imports['plain_median_ms']:.0f} ms of {IMPORT_RUNS} "
        f"fresh interpreters\n`{IMPORT_AUTHOR}`: median {imports['author_median_ms']:.0f} ms"
        "\n  heaviest (cumulative): "
        + ", ".join(f"{name} {ms:.0f}" for name, ms in imports["author_heaviest_ms"])
    )
    report = Report(environment=env, imports=imports)
    print(
        f"\ncells: {settings.warmup:g} s warm-up, then >= {settings.duration:g} s and "
        f">= {settings.min_rollouts} rollouts; RSS = server RSS at cell start -> peak; "
        f"bare workflow on {settings.model_clients} shared model client(s); our servers run "
        f"{settings.workers} worker process(es); generator: {settings.generator}"
        + (f"; median of {settings.repeat} rounds per cell" if settings.repeat > 1 else "")
        + "\n"
    )
    print_header()
    interrupted = failed = False
    with signals_as_interrupt():
        try:
            benchmark(settings, report, procs, workdir / "artifacts")
        except KeyboardInterrupt:
            interrupted = True
            print("\ninterrupted: stopping the servers", flush=True)
        except RuntimeError as exc:
            failed = True
            print(f"\nbenchmark aborted: {exc}", flush=True)
            for log in sorted(workdir.glob("*.log")):
                print(f"--- {log.name} (last lines)\n{procs.tail(log.stem)}")
        finally:
            procs.stop_all()
            report.environment["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
            shutil.rmtree(workdir, ignore_errors=True)
    report.wall_s = round(time.perf_counter() - started, 1)
    evaluate(report, settings)
    print_targets(report)
    print(f"\nload average at end {report.environment['loadavg_end']}; wall {report.wall_s} s")
    if settings.json_path is not None:
        settings.json_path.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
