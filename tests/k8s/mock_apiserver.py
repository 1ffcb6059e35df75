"""A scripted Kubernetes API server on a loopback port, for driving the real `kubernetes` client in tests.

It serves only what the pod watcher asks for:

* `GET /api/v1/pods` (and `/api/v1/namespaces/<ns>/pods`): the next scripted list, a PodList with
  `metadata.resourceVersion`; the last one is repeated once the script runs out.
* the same path with `?watch=1` (or `true`): the next scripted watch, sent as a chunked stream of JSON watch
  events, one per line and one chunk each, as the API server does. An event is `(type, object)`; the stream
  ends after the last event, like a watch whose `timeoutSeconds` ran out. An exhausted script answers with
  an empty stream. `gone_event()` makes the ERROR event an expired resourceVersion produces.

Every request is recorded (path and query) so tests can check which resourceVersion the client resumed from.

For remediation it also keeps live state that writes change (`add_node`, `add_pod`):

* `GET /api/v1/nodes/<name>`, `PATCH` it (a JSON merge: cordon sets spec.unschedulable);
* `GET /api/v1/pods` with no scripted list left serves the live pods, filtered by `fieldSelector=spec.nodeName=X`;
* `GET` / `DELETE /api/v1/namespaces/<ns>/pods/<name>` (a delete removes the pod);
* `POST /api/v1/namespaces/<ns>/pods/<name>/eviction` (policy/v1 Eviction) removes the pod, or answers 429 as a
  PodDisruptionBudget does for pods named in `pdb_protected`.
Writes are recorded with their method and body in `writes`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

__all__ = ["MockApiServer", "gone_event", "gpu_pod", "k8s_node"]

# Shaped after the pods in the CNCF AI-conformance evidence (../shared/data/k8s/cncf-k8s-ai-conformance-evidence):
# NVIDIA's CUDA sample image, runtimeClassName nvidia, GPUs as container limits, restartPolicy Never.
CUDA_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1-ubuntu20.04"


def _container_status(state: dict, restarts: int = 0) -> dict:
    return {"name": "cuda-container", "image": CUDA_IMAGE, "imageID": f"{CUDA_IMAGE}@sha256:" + "0" * 64,
            "containerID": "containerd://" + "c" * 64, "ready": "running" in state, "started": "running" in state,
            "restartCount": restarts, "state": state, "lastState": {}}


def gpu_pod(name: str, uid: str, *, phase: str = "Running", limits: dict | None = None, node: str = "gpu-node-01",
            namespace: str = "ml-team", created: str = "2026-11-30T10:00:00Z", started: str | None = None,
            finished: str | None = None, exit_code: int = 0, reason: str = "", resource_version: str = "1",
            deletion: str | None = None, conditions: list[dict] | None = None, annotations: dict | None = None,
            ) -> dict:
    """A pod as `kubectl get pod -o json` prints it. `started` defaults to a minute after `created` once the
    pod is past Pending; `finished` makes its container terminated with `exit_code`."""
    limits = {"nvidia.com/gpu": "1"} if limits is None else limits
    if started is None and (phase != "Pending" or finished):
        started = created.replace("T10:00:00", "T10:01:00")
    meta = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": resource_version,
            "creationTimestamp": created, "labels": {"app": name}, "annotations": annotations or {}}
    if deletion:
        meta.update(deletionTimestamp=deletion, deletionGracePeriodSeconds=30)
    spec = {"containers": [{"name": "cuda-container", "image": CUDA_IMAGE, "command": ["sleep", "3600"],
                            "resources": {"limits": dict(limits), "requests": dict(limits)}}],
            "restartPolicy": "Never", "runtimeClassName": "nvidia", "schedulerName": "default-scheduler",
            "priorityClassName": "gpu-batch", "priority": 1000, "nodeName": node}
    if not node:
        spec.pop("nodeName")
    status: dict = {"phase": phase, "qosClass": "BestEffort", "conditions": list(conditions or [])}
    if reason:
        status["reason"] = reason
    if started:
        status["startTime"] = started
        running = {"running": {"startedAt": started}}
        done = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                               "startedAt": started, "finishedAt": finished}}
        status["containerStatuses"] = [_container_status(done if finished else running)]
    return {"metadata": meta, "spec": spec, "status": status}


def gone_event(resource_version: str) -> tuple[str, dict]:
    """The ERROR event an API server sends when the watch's resourceVersion is older than its history."""
    return "ERROR", {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"too old resource version: {resource_version} (4242)", "reason": "Expired", "code": 410,
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked transfer needs 1.1
    server: MockApiServer

    def log_message(self, format: str, *args) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.server.record(url.path, query)
        live = self.server.live_get(url.path, query)
        if live is not None:
            self._send_json(*live)
            return
        if not (url.path == "/api/v1/pods" or (url.path.startswith("/api/v1/namespaces/")
                                                and url.path.endswith("/pods"))):
            self._send_json(404, _not_found(url.path))
            return
        if query.get("watch") in {"1", "true", "True"}:
            self._stream(self.server.next_watch())
        else:
            self._send_json(200, self.server.next_list())

    def _write(self, method: str) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null") if length else None
        self.server.record(url.path, {"method": method, "authorization": self.headers.get("Authorization", "")})
        self._send_json(*self.server.live_write(method, url.path, body))

    def do_PATCH(self) -> None:
        self._write("PATCH")

    def do_POST(self) -> None:
        self._write("POST")

    def do_DELETE(self) -> None:
        self._write("DELETE")

    def _send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: list[tuple[str, dict]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for kind, obj in events:
            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _not_found(what: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound",
            "message": f"{what} not found"}


def _merge(target: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch (what a strategic merge of plain fields amounts to)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value
    return target


def k8s_node(name: str, *, unschedulable: bool = False, gpus: int = 8) -> dict:
    """A Node object as the API server returns it."""
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "uid": f"node-{name}", "resourceVersion": "1", "labels": {
                "kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "spec": {"unschedulable": unschedulable} if unschedulable else {},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)}, "allocatable": {"nvidia.com/gpu": str(gpus)}}}


class MockApiServer(ThreadingHTTPServer):
    """ThreadingHTTPServer on 127.0.0.1:0 serving scripted pod lists and watch streams; use as a context
    manager, which starts it in a thread and shuts it down."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self._lock = threading.Lock()
        self.lists: list[dict] = []
        self.watches: list[list[tuple[str, dict]]] = []
        self.requests: list[tuple[str, dict]] = []
        self.nodes: dict[str, dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.pdb_protected: set[tuple[str, str]] = set()
        self.writes: list[tuple[str, str, object]] = []
        self._version = 1000
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add_list(self, pods: list[dict], resource_version: str) -> None:
        """Script the next list answer."""
        self.lists.append({"kind": "PodList", "apiVersion": "v1",
                           "metadata": {"resourceVersion": resource_version}, "items": pods})

    def add_watch(self, events: list[tuple[str, dict]]) -> None:
        """Script the next watch stream."""
        self.watches.append(list(events))

    def record(self, path: str, query: dict) -> None:
        with self._lock:
            self.requests.append((path, query))

    def next_list(self) -> dict:
        with self._lock:
            return self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]

    def next_watch(self) -> list[tuple[str, dict]]:
        with self._lock:
            return self.watches.pop(0) if self.watches else []

    # --- live state for remediation (cordon, eviction, deletion) ----------------------------------
    def add_node(self, name: str, **kwargs) -> dict:
        """Serve a Node named `name` (see `k8s_node`)."""
        self.nodes[name] = k8s_node(name, **kwargs)
        return self.nodes[name]

    def add_pod(self, pod: dict) -> dict:
        """Serve `pod` (e.g. from `gpu_pod`) as live state: listed, readable, evictable, deletable."""
        meta = pod["metadata"]
        self.pods[(meta.get("namespace", "default"), meta["name"])] = pod
        return pod

    def _bump(self, obj: dict) -> dict:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        return obj

    def live_get(self, path: str, query: dict) -> tuple[int, dict] | None:
        """The answer from live state, or None for the scripted list/watch paths."""
        parts = path.strip("/").split("/")
        with self._lock:
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                node = self.nodes.get(parts[3])
                return (200, node) if node else (404, _not_found(f'nodes "{parts[3]}"'))
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 and parts[4] == "pods":
                pod = self.pods.get((parts[3], parts[5]))
                return (200, pod) if pod else (404, _not_found(f'pods "{parts[5]}"'))
            if path == "/api/v1/pods" and not self.lists and query.get("watch") not in {"1", "true", "True"}:
                return 200, self._live_list(query.get("fieldSelector", ""))
        return None

    def _live_list(self, selector: str) -> dict:
        node = selector.removeprefix("spec.nodeName=") if selector.startswith("spec.nodeName=") else None
        items = [p for p in self.pods.values() if node is None or p["spec"].get("nodeName") == node]
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._version)},
                "items": items}

    def live_write(self, method: str, path: str, body: object) -> tuple[int, dict]:
        """PATCH a node, POST an eviction, DELETE a pod; anything else is 404."""
        parts = path.strip("/").split("/")
        with self._lock:
            self.writes.append((method, path, body))
            if method == "PATCH" and parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                node = self.nodes.get(parts[3])
                if node is None:
                    return 404, _not_found(f'nodes "{parts[3]}"')
                return 200, self._bump(_merge(node, body or {}))
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) >= 6 and parts[4] == "pods":
                key = (parts[3], parts[5])
                if key not in self.pods:
                    return 404, _not_found(f'pods "{parts[5]}"')
                if method == "POST" and parts[6:] == ["eviction"]:
                    if key in self.pdb_protected:
                        return 429, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
                                     "reason": "TooManyRequests",
                                     "message": "Cannot evict pod as it would violate the pod's disruption budget."}
                    self.pods.pop(key)
                    return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
                if method == "DELETE" and len(parts) == 6:
                    return 200, self.pods.pop(key)
        return 404, _not_found(path)

    def __enter__(self) -> MockApiServer:
        self._thread = threading.Thread(target=self.serve_forever, name="mock-apiserver", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
