"""PostgreSQL restarted (cleanly, or crashed) in the middle of ingest: nothing acknowledged is lost.

Several clients post small batches with values that name them (client, sequence) in a loop, and the real
agent Pusher pushes beside them, while the database is stopped and started under the same daphne.
Then: every sample answered 200 is in the database; every answer during the outage is a 503 with
Retry-After (never a 500, never slower than the client's timeout); posts succeed again a few seconds after
the database is back, with no restart of daphne; the Pusher spooled what it could not deliver and delivered
all of it afterwards, exactly once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import requests

from telemetry.agent.pusher import Pusher, count_samples

CLIENTS = 4
CLIENT_TIMEOUT_S = 10.0  # the agent's own timeout (telemetry/agent/pusher.py)
DOWN_FOR_S = 0.5
# The server's Retry-After: a client that honours it comes back after this long, so ingest must work by then.
RECOVERY_BOUND_S = 5.0
# Distinct values per client and sequence: energy_mj = client * STRIDE + seq.
STRIDE = 1_000_000


@dataclass
class Answer:
    """One POST as the client saw it."""

    client: int
    seq: int
    sent: float
    done: float
    status: int | None  # None: no HTTP answer at all (connection refused, reset, timed out)
    retry_after: str | None = None
    code: str = ""
    error: str = ""


class IngestClients:
    """CLIENTS threads, each posting one-GPU batches (one new timestamp each) in a loop until stopped."""

    def __init__(self, url: str, token: str, tag: str):
        self.url = url + "/api/v1/ingest"
        self.token = token
        self.tag = tag
        self.base = datetime.now(UTC) - timedelta(minutes=30)
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(c,), daemon=True) for c in range(CLIENTS)]

    def uuid(self, client: int) -> str:
        return f"GPU-rel-{self.tag}-{client}"

    def batch(self, client: int, seq: int) -> dict:
        return {"gpus": [{
            "host": f"rel-{self.tag}-{client}", "uuid": self.uuid(client), "index": client,
            "time": (self.base + timedelta(milliseconds=seq)).isoformat(),
            "fields": {"gpu_util": 50, "energy_mj": client * STRIDE + seq},
        }]}

    def start(self) -> IngestClients:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=CLIENT_TIMEOUT_S + 5)

    def _loop(self, client: int) -> None:
        session = requests.Session()
        headers = {"Authorization": f"Bearer {self.token}"}
        seq = 0
        while not self._stop.is_set():
            seq += 1
            sent = time.monotonic()
            try:
                resp = session.post(self.url, json=self.batch(client, seq), headers=headers, timeout=CLIENT_TIMEOUT_S)
            except requests.RequestException as exc:
                answer = Answer(client, seq, sent, time.monotonic(), None, error=repr(exc))
            else:
                code = resp.json().get("error", {}).get("code", "") if resp.status_code != 200 else ""
                answer = Answer(client, seq, sent, time.monotonic(), resp.status_code,
                                resp.headers.get("Retry-After"), code, "" if resp.ok else resp.text[:300])
                if resp.status_code == 200:
                    assert resp.json()["accepted"] == 2, resp.text
            with self._lock:
                self.answers.append(answer)
            if answer.status != 200:
                time.sleep(0.1)  # a client in a tight loop on errors would only load the test machine

    def acked(self) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if a.status == 200]

    def wait_for_acks(self, n: int, after: float = 0.0, timeout: float = 30.0) -> Answer:
        """Block until n posts sent after `after` (monotonic) were acknowledged; return the first of them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = sorted((a for a in self.acked() if a.sent >= after), key=lambda a: a.done)
            if len(got) >= n:
                return got[0]
            time.sleep(0.02)
        raise AssertionError(f"fewer than {n} posts sent after t={after:.2f} were acknowledged within {timeout} s")


class PusherRun:
    """The real agent Pusher in a thread, one one-GPU batch every 200 ms, spooling while the server refuses."""

    def __init__(self, url: str, token: str, spool, tag: str):
        # Retry-After (5 s) is capped by max_delay; a short cap keeps the test short, the code path is the same.
        self.pusher = Pusher(url, token, spool, timeout=CLIENT_TIMEOUT_S, attempts=3, base_delay=0.05, max_delay=0.2)
        self.uuid = f"GPU-rel-{tag}-agent"
        self.base = datetime.now(UTC) - timedelta(minutes=20)
        self.batches = 0
        self.samples = 0
        self.max_spooled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.batches += 1
            batch = {"gpus": [{"host": "rel-agent", "uuid": self.uuid, "index": 0,
                               "time": (self.base + timedelta(milliseconds=self.batches)).isoformat(),
                               "fields": {"gpu_util": 10, "energy_mj": self.batches}}]}
            self.samples += count_samples(batch)
            self.pusher.push(batch)
            self.max_spooled = max(self.max_spooled, self.pusher.health.spooled_batches)
            time.sleep(0.2)

    def start(self) -> PusherRun:
        self._thread.start()
        return self

    def stop_and_drain(self, timeout: float = 20.0) -> bool:
        self._stop.set()
        self._thread.join(timeout=CLIENT_TIMEOUT_S * 3)
        deadline = time.monotonic() + timeout
        while not self.pusher.drain():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


def _stored(stack, uuid: str) -> dict[datetime, int]:
    """The energy_mj values stored for one GPU, by time."""
    with stack.connect() as conn:
        rows = conn.execute(
            "SELECT s.time, s.energy_mj FROM telemetry_gpu_sample s JOIN telemetry_gpu g ON g.id = s.gpu_id "
            "WHERE g.uuid = %s", [uuid]).fetchall()
    return dict(rows)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_pg_restart_mid_ingest_loses_no_acknowledged_sample(fault_stack, fault_daphne, pg_restored, tmp_path, mode):
    clients = IngestClients(fault_daphne.url, fault_stack.token, mode).start()
    agent = PusherRun(fault_daphne.url, fault_stack.token, tmp_path / "spool", mode).start()
    try:
        clients.wait_for_acks(4 * CLIENTS)  # healthy traffic first
        outage = fault_stack.restart_pg(mode, down_for=DOWN_FOR_S)
        first_ok = clients.wait_for_acks(2 * CLIENTS, after=outage["started"], timeout=RECOVERY_BOUND_S + 10)
        clients.wait_for_acks(4 * CLIENTS, after=first_ok.done)  # and it stays up
    finally:
        clients.stop()
        drained = agent.stop_and_drain()
    recovery_s = first_ok.done - outage["started"]
    answers = clients.answers
    daphne_pid_alive = fault_daphne.alive()
    print(f"\n[{mode}] posts={len(answers)} acked={len(clients.acked())} "  # noqa: T201 - the measured figures
          f"503={sum(a.status == 503 for a in answers)} down={outage['started'] - outage['stopping']:.2f}s "
          f"recovery={recovery_s:.2f}s max_latency={max(a.done - a.sent for a in answers):.2f}s "
          f"agent batches={agent.batches} max_spooled={agent.max_spooled}")

    # 1. Every acknowledged sample is stored, with its own value.
    for c in range(CLIENTS):
        stored = _stored(fault_stack, clients.uuid(c))
        for a in (a for a in clients.acked() if a.client == c):
            at = clients.base + timedelta(milliseconds=a.seq)
            assert stored.get(at) == c * STRIDE + a.seq, f"client {c} seq {a.seq} acknowledged but not stored"

    # 2. The outage was seen, and only as 503 + Retry-After: no 500, no dropped connection, no hang.
    failures = [a for a in answers if a.status != 200]
    assert any(a.status == 503 for a in failures), "no request fell into the outage: the test proved nothing"
    bad = [a for a in failures if a.status != 503 or not a.retry_after or a.code != "unavailable"]
    assert not bad, f"{len(bad)} answers other than 503/Retry-After, e.g. {bad[:3]}"
    assert max(a.done - a.sent for a in answers) < CLIENT_TIMEOUT_S

    # 3. Ingest recovered by itself, in the same daphne process, and stayed up.
    assert daphne_pid_alive
    assert recovery_s < RECOVERY_BOUND_S, f"first acknowledged post {recovery_s:.1f} s after PostgreSQL was back"
    assert not [a for a in failures if a.sent > first_ok.done], "errors after ingest had recovered"

    # 4. The agent spooled through the outage and then delivered every batch, exactly once.
    assert drained, f"agent spool not drained: {agent.pusher.health.last_error}"
    health = agent.pusher.health
    assert agent.max_spooled > 0, "the agent never had to spool: the outage missed it"
    assert health.dropped_samples == {}
    assert health.sent_samples == agent.samples
    stored = _stored(fault_stack, agent.uuid)
    assert sorted(stored.values()) == list(range(1, agent.batches + 1))


# A value no other test sends: the trigger below kills the backend that is writing it.
POISON = 987_654_321
KILL_MID_COPY = f"""
CREATE FUNCTION bw_rel_die() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.energy_mj = {POISON} THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER bw_rel_die BEFORE INSERT ON telemetry_gpu_sample FOR EACH ROW EXECUTE FUNCTION bw_rel_die();
"""


@pytest.fixture
def backend_dies_mid_copy(fault_stack):
    """The worst moment for the database to go: inside the binary COPY of the samples, mid-transaction."""
    fault_stack.superuser_sql(KILL_MID_COPY)
    yield
    fault_stack.superuser_sql("DROP TRIGGER bw_rel_die ON telemetry_gpu_sample; DROP FUNCTION bw_rel_die();")


def test_connection_lost_mid_copy_is_503_and_nothing_half_written(fault_stack, fault_daphne, backend_dies_mid_copy):
    clients = IngestClients(fault_daphne.url, fault_stack.token, "midcopy")
    headers = {"Authorization": f"Bearer {fault_stack.token}"}
    batch = clients.batch(0, 1)
    batch["gpus"][0]["fields"]["energy_mj"] = POISON
    for _ in range(2):  # twice: the thread whose connection died must come back with a working one, not a 500
        resp = requests.post(clients.url, json=batch, headers=headers, timeout=CLIENT_TIMEOUT_S)
        assert resp.status_code == 503, resp.text
        assert resp.headers["Retry-After"] and resp.json()["error"]["code"] == "unavailable"
    with fault_stack.connect() as conn:
        assert conn.execute("SELECT count(*) FROM telemetry_gpu WHERE uuid = %s", [clients.uuid(0)]).fetchone() == (0,)
    # The same daphne, the next batch: the dead connection was dropped, not reused.
    resp = requests.post(clients.url, json=clients.batch(0, 2), headers=headers, timeout=CLIENT_TIMEOUT_S)
    assert resp.status_code == 200, resp.text
    assert _stored(fault_stack, clients.uuid(0)) == {clients.base + timedelta(milliseconds=2): 2}
