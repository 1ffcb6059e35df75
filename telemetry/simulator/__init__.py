"""A realistic simulated GPU cluster, driven through the real ingest API.

- `topology`: the cluster's layout (racks, nodes, GPUs, HCAs, rail-optimised fabric, PDUs,
  cooling loops) and its topology document;
- `dynamics`: the `Cluster` state machine whose `step(now)` returns one tick of records,
  built from `jobs` (scheduler and job character), `gpus`, `fabric`, `facility` and `faults`;
- `feed`: what the cluster reports about its jobs: scheduler snapshots for ``/api/v1/jobs`` and
  per-rank training step times for ``/api/v1/training``;
- `client`: the HTTP pusher (gzip, keep-alive, retries); `runner`: the wall-clock tick loop
  behind ``manage.py simulate``.

Everything here is pure Python with no Django imports except the runner's topology import,
so the dynamics can be tested and benchmarked without a database.
"""
