"""Reconciliation against the real Alibaba GPU trace (cluster-trace-gpu-v2023): the pod lists imported as k8s
jobs and ledger rows, metered, and compared per pod and per QoS class with GPU-hours computed straight from the
CSV (csv module and exact fractions, no project code). Fractional pods (gpu_milli < 1000) included.

Both full files are used (8,152 pods each, ~6,200 holding GPUs, ~150 days); import and metering take seconds.
"""

from __future__ import annotations

import csv
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
from django.db import connection
from django.db.models import Count, Sum

from tenancy.importers import do_import_alibaba_pods
from tenancy.metering import meter_hours
from tenancy.models import UsageHour
from tests.tenancy.metering_factories import make_tenant

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)  # the trace's second 0
# The trace's QoS classes as priority classes, written out here rather than imported from the code under test.
EXPECTED_CLASS = {"LS": "latency-sensitive", "BE": "best-effort", "Burstable": "burstable",
                  "Guaranteed": "guaranteed"}
RESOLUTION = Decimal("0.0000005")  # a stored hour row is rounded to 1e-6 GPU-hours


def _analyze(*tables: str) -> None:
    """Fresh planner statistics, as autovacuum keeps them in production. The test's rows are uncommitted, so
    autovacuum never counts them, and an earlier test's rolled-back bulk insert can leave a table analysed
    as empty over dozens of pages: the planner then nest-loops 60k rows against 6k and a query takes minutes."""
    with connection.cursor() as cur:
        for table in tables:
            cur.execute(f"ANALYZE {table}")


def _expected(path) -> tuple[dict[str, Fraction], dict[str, Fraction], Counter]:
    """GPU-hours per pod and per QoS class from the CSV: num_gpu x gpu_milli / 1000 x (deletion - scheduled)."""
    per_pod, per_qos, skipped = {}, defaultdict(Fraction), Counter()
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["scheduled_time"] == "":
                skipped["never_scheduled"] += 1
                continue
            gpus = Fraction(int(row["num_gpu"]) * int(row["gpu_milli"]), 1000)
            if gpus == 0:
                skipped["no_gpu"] += 1
                continue
            hours = gpus * (int(row["deletion_time"]) - int(row["scheduled_time"])) / 3600
            per_pod[row["name"]] = hours
            per_qos[EXPECTED_CLASS[row["qos"]]] += hours
    return per_pod, per_qos, skipped


@pytest.mark.timeout(300)
@pytest.mark.parametrize("trace", ["default", "gpushare40"])
def test_alibaba_trace_gpu_hours_match_the_csv_per_pod_and_qos(shared_data, trace):
    folder = shared_data / "traces" / "alibaba-gpu-v2023"
    pod_csv = folder / f"openb_pod_list_{trace}.csv"
    tenant = make_tenant("openb", ("k8s", "openb"))
    t0 = time.perf_counter()
    counts = do_import_alibaba_pods(pod_csv, folder / "openb_node_list_gpu_node.csv", origin=ORIGIN)
    imported = time.perf_counter() - t0
    per_pod, per_qos, skipped = _expected(pod_csv)
    assert counts["jobs"] == len(per_pod) and counts["unplaceable"] == 0
    assert (counts["never_scheduled"], counts["no_gpu"]) == (skipped["never_scheduled"], skipped["no_gpu"])

    _analyze("telemetry_job", "telemetry_allocation", "telemetry_jobstatechange", "telemetry_gpu", "telemetry_node")
    last = ORIGIN + timedelta(seconds=max(int(r["deletion_time"]) for r in csv.DictReader(open(pod_csv))))
    t0 = time.perf_counter()
    rows = meter_hours(ORIGIN, last)
    metered = time.perf_counter() - t0
    _analyze("tenancy_usagehour")

    got = {ext.partition("/")[2]: (hours, n) for ext, hours, n in UsageHour.objects.values("job__external_id")
           .annotate(h=Sum("gpu_hours"), n=Count("id")).values_list("job__external_id", "h", "n")}
    assert set(got) == set(per_pod)
    worst = Decimal(0)
    for name, expected in per_pod.items():
        hours, n = got[name]
        exact = Decimal(expected.numerator) / Decimal(expected.denominator)
        diff = abs(hours - exact)
        assert diff <= max(exact * Decimal("0.001"), RESOLUTION * n), (name, hours, exact)
        worst = max(worst, diff / exact)
    by_qos = dict(UsageHour.objects.values("qos").annotate(h=Sum("gpu_hours")).values_list("qos", "h"))
    assert set(by_qos) == set(per_qos)
    qos_worst = 0.0
    for qos, expected in per_qos.items():
        rel = abs(float(by_qos[qos]) - float(expected)) / float(expected)
        assert rel < 1e-6, (qos, by_qos[qos], float(expected))
        qos_worst = max(qos_worst, rel)
    assert set(UsageHour.objects.values_list("tenant_id", flat=True)) == {tenant.id}
    total = sum(by_qos.values())
    print(f"\nalibaba {trace}: {counts['jobs']} pods, {counts['allocations']} ledger rows imported in "
          f"{imported:.1f} s; {rows} usage rows metered in {metered:.1f} s; {float(total):.3f} GPU-hours "
          f"(CSV {float(sum(per_qos.values())):.3f}); worst per-pod relative error {float(worst):.2e}, "
          f"worst per-QoS {qos_worst:.2e}; per QoS: "
          + ", ".join(f"{q} {float(h):.3f}" for q, h in sorted(by_qos.items())))


def test_import_refuses_a_naive_origin(shared_data):
    folder = shared_data / "traces" / "alibaba-gpu-v2023"
    with pytest.raises(ValueError):
        do_import_alibaba_pods(folder / "openb_pod_list_default.csv", folder / "openb_node_list_gpu_node.csv",
                               origin=datetime(2026, 1, 1))  # noqa: DTZ001 - naive on purpose
