"""Safe remediation: actions with modes and approvals, guard rails, playbooks, the executor and its backends.

Writes live in `actions` (request, approve, reject), the checks in `guards`, execution in `executor`, and each
way of touching the outside world (Slurm, Kubernetes, the node agent, the simulator, a ticket) in `backends`.
"""
