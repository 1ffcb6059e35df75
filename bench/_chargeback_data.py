"""The synthetic world of bench/chargeback: a 16,384-GPU inventory, tenants, rate cards, a month's schedule
and ledger, the UsageHour rows metering would make of it (exact arithmetic, metering's definitions), and raw
10 s samples for a window. Seeded, so every run builds the same month."""

from __future__ import annotations

import math
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import numpy as np
from _common import say

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
MIG_PROFILE, MIG_SLICES = "1g.10gb", 7
GPN = 8  # GPUs per node
STEP = 10  # seconds between raw samples
PERIOD = (datetime(2026, 9, 1, tzinfo=UTC), datetime(2026, 10, 1, tzinfo=UTC))
CHANGE_AT = datetime(2026, 9, 16, 8, tzinfo=UTC)  # the default card changes here, inside the raw window
PG_EPOCH = 946684800  # 2000-01-01 in Unix seconds: binary COPY counts microseconds from there
# Watts by pool and state (0 unallocated, 1 idle-held, 2 busy); MIG and shared GPUs draw a constant.
POWER = {"h100": (70, 110, 650), "a100": (50, 60, 380), "mig": (250, 250, 250), "shared": (300, 300, 300)}
SLURM_QOS = (("normal", 0.7), ("high", 0.1), ("preemptible", 0.2))
K8S_QOS = (("standard", 0.75), ("spot", 0.25))


def ts(t: int) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def epoch(t: datetime) -> int:
    return int(t.timestamp())


# --- 1. Fleet, tenants, cards ------------------------------------------------------------------------------


@dataclass
class Fleet:
    """GPU rows of the inventory, in node order, and what each belongs to."""

    gpu_ids: np.ndarray
    node_ids: np.ndarray
    pool: list[str]  # per node
    mig_ids: dict[int, list[int]]  # gpu id -> its MIG instance ids
    row_of: dict[int, int] = field(default_factory=dict)  # gpu id -> row in the sample matrices


def build_fleet(n_gpus: int) -> Fleet:
    from telemetry.models import Gpu, MigInstance, Node

    nodes = n_gpus // GPN
    special = max(1, nodes // 512)  # 4 MIG nodes and 4 shared nodes at 2,048 nodes
    a100 = int(nodes * 0.36)
    pools = ["h100"] * (nodes - a100) + ["a100"] * (a100 - 2 * special) + ["mig"] * special + ["shared"] * special
    node_objs = Node.objects.bulk_create([Node(hostname=f"gpu{i:05d}", system_model="DGX") for i in range(nodes)])
    gpus = Gpu.objects.bulk_create([
        Gpu(uuid=f"GPU-{i * GPN + j:08d}", node=n, index=j, model=H100 if pools[i] == "h100" else A100,
            mig_mode=pools[i] == "mig") for i, n in enumerate(node_objs) for j in range(GPN)], batch_size=4096)
    migs = MigInstance.objects.bulk_create([
        MigInstance(gpu=g, gi_id=7 + k, ci_id=0, profile=MIG_PROFILE) for g in gpus if g.mig_mode
        for k in range(MIG_SLICES)])
    mig_ids = defaultdict(list)
    for m in migs:
        mig_ids[m.gpu_id].append(m.id)
    fleet = Fleet(np.array([g.id for g in gpus]), np.array([g.node_id for g in gpus]), pools, dict(mig_ids))
    fleet.row_of = {gid: r for r, gid in enumerate(fleet.gpu_ids.tolist())}
    return fleet


def build_tenants(n: int):
    from tenancy.models import Tenant, TenantAccount

    tenants = Tenant.objects.bulk_create([
        Tenant(name=f"Tenant {i:03d}", slug=f"t{i:03d}", kind="organisation",
               billing_mode="showback" if i % 10 == 9 else "invoice") for i in range(n)])
    TenantAccount.objects.bulk_create(
        [TenantAccount(tenant=t, kind="slurm", name=f"acct-{i:03d}") for i, t in enumerate(tenants)]
        + [TenantAccount(tenant=t, kind="k8s", name=f"ns-{i:03d}") for i, t in enumerate(tenants)])
    return tenants


def build_cards(tenants) -> None:
    """Two default cards (the second from CHANGE_AT) and five tenants' own cards, one starting mid-month."""
    from tenancy.models import RateCard, RatePrice

    def make(name, start, owner, prices, **kw):
        c = RateCard.objects.create(name=name, effective_from=start, tenant=owner, **kw)
        RatePrice.objects.bulk_create([RatePrice(card=c, gpu_model=m, mig_profile=p, priority_class=q,
                                                 price_per_gpu_hour=Decimal(v)) for (m, p, q), v in prices.items()])

    base = {("", "", ""): "2.00", (H100, "", ""): "3.20", (A100, "", ""): "1.90", (A100, MIG_PROFILE, ""): "2.10",
            ("", "", "high"): "4.00", (H100, "", "high"): "4.60"}
    spot = {"preemptible_qos": ["preemptible", "spot"]}
    make("Standard 2026-H2", PERIOD[0] - timedelta(days=92), None, base, price_per_kwh=Decimal("0.12"),
         idle_held_price_per_gpu_hour=Decimal("0.40"), preemptible_discount=Decimal("0.35"), **spot)
    make("Standard 2026-09b", CHANGE_AT, None, {k: str(Decimal(v) * Decimal("0.95")) for k, v in base.items()},
         price_per_kwh=Decimal("0.135"), idle_held_price_per_gpu_hour=Decimal("0.45"),
         preemptible_discount=Decimal("0.4"), **spot)
    for i, start in ((3, PERIOD[0] - timedelta(days=30)), (17, PERIOD[0] - timedelta(days=30)),
                     (42, PERIOD[0] - timedelta(days=10)), (55, PERIOD[0] - timedelta(days=30)),
                     (7, PERIOD[0] + timedelta(days=20, hours=13))):
        if i < len(tenants):
            make(f"{tenants[i].slug} contract", start, tenants[i],
                 {k: str(Decimal(v) * Decimal("0.87")) for k, v in base.items()}, price_per_kwh=Decimal("0.11"),
                 idle_held_price_per_gpu_hour=None if i == 55 else Decimal("0.30"),
                 preemptible_discount=Decimal("0.3"), **spot)


# --- 2. Schedule and ledger --------------------------------------------------------------------------------


@dataclass
class SimJob:
    """One job of the synthetic schedule; times in Unix seconds on whole minutes."""

    id: int
    tenant: int
    pool: str
    qos: str
    start: int
    end: int
    idle_end: int  # idle-held from start until here
    gpus: list[tuple[int, int, int, int | None]]  # (node id, gpu id, gpu index, mig id)
    frac: Fraction


def lanes(fleet: Fleet, rng) -> list[tuple[str, list, Fraction]]:
    """Slots that run one job after another: node groups, GPU sets inside a node, MIG slices, GPU halves."""
    out, by_pool = [], defaultdict(list)
    for n, pool in enumerate(fleet.pool):
        by_pool[pool].append(n)

    def gpus(n, idx, mig=None):
        r = n * GPN + idx
        return (int(fleet.node_ids[r]), int(fleet.gpu_ids[r]), idx, mig)

    for pool in ("h100", "a100"):
        nodes = by_pool[pool]
        while nodes:
            size = int(rng.choice([1, 2, 4, 8, 16], p=[0.3, 0.2, 0.2, 0.15, 0.15]))
            group, nodes = nodes[:size], nodes[size:]
            if size > 1:
                out.append((pool, [gpus(n, j) for n in group for j in range(GPN)], Fraction(1)))
                continue
            split = [[8], [4, 4], [4, 2, 2], [2, 2, 2, 1, 1]][int(rng.integers(4))]
            first = 0
            for width in split:
                out.append((pool, [gpus(group[0], j) for j in range(first, first + width)], Fraction(1)))
                first += width
    for n in by_pool["mig"]:
        for j in range(GPN):
            gid = int(fleet.gpu_ids[n * GPN + j])
            out += [("mig", [gpus(n, j, m)], Fraction(1, MIG_SLICES)) for m in fleet.mig_ids[gid]]
    for n in by_pool["shared"]:
        out += [("shared", [gpus(n, j)], Fraction(1, 2)) for j in range(GPN) for _ in range(2)]
    return out


def schedule(fleet: Fleet, n_tenants: int, t0: int, t1: int, seed: int) -> list[SimJob]:
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, n_tenants + 1) ** 0.8
    weights /= weights.sum()
    jobs: list[SimJob] = []
    for pool, slot, frac in lanes(fleet, rng):
        median_h = 16 if pool in ("h100", "a100") else 12
        t = t0 - int(rng.integers(0, 48 * 60)) * 60
        while t < t1:
            dur = int(np.clip(rng.lognormal(math.log(median_h * 60), 1.0), 30, 120 * 60)) * 60
            k8s = pool in ("mig", "shared")
            names, probs = zip(*(K8S_QOS if k8s else SLURM_QOS), strict=True)
            idle = 0 if pool == "shared" else (dur if rng.random() < 0.03 else
                                                int(rng.integers(0, 46)) * 60 * int(rng.random() < 0.5))
            jobs.append(SimJob(len(jobs) + 1, int(rng.choice(n_tenants, p=weights)), pool,
                               str(rng.choice(names, p=probs)), t, t + dur, t + min(idle, dur), slot, frac))
            t += dur + (0 if rng.random() < 0.4 else int(rng.integers(1, 241)) * 60)
    return jobs


def write_ledger(url: str, jobs: list[SimJob]) -> int:
    """Jobs and allocations by COPY (ids assigned here, so allocations can name their job)."""
    import psycopg

    now = datetime.now(UTC)
    rows = 0
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy("COPY telemetry_job (id, source, external_id, name, \"user\", account, \"partition\", qos, "
                      "state, start_time, end_time, node_count, gpu_count, requeue_count, preempt_count, updated) "
                      "FROM STDIN") as cp:
            for j in jobs:
                k8s = j.pool in ("mig", "shared")
                cp.write_row((j.id, "k8s" if k8s else "slurm", f"pod-{j.id:07d}" if k8s else str(100000 + j.id),
                              f"job {j.id}", "u", f"{'ns' if k8s else 'acct'}-{j.tenant:03d}", "gpu", j.qos,
                              "completed", ts(j.start), ts(j.end), len({g[0] for g in j.gpus}),
                              float(len(j.gpus) * j.frac), 0, 0, now))
        with cur.copy('COPY telemetry_allocation (job_id, node_id, gpu_id, gpu_index, mig_instance_id, fraction, '
                      'start, "end") FROM STDIN') as cp:
            for j in jobs:
                for node, gpu, idx, mig in j.gpus:
                    cp.write_row((j.id, node, gpu, idx, mig, float(j.frac), ts(j.start), ts(j.end)))
                    rows += 1
        cur.execute("SELECT setval(pg_get_serial_sequence('telemetry_job', 'id'), (SELECT max(id) FROM telemetry_job))")
    return rows


# --- Metering arithmetic, shared by the generated usage and the raw path -------------------------------------


@dataclass(frozen=True)
class Meter:
    """metering's constants (tenancy/metering.py reads the same settings)."""

    idle_threshold: float
    node_w: int
    pue_minus_1: Fraction

    @classmethod
    def from_settings(cls) -> Meter:
        from django.conf import settings

        return cls(settings.IDLE_HELD_THRESHOLD, int(settings.NODE_OVERHEAD_W), Fraction(str(settings.PUE)) - 1)

    def quantities(self, sec: int, idle: int, mj: int, den: int) -> tuple[str, ...]:
        """One UsageHour's quantities from fraction-weighted seconds, idle-held seconds and counter mJ, given as
        numerators over `den`; each rounded half up to 6 places once, as metering rounds its per-hour sums.
        Integer arithmetic, so exact (and fast enough for a month of rows)."""
        kwh = den * 3_600_000_000  # mJ per kWh; node watt-seconds over GPN GPUs share the denominator
        node = self.node_w * sec * (1000 // GPN)
        g, i = _r6(sec, den * 3600), _r6(idle, den * 3600)
        pa, pb = self.pue_minus_1.numerator, self.pue_minus_1.denominator
        return (_fmt(g), _fmt(g - i), _fmt(i), "0", _fmt(_r6(mj, kwh)), _fmt(_r6(node, kwh)),
                _fmt(_r6(pa * (mj + node), pb * kwh)))

    def from_fractions(self, sec: Fraction, idle: Fraction, mj: Fraction) -> tuple[str, ...]:
        den = math.lcm(sec.denominator, idle.denominator, mj.denominator)
        return self.quantities(int(sec * den), int(idle * den), int(mj * den), den)


assert 1000 % GPN == 0, "node overhead shares the kWh denominator"


def _r6(num: int, den: int) -> int:
    """num / den rounded half up to millionths (num, den >= 0); returns the count of millionths."""
    return (2 * num * 1_000_000 + den) // (2 * den)


def _fmt(micros: int) -> str:
    return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


def job_pieces(j: SimJob, lo: int, hi: int):
    """(hour, seconds, idle seconds, mJ per GPU-equivalent) for each clock hour of `j` inside [lo, hi)."""
    s, e = max(j.start, lo), min(j.end, hi)
    p_idle, p_busy = POWER[j.pool][1], POWER[j.pool][2]
    h = s - s % 3600
    while h < e:
        ps, pe = max(s, h), min(e, h + 3600)
        idle = max(0, min(pe, j.idle_end) - ps)
        # A sample at t carries the energy of (t - 10 s, t], drawn at the state of t.
        yield h, pe - ps, idle, (idle * p_idle + (pe - ps - idle) * p_busy) * 1000
        h += 3600


def write_usage(url: str, jobs: list[SimJob], meter: Meter, lo: int, hi: int, tenant_ids: list[int]) -> int:
    """UsageHour rows for [lo, hi) from the schedule, by COPY (text)."""
    import psycopg

    rows, buf, hours = 0, [], {}
    with psycopg.connect(url) as conn, conn.cursor() as cur, cur.copy(
            "COPY tenancy_usagehour (hour, tenant_id, job_id, gpu_model, mig_profile, qos, gpu_hours, busy_hours, "
            "idle_held_hours, lost_hours, energy_gpu_kwh, energy_node_kwh, energy_facility_kwh) FROM STDIN") as cp:
        for j in jobs:
            num, den = len(j.gpus) * j.frac.numerator, j.frac.denominator
            model = H100 if j.pool == "h100" else A100
            profile = MIG_PROFILE if j.pool == "mig" else ""
            head = f"\t{tenant_ids[j.tenant]}\t{j.id}\t{model}\t{profile}\t{j.qos}\t"
            for h, sec, idle, mj in job_pieces(j, lo, hi):
                q = meter.quantities(sec * num, idle * num, mj * num, den)
                if h not in hours:
                    hours[h] = ts(h).isoformat()
                buf.append(hours[h] + head + "\t".join(q) + "\n")
                rows += 1
            if len(buf) > 50000:
                cp.write("".join(buf))
                buf = []
        cp.write("".join(buf))
    return rows


# --- 4. Raw samples for the window -------------------------------------------------------------------------


_GPU_ROW = np.dtype([("n", ">i2"), ("l1", ">i4"), ("id", ">i4"), ("l2", ">i4"), ("t", ">i8"), ("l3", ">i4"),
                     ("gr", ">f4"), ("l4", ">i4"), ("e", ">i8")])
_MIG_ROW = np.dtype([("n", ">i2"), ("l1", ">i4"), ("id", ">i4"), ("l2", ">i4"), ("t", ">i8"), ("l3", ">i4"),
                     ("gr", ">f4")])
_COPY_HEAD = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)


def paint_window(fleet: Fleet, jobs: list[SimJob], base: int, k: int, seed: int):
    """State matrices for samples at base + 10 s x [0, k): GPU power (W) and GR activity, MIG activity."""
    rng = np.random.default_rng(seed + 1)
    n = len(fleet.gpu_ids)
    state = np.zeros((n, k), dtype=np.int8)
    mig_rows = {m: i for i, m in enumerate(sorted(m for ms in fleet.mig_ids.values() for m in ms))}
    mig_state = np.zeros((len(mig_rows), k), dtype=np.int8)
    end = base + STEP * k
    for j in jobs:
        if j.start >= end or j.end <= base:
            continue
        k0, k1 = max(0, -(-(j.start - base) // STEP)), min(k, -(-(j.end - base) // STEP))
        ki = min(k1, max(k0, -(-(j.idle_end - base) // STEP)))
        if j.pool == "mig":
            r = [mig_rows[g[3]] for g in j.gpus]
            mig_state[r, k0:ki], mig_state[r, ki:k1] = 1, 2
        else:
            r = [fleet.row_of[g[1]] for g in j.gpus]
            state[r, k0:ki], state[r, ki:k1] = 1, 2
    node_pool = np.repeat(np.array(fleet.pool), GPN)
    watts = np.zeros((n, k), dtype=np.int64)
    for pool, levels in POWER.items():
        rows = node_pool == pool
        watts[rows] = np.asarray(levels)[state[rows]]
    state[node_pool == "shared"] = 2  # shared GPUs are busy whatever their pods do
    gr = np.where(state == 2, 0.4 + 0.55 * rng.random((n, k), dtype=np.float32),
                  0.03 * rng.random((n, k), dtype=np.float32)).astype(np.float32)
    mig_gr = np.where(mig_state == 2, 0.4 + 0.55 * rng.random(mig_state.shape, dtype=np.float32),
                      0.03 * rng.random(mig_state.shape, dtype=np.float32)).astype(np.float32)
    energy = watts * STEP * 1000
    counter = rng.integers(10**9, 10**12, size=(n, 1)) + np.cumsum(energy, axis=1)
    for r in (0, n // 3, n - 1):  # a few counters reset (driver reload) mid-window
        counter[r, k // 2:] = np.cumsum(energy[r, k // 2:])
    return gr, counter, mig_gr, sorted(mig_rows)


def copy_window(url: str, fleet: Fleet, gr, counter, mig_gr, mig_ids, base: int) -> int:
    """Binary COPY of the window's GPU and MIG samples, in time order like ingest writes them."""
    import psycopg

    n, k = gr.shape
    rows = 0
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        for table, cols, dtype, ids, values in (
                ("telemetry_gpu_sample", "gpu_id, time, gr_engine_active, energy_mj", _GPU_ROW, fleet.gpu_ids,
                 (gr, counter)),
                ("telemetry_mig_sample", "mig_id, time, gr_engine_active", _MIG_ROW, np.array(mig_ids),
                 (mig_gr,))):
            with cur.copy(f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)") as cp:
                cp.write(_COPY_HEAD)
                for t0 in range(0, k, 30):
                    t1 = min(k, t0 + 30)
                    block = np.zeros((t1 - t0, len(ids)), dtype=dtype)
                    block["n"] = len(values) + 2
                    block["l1"], block["id"], block["l2"], block["l3"] = 4, ids[None, :], 8, 4
                    block["t"] = ((base - PG_EPOCH + STEP * np.arange(t0, t1)) * 1_000_000)[:, None]
                    block["gr"] = values[0][:, t0:t1].T
                    if len(values) > 1:
                        block["l4"], block["e"] = 8, values[1][:, t0:t1].T
                    cp.write(block.tobytes())
                    rows += block.size
                cp.write(b"\xff\xff")
            conn.commit()
            say(f"  {table}: {n if len(values) > 1 else len(ids)} series x {k} samples written")
        cur.execute("ANALYZE telemetry_gpu_sample")
        cur.execute("ANALYZE telemetry_mig_sample")
        conn.commit()
    return rows
