"""The scoring watermark: a pass scores every minute not yet scored, oldest first, each in its own transaction
with the watermark; no more than the catch-up cap; never two passes at once; a failed minute is retried.

Each result is compared with the same minutes scored one pass per minute, as beat does when nothing goes wrong.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection

from anomaly.lifecycle import score_all
from anomaly.models import Anomaly, EntityScore, ScoringWatermark
from anomaly.registry import load_active
from anomaly.scoring import clear_caches
from telemetry.live import wait_for_trailing_publish
from telemetry.models import Allocation, Gpu, Job, Node
from tests.conftest import FIXED_NOW
from tests.telemetry.factories import insert_rollup

pytestmark = pytest.mark.django_db
MIN = timedelta(minutes=1)
AT = FIXED_NOW  # the first pass; it reads the buckets AT-3 and AT-2
LEVELS = {"gpu_util_avg": 95.0, "sm_clock_avg": 1980.0, "mem_clock_avg": 2619.0, "gpu_temp_avg": 62.0,
          "memory_temp_avg": 70.0, "power_w_avg": 650.0, "fb_used_avg": 70000.0, "sm_active_avg": 0.8,
          "tensor_active_avg": 0.5, "ecc_sbe_vol_delta": 0, "pcie_replay_delta": 0}
# GPU 3 runs hot in the buckets AT-1 to AT+1. A pass at t averages the buckets t-3 and t-2 and flags a GPU only
# when both are hot, so its event opens at AT+2, is seen again at AT+3 and closes at AT+4: scored out of order,
# or with a minute left out, the event would differ.
HOT = (AT - MIN, AT + MIN)


@pytest.fixture
def fleet():
    """Two nodes of 8 H100s, node-a on one job, with 1-minute rollups from AT-3 to AT+8."""
    gpus = []
    for host in ("node-a", "node-b"):
        node = Node.objects.create(hostname=host)
        gpus += [Gpu.objects.create(uuid=f"GPU-{host}-{i}", node=node, index=i, model="NVIDIA H100 80GB HBM3")
                 for i in range(8)]
    job = Job.objects.create(source="slurm", external_id="4242", state="running", start_time=AT - 120 * MIN)
    for g in gpus[:8]:
        Allocation.objects.create(job=job, node=g.node, gpu=g, gpu_index=g.index, start=AT - 120 * MIN)
    rows = []
    for m in range(-3, 9):
        bucket = AT + m * MIN
        for k, g in enumerate(gpus):
            hot = k == 3 and HOT[0] <= bucket <= HOT[1]
            rows.append((g.id, bucket, {**LEVELS, "gpu_temp_avg": 62.0 + (k % 3) * 0.5,
                                        "memory_temp_avg": 84.0 if hot else 70.0}))
    insert_rollup("gpu", "1m", rows)
    return gpus


def state() -> tuple[list, list]:
    events = list(Anomaly.objects.order_by("kind", "entity_id", "started_at").values_list(
        "kind", "entity_id", "started_at", "last_seen", "ended_at", "score", "last_score", "summary"))
    scores = list(EntityScore.objects.order_by("entity_kind", "entity_id").values_list(
        "entity_kind", "entity_id", "anomaly_score", "anomaly_at"))
    return events, scores


def marks() -> dict[str, tuple]:
    return {m.kind: (m.done_until, m.minutes_scored, m.minutes_skipped) for m in ScoringWatermark.objects.all()}


def minute_by_minute(last) -> tuple[list, list]:
    """The state after one pass per minute from AT to `last`, from scratch (what beat does without faults)."""
    Anomaly.objects.all().delete()
    EntityScore.objects.all().delete()
    ScoringWatermark.objects.all().delete()
    clear_caches()
    load_active.cache_clear()
    at = AT
    while at <= last:
        assert [p["at"] for p in score_all(at)["detectors"]["passes"]] == [at.isoformat()]
        at += MIN
    return state()


def scored_minutes(caplog) -> list:
    """The minutes the detectors scored, in order, as score_fleet logged them."""
    return [r.args[0] for r in caplog.records if r.name == "anomaly.scoring" and r.msg.startswith("scored fleet")]


def test_a_pass_after_missed_minutes_scores_each_of_them_oldest_first_like_one_pass_a_minute(fleet, caplog):
    first = score_all(AT + MIN / 2)  # no watermark yet: only the minute holding `now`
    assert [p["at"] for p in first["detectors"]["passes"]] == [AT.isoformat()]

    caplog.set_level(logging.INFO, logger="anomaly.scoring")
    caplog.clear()
    out = score_all(AT + 4 * MIN + 59 * MIN / 60)  # beat's pass four minutes later, late in its minute
    minutes = [(AT + m * MIN).isoformat() for m in (1, 2, 3, 4)]
    assert scored_minutes(caplog) == minutes
    assert [p["at"] for p in out["detectors"]["passes"]] == minutes
    assert [p["at"] for p in out["failure_risk"]["passes"]] == minutes
    assert marks() == {"detectors": (AT + 4 * MIN, 5, 0), "failure_risk": (AT + 4 * MIN, 5, 0)}
    [event] = Anomaly.objects.all()  # gone at 12:04, the event waits out its hold (anomaly.grouping)
    assert (event.entity_id, event.started_at, event.last_seen, event.ended_at) == (
        "GPU-node-a-3", AT + 2 * MIN, AT + 3 * MIN, None)
    caught_up = state()

    assert score_all(AT + 4 * MIN)["detectors"]["passes"] == []  # every minute is scored once only
    assert minute_by_minute(AT + 4 * MIN) == caught_up


def test_a_pass_further_behind_than_the_cap_scores_the_last_minutes_and_logs_the_skipped_range(fleet, caplog,
                                                                                                 settings):
    settings.SCORING_MAX_CATCHUP_MINUTES = 3
    score_all(AT)
    caplog.set_level(logging.INFO, logger="anomaly")
    caplog.clear()
    out = score_all(AT + 10 * MIN)

    assert scored_minutes(caplog) == [(AT + m * MIN).isoformat() for m in (8, 9, 10)]
    jumped = {"from": (AT + MIN).isoformat(), "to": (AT + 7 * MIN).isoformat(), "minutes": 7}
    assert out["detectors"]["jumped"] == out["failure_risk"]["jumped"] == jumped
    [warning] = [m for r in caplog.records if r.levelno == logging.WARNING and "detectors" in (m := r.getMessage())]
    assert "10 minutes behind, more than the cap of 3" in warning
    assert f"minutes {(AT + MIN).isoformat()} to {(AT + 7 * MIN).isoformat()} are not scored" in warning
    assert marks() == {"detectors": (AT + 10 * MIN, 4, 7), "failure_risk": (AT + 10 * MIN, 4, 7)}


def test_a_catchup_cap_below_one_minute_is_refused_naming_the_setting(fleet, settings):
    settings.SCORING_MAX_CATCHUP_MINUTES = 0
    with pytest.raises(ImproperlyConfigured, match="SCORING_MAX_CATCHUP_MINUTES .* got 0"):
        score_all(AT)
    assert not ScoringWatermark.objects.exists()


def test_a_failed_minute_leaves_the_watermark_before_it_and_the_next_pass_resumes_there(fleet):
    score_all(AT)
    # A real database error at the very end of minute AT+2, after its events and scores are written: the
    # detectors' watermark refuses to move to it (the trigger goes with the test's transaction).
    with connection.cursor() as cur:
        cur.execute(f"""
            CREATE FUNCTION test_refuse_minute() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'injected failure for %', NEW.done_until; END $$;
            CREATE TRIGGER refuse_minute BEFORE UPDATE ON anomaly_scoring_watermark FOR EACH ROW
                WHEN (NEW.kind = 'detectors' AND NEW.done_until = '{(AT + 2 * MIN).isoformat()}')
                EXECUTE FUNCTION test_refuse_minute();""")

    out = score_all(AT + 3 * MIN)
    assert [p["at"] for p in out["detectors"]["passes"]] == [(AT + MIN).isoformat()]
    assert "injected failure" in out["detectors"]["error"] and out["detectors"]["error"].startswith(
        (AT + 2 * MIN).isoformat())
    assert len(out["failure_risk"]["passes"]) == 3  # the other kind is not held up
    assert marks()["detectors"] == (AT + MIN, 2, 0)
    # Minute AT+2 left nothing: GPU 3's event (it opens then) is not there, the fleet row still says AT+1.
    assert not Anomaly.objects.exists()
    assert EntityScore.objects.get(entity_kind="fleet").anomaly_at == AT + MIN

    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER refuse_minute ON anomaly_scoring_watermark")
    again = score_all(AT + 3 * MIN)
    assert [p["at"] for p in again["detectors"]["passes"]] == [(AT + m * MIN).isoformat() for m in (2, 3)]
    assert again["failure_risk"]["passes"] == [] and "error" not in again["detectors"]
    assert marks() == {"detectors": (AT + 3 * MIN, 4, 0), "failure_risk": (AT + 3 * MIN, 4, 0)}
    resumed = state()
    assert minute_by_minute(AT + 3 * MIN) == resumed


def test_the_score_command_advances_the_watermark_and_never_scores_a_minute_twice(fleet, capsys):
    call_command("score", "--now", (AT + 2 * MIN).isoformat())
    out = capsys.readouterr().out
    assert "detectors: 1 findings" in out and "as of 2026-11-30 12:02 UTC" in out and "GPU-node-a-3" in out

    call_command("score", "--now", (AT + 2 * MIN).isoformat())  # run again by hand: that minute is done
    out = capsys.readouterr().out
    assert "detectors: nothing to score, already scored through 2026-11-30 12:02 UTC" in out
    assert "failure risk: nothing to score" in out

    call_command("score", "--now", (AT + 4 * MIN).isoformat())
    out = capsys.readouterr().out
    assert [line.split(" as of ")[1] for line in out.splitlines() if line.startswith("detectors:")] == [
        "2026-11-30 12:03 UTC", "2026-11-30 12:04 UTC"]
    assert marks()["detectors"] == (AT + 4 * MIN, 3, 0)


@pytest.mark.django_db(transaction=True)
def test_a_second_pass_while_one_is_scoring_is_skipped_and_changes_nothing(fleet):
    score_all(AT + 2 * MIN)  # opens GPU 3's event, which the first pass below must lock
    [event] = Anomaly.objects.filter(ended_at=None)
    s = connection.settings_dict
    first: dict = {}

    def run_first():
        try:
            first.update(score_all(AT + 3 * MIN))
        finally:
            connection.close()

    with psycopg.connect(host=s["HOST"], port=s["PORT"], user=s["USER"], password=s["PASSWORD"],
                         dbname=s["NAME"]) as other:
        # The first pass takes the scoring lock, computes its findings and waits in its write for this row.
        other.execute("SELECT id FROM anomaly_anomaly WHERE id = %s FOR UPDATE", [event.pk])
        thread = threading.Thread(target=run_first)
        thread.start()
        deadline = time.monotonic() + 20
        while not _blocked_on(other.info.backend_pid):
            assert thread.is_alive() and time.monotonic() < deadline, "the first pass never reached its write"
            time.sleep(0.02)

        second = score_all(AT + 3 * MIN)
        assert "another process holds the scoring lock" in second["skipped"]
        assert second["detectors"]["passes"] == [] and "failure_risk" not in second
        other.rollback()
    thread.join(timeout=20)
    assert [p["at"] for p in first["detectors"]["passes"]] == [(AT + 3 * MIN).isoformat()]
    assert marks()["detectors"] == (AT + 3 * MIN, 2, 0)  # scored once, by the first pass
    wait_for_trailing_publish()  # the passes' fleet publishes read this database: done before it is dropped


def _blocked_on(pid: int) -> list:
    with connection.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [pid])
        return cur.fetchall()
