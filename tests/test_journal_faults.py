"""The shared journal under real network faults (issue 35): no unit runs twice at once, no INTERNAL, and every
run completes once the fault clears.

A TCP proxy (tests/faultproxy.py) sits between akm and a throwaway PostgreSQL (tests/pgcluster.py); the test
breaks akm's connections through it mid-transaction — dropped, stalled, half-open either way — or ends them on
the server (`pg_terminate_backend`), one connection of one process at a time. Units write their own start and
end times to a log (`O_APPEND`, one write per line), so "twice at once" is measured by what the units saw, not
by what the journal says. A second `workflow run RUN` is started right after each fault of a driver, because
that is how a healthy driver got taken over in the issue.

Rounds per fault kind: `AKM_FAULT_ROUNDS` (1 by default, which CI runs; the issue's big count was run by hand).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.faultproxy import FaultProxy, Link
from tests.helpers import PY, ROOT, open_at, wait_until, write_wf

pytestmark = pytest.mark.slow

ROUNDS = max(1, int(os.environ.get("AKM_FAULT_ROUNDS", "1") or "1"))

# A unit: logs `start RUN:ITEM PID T`, sleeps, logs `end RUN:ITEM PID T`; stopped (SIGTERM) it logs its end first. Its
# duration is the command's argument, or what `durations.json` beside it says for its item.
UNIT = """\
import json, os, pathlib, signal, sys, time
item = os.environ["AKM_ITEM"]
run = os.environ.get("AKM_RUN_ID", "-")
log = {log!r}
def line(kind):
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, f"{{kind}} {{run}}:{{item}} {{os.getpid()}} {{time.time():.6f}}\\n".encode())
    os.close(fd)
def stop(*_):
    line("end")
    os._exit(143)
signal.signal(signal.SIGTERM, stop)
line("start")
table = pathlib.Path(__file__).with_name("durations.json")
durations = json.loads(table.read_text()) if table.exists() else {{}}  # by item
time.sleep(float(durations.get(item, sys.argv[1])))
line("end")
print(item)
"""

LEASE_TTL = "12"  # short enough for a stall past it, long enough that renewals every 3 s rarely miss on a busy CI
CLAIM_TTL = "12"


def intervals(log: Path) -> dict[str, list[tuple[float, float]]]:
    """Per unit (`run:item`), each execution's (start, end); an execution with no end yet lasts forever."""
    open_: dict[tuple[str, str], float] = {}
    out: dict[str, list[tuple[float, float]]] = {}
    if not log.exists():
        return out
    for raw in log.read_text().splitlines():
        kind, item, pid, t = raw.split()
        if kind == "start":
            open_[(item, pid)] = float(t)
        elif (item, pid) in open_:
            out.setdefault(item, []).append((open_.pop((item, pid)), float(t)))
    for (item, _pid), start in open_.items():
        out.setdefault(item, []).append((start, float("inf")))
    return out


def overlaps(log: Path) -> list[tuple[str, tuple[float, float], tuple[float, float]]]:
    """Executions of one item that ran at the same time."""
    found = []
    for item, spans in intervals(log).items():
        spans = sorted(spans)
        for a, b in zip(spans, spans[1:], strict=False):
            if b[0] < a[1]:
                found.append((item, a, b))
    return found


class World:
    """One fresh schema, a project whose units log their intervals, hosts to run akm from (each behind a fault
    proxy of its own, or straight to the server), and an admin connection to watch and end sessions."""

    def __init__(self, tmp_path: Path, cluster, schema_url: str) -> None:
        from akm.store.postgres.connect import connect, parse_url

        self.tmp = tmp_path
        self.cluster = cluster
        self.direct_url = schema_url
        self.schema = parse_url(schema_url).schema
        self.admin = connect(parse_url(cluster.url()))
        self._admin_lock = threading.Lock()
        open_at(schema_url).close()  # the schema exists before the first fault
        self.project = tmp_path / "project"
        self.project.mkdir()
        self.log = tmp_path / "units.log"
        (self.project / "unit.py").write_text(UNIT.format(log=str(self.log)))
        self.proxies: dict[str, FaultProxy] = {}
        self.procs: list[subprocess.Popen] = []
        self.outputs: list[str] = []
        self.tally: dict[str, int] = {}

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=60)
        for proxy in self.proxies.values():
            proxy.close()
        with contextlib.suppress(Exception):
            self.admin.close()

    # ------------------------------------------------------------ setting up
    def workflow(self, name: str, items: int, seconds: float, concurrency: int = 2) -> str:
        write_wf(
            self.project,
            name,
            f"""
            params:
              items: {{ type: array, items: {{ type: integer }}, default: {list(range(1, items + 1))} }}
            steps:
              - id: fan
                map:
                  over: params.items
                  concurrency: {concurrency}
                  unit:
                    exec:
                      command: {json.dumps([PY, str(self.project / "unit.py"), str(seconds)])}
            """,
            "## fan\n\nunits that log when they run",
        )
        return name

    def durations(self, table: dict[int, float]) -> None:
        (self.project / "durations.json").write_text(json.dumps({str(k): v for k, v in table.items()}))

    def host(self, name: str, *, proxied: bool = True, **extra: str) -> dict[str, str]:
        """A host's environment; `proxied`: its connections go through a fault proxy of its own."""
        url = self.direct_url
        if proxied:
            proxy = self.proxies.get(name) or FaultProxy(self.cluster.host, self.cluster.port)
            self.proxies[name] = proxy
            url = proxy.url(self.direct_url)
        home = self.tmp / "hosts" / name
        env = {k: v for k, v in os.environ.items() if not k.startswith("AKM_")}
        env.update(
            HOME=str(home / "home"),
            XDG_CONFIG_HOME=str(home / "config"),
            AKM_DATA_DIR=str(home / "data"),
            AKM_HOST_ID=f"fault-{name}",
            AKM_JOURNAL_URL=url,
            AKM_LEASE_TTL_S=LEASE_TTL,
            AKM_WORKER_CLAIM_TTL_S=CLAIM_TTL,
            PYTHONPATH=str(ROOT),
            **extra,
        )
        return env

    # ------------------------------------------------------------ processes
    def popen(self, env: dict[str, str], *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "akm", *args],
            cwd=self.project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def collect(self, proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
        out, err = proc.communicate(timeout=timeout)
        text = out + err
        self.outputs.append(text)
        if os.environ.get("AKM_FAULT_VERBOSE"):
            print(f"\n--- {' '.join(proc.args[3:6])} exit {proc.returncode}\n{text[-3000:]}")
        code = "ok" if proc.returncode == 0 else _error_code(text)
        if proc.args[3:4] == ["worker"]:  # stopped by the test; what mattered is what it said it did
            code = "worker:" + ",".join(sorted({ln.split()[1] for ln in err.splitlines() if ln.startswith("[worker]")}))
        self.tally[code] = self.tally.get(code, 0) + 1
        return proc.returncode, text

    def akm(self, env: dict[str, str], *args: str, timeout: float = 300) -> tuple[int, str]:
        return self.collect(self.popen(env, *args), timeout)

    def finish(self, env: dict[str, str], run_id: str, attempts: int = 8) -> None:
        """Drive the run until it completes (each try answers with a coded error at worst)."""
        for _ in range(attempts):
            row = self.run_row(run_id)
            if row["status"] == "completed":
                return
            code, text = self.akm(env, "workflow", "run", run_id, "--format", "json")
            if code == 0 and json.loads(_json_part(text))["run"]["status"] == "completed":
                return
            time.sleep(0.5)
        raise AssertionError(f"run {run_id} did not complete: {self.run_row(run_id)}\n" + "\n".join(self.outputs[-3:]))

    # ------------------------------------------------------------ the server's view
    def sql(self, statement: str, **params):
        with self._admin_lock:  # one connection, used by the test and a helper thread
            return self.admin.run(statement, **params)

    def backends(self) -> list[dict]:
        rows = self.sql(
            "SELECT pid, application_name, client_port, state, wait_event_type FROM pg_stat_activity "
            "WHERE application_name LIKE 'akm%' AND pid <> pg_backend_pid()"
        )
        return [dict(zip(("pid", "app", "port", "state", "wait"), r, strict=True)) for r in rows]

    def link(self, host: str, role: str) -> tuple[Link, dict] | None:
        """The proxied connection of `host` in `role` (application_name) and its backend, if there is one."""
        proxy = self.proxies[host]
        for b in self.backends():
            if b["app"] == role:
                link = proxy.link_of(b["port"])
                if link is not None:
                    return link, b
        return None

    def run_row(self, run_id: str | None = None) -> dict:
        where = "WHERE id = :r" if run_id else ""
        rows = self.sql(
            f"SELECT id, status, lease_holder, lease_epoch, lease_liveness FROM {self.schema}.runs {where} "
            "ORDER BY created_at DESC LIMIT 1",
            **({"r": run_id} if run_id else {}),
        )
        return dict(zip(("id", "status", "holder", "epoch", "liveness"), rows[0], strict=True)) if rows else {}

    def running(self) -> int:
        spans = intervals(self.log)
        return sum(1 for v in spans.values() for _, end in v if end == float("inf"))

    def settled(self) -> None:
        """Every akm session on the server is gone or idle outside a transaction, and none waits for a lock:
        what a fault left behind was cleaned up by the server's own limits."""
        self.wait(
            "no akm session left waiting or idle in a transaction",
            lambda: not [b for b in self.backends() if b["wait"] == "Lock" or b["state"] != "idle"],
            timeout=90,
            every=0.5,
        )

    @staticmethod
    def wait(what: str, probe, timeout: float = 120.0, every: float = 0.02):
        return wait_until(probe, what=what, timeout=timeout, every=every)

    def check(self) -> None:
        assert overlaps(self.log) == [], overlaps(self.log)
        bad = [o for o in self.outputs if "INTERNAL" in o or "Traceback" in o]
        assert not bad, bad[0]


def _json_part(text: str) -> str:
    """The first JSON object in a process's stdout + stderr (stdout comes first)."""
    start = text.find("{")
    if start < 0:
        return "{}"
    return json.dumps(json.JSONDecoder().raw_decode(text[start:])[0])


def _error_code(text: str) -> str:
    for marker in ('"code": "', "error["):
        i = text.find(marker)
        if i >= 0:
            rest = text[i + len(marker) :]
            return rest[: min(x for x in (rest.find('"'), rest.find("]"), 40) if x >= 0)]
    return "exit-without-code"


@pytest.fixture
def world(tmp_path, pg_cluster):
    from tests import pgcluster

    with pgcluster.fresh_schema(pg_cluster) as url:
        w = World(tmp_path, pg_cluster, url)
        try:
            yield w
        finally:
            w.close()
            spans = intervals(w.log)
            runs = sum(len(v) for v in spans.values())
            print(
                f"\n[faults] {runs} unit executions of {len(spans)} items, {len(overlaps(w.log))} overlapping; "
                f"outcomes: {json.dumps(w.tally, sort_keys=True)}"
            )


def _in_transaction(w: World, host: str, role: str, tries: int = 400) -> tuple[Link, dict]:
    """Stall the host's connection in `role` at a moment its session is inside a transaction (the server shows
    it `idle in transaction`), or, failing that after `tries`, wherever it is: the link stays stalled."""
    found = None
    for attempt in range(tries):
        seen = w.link(host, role)
        if seen is None:
            time.sleep(0.01)
            continue
        found = seen
        link, _ = found
        link.stall()
        time.sleep(0.02)  # what was in flight arrives; the server settles in the state the client left it
        backend = next((b for b in w.backends() if b["port"] == link.server_port), None)
        if backend is not None and backend["state"] == "idle in transaction":
            return link, backend
        link.resume()
        time.sleep(0.005 * (attempt % 7))
    assert found is not None, f"no {role} connection of host {host}"
    link, backend = found
    link.stall()
    return link, backend


# ---------------------------------------------------------------- a driver's connections


DRIVER_FAULTS = [
    # the case: the server ends the liveness session; a second driver comes at once
    "liveness-terminate",
    # and the driver cannot reconnect either (its host is cut off from new connections meanwhile)
    "liveness-terminate-cut-off",
    "liveness-drop-cut-off",
    "liveness-half-open-cut-off",  # the server side closed, the driver's side silent: no FIN reaches it
    "work-terminate",
    "work-drop",
    "work-stall-short",  # a few seconds: the driver just goes on
    "work-stall-past-lease",  # longer than the lease: the driver fences itself, the other takes over at expiry
    "work-half-open-mid-transaction",  # the server keeps the transaction open, holding its locks
]


def _driver_round(w: World, fault: str) -> None:
    # A cut-off driver must still be running units when the other's grace ends (13 s), or a driver that did not
    # fence itself would go unnoticed; past the lease, the units in flight when the stall begins outlast it.
    # A stall or a half-open link is made inside a transaction: on PostgreSQL a unit's writes are single
    # statements (issue 40), so the driver's transactions are its lease's and steps' — units last long enough
    # for one to come by.
    mid = fault in ("work-stall-short", "work-half-open-mid-transaction")
    wf = w.workflow("fan.md", items=8, seconds=4.0 if fault.endswith("cut-off") or mid else 1.0)
    w.durations({1: 20, 2: 20} if fault == "work-stall-past-lease" else {})
    a, b = w.host("a"), w.host("b", proxied=False)
    proxy = w.proxies["a"]
    driver = w.popen(a, "workflow", "run", wf, "--new", "--format", "json")
    run_id = w.wait("host A's run", lambda: w.run_row().get("holder") and w.run_row()["id"])
    holder = w.run_row(run_id)["holder"]
    w.wait("host A's liveness marker and a unit running", lambda: w.run_row(run_id)["liveness"] and w.running())
    role = "akm-liveness" if fault.startswith("liveness") else "akm"
    if fault == "work-half-open-mid-transaction":
        link, _ = _in_transaction(w, "a", role)
        link.half_open_server()
    elif fault.startswith("work-stall"):
        link, _ = _in_transaction(w, "a", role)
    else:
        link, backend = w.wait(f"host A's {role} connection", lambda: w.link("a", role))
        if fault.endswith("cut-off"):
            proxy.refusing = True
        if "terminate" in fault:
            w.sql("SELECT pg_terminate_backend(:p)", p=backend["pid"])
        elif "drop" in fault:
            link.drop()
        elif "half-open" in fault:
            link.half_open_client()
    if fault.startswith("liveness"):
        w.collect(w.popen(b, "workflow", "run", run_id, "--format", "json"))  # another host, at once
        proxy.refusing = False
    elif fault == "work-stall-short":
        time.sleep(3)
        link.resume()
    elif fault == "work-stall-past-lease":
        # another host keeps trying; it gets the run once A's lease lapsed (A's liveness session is fine)
        taker = threading.Thread(target=w.finish, args=(b, run_id), kwargs={"attempts": 90})
        taker.start()
        w.wait("another host to take the run over", lambda: w.run_row(run_id)["holder"] != holder, timeout=180)
        time.sleep(2)
        link.resume()
        taker.join(timeout=600)
    w.collect(driver)
    for lk in proxy.links():
        if lk.state != "pass":
            lk.close()  # what is left of a half-open side
    w.finish(w.host("c", proxied=False), run_id)
    w.settled()
    w.check()


@pytest.mark.parametrize("fault", DRIVER_FAULTS)
def test_a_driver_under_a_network_fault_never_runs_a_unit_twice_at_once(world, fault):
    """Each fault, `AKM_FAULT_ROUNDS` times: 0 overlaps, 0 INTERNAL, the run completes once the fault clears,
    and nothing is left waiting on the server."""
    for _ in range(ROUNDS):
        _driver_round(world, fault)


# ---------------------------------------------------------------- workers' connections


WORKER_FAULTS = [
    "worker-terminate",
    "worker-drop",
    "worker-half-open-mid-transaction",
    "worker-stall-past-claim",  # longer than its claims: it fences them, another worker runs them
    "every-connection-terminated-in-turn",  # coordinator's and workers', each role, one after another
]


def _worker(w: World, name: str, concurrency: int, proxied: bool = True) -> subprocess.Popen:
    env = w.host(name, proxied=proxied)
    return w.popen(env, "worker", "--concurrency", str(concurrency), "--poll", "200ms", "--format", "json")


def _stop_worker(w: World, proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    w.collect(proc, timeout=120)


def _worker_round(w: World, fault: str) -> None:
    stall = fault == "worker-stall-past-claim"
    items = 4 if stall else 10
    wf = w.workflow("fan.md", items=items, seconds=2.0, concurrency=4)
    w.durations({i: 25 for i in range(1, items + 1)} if stall else {})
    every = fault == "every-connection-terminated-in-turn"
    coord = w.popen(w.host("coord", proxied=every), "workflow", "run", wf, "--new", "--workers", "--format", "json")
    w1 = _worker(w, "w1", concurrency=2)
    workers = [w1]
    if not stall:
        workers.append(_worker(w, "w2", concurrency=2, proxied=every))
    run_id = w.wait("the coordinator's run", lambda: w.run_row().get("holder") and w.run_row()["id"])
    w.wait("host w1 running units", lambda: w.running() >= (2 if stall else 1), timeout=180)
    if fault == "worker-terminate":
        _, backend = w.wait("w1's connection", lambda: w.link("w1", "akm"))
        w.sql("SELECT pg_terminate_backend(:p)", p=backend["pid"])
    elif fault == "worker-drop":
        link, _ = w.wait("w1's connection", lambda: w.link("w1", "akm"))
        link.drop()
    elif fault == "worker-half-open-mid-transaction":
        link, _ = _in_transaction(w, "w1", "akm")
        link.half_open_server()
    elif stall:
        link, _ = _in_transaction(w, "w1", "akm")
        # the whole host stalls: a worker has several connections (its pool, issue 40), and one stalled among
        # working ones would only hold up the thread using it
        stalled = [lk for lk in w.proxies["w1"].links() if lk.state == "pass"]
        for other in stalled:
            other.stall()
        w.proxies["w1"].refusing = True
        holders = {r[0] for r in w.sql(f"SELECT claim_holder FROM {w.schema}.units WHERE status = 'running'")}
        workers.append(_worker(w, "w2", concurrency=4, proxied=False))
        # the other worker claims w1's units once their claims lapsed (w1 cannot renew them)
        w.wait(
            "another worker to claim w1's units",
            lambda: (
                w.sql(
                    f"SELECT count(*) FROM {w.schema}.units WHERE status = 'running' AND attempts > 1"
                    " AND NOT (claim_holder = ANY(:h))",
                    h=list(holders),
                )[0][0]
                >= 2
            ),
            timeout=180,
            every=0.2,
        )
        time.sleep(2)
        w.proxies["w1"].refusing = False
        for other in [link, *stalled]:
            other.resume()
    elif every:
        for host in ("coord", "w1", "w2"):
            for role in ("akm", "akm-liveness", "akm-listen", "akm-notify"):
                found = w.link(host, role)
                if found is not None:
                    w.sql("SELECT pg_terminate_backend(:p)", p=found[1]["pid"])
                    time.sleep(0.7)
    w.collect(coord, timeout=600)
    w.finish(w.host("c", proxied=False), run_id)
    for proc in workers:
        _stop_worker(w, proc)
    for proxy in w.proxies.values():
        for lk in proxy.links():
            if lk.state != "pass":
                lk.close()
    w.settled()
    w.check()


@pytest.mark.parametrize("fault", WORKER_FAULTS)
def test_workers_under_a_network_fault_never_run_a_unit_twice_at_once(world, fault):
    """The same for a fan-out over workers (`workflow run --workers`, `akm worker`)."""
    for _ in range(ROUNDS):
        _worker_round(world, fault)
