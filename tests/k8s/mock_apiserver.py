"""A scripted Kubernetes API server on a loopback port, for driving the real `kubernetes` client in tests.

It serves only what the pod watcher asks for:

* `GET /api/v1/pods` (and `/api/v1/namespaces/<ns>/pods`): the next scripted list, a PodList with
  `metadata.resourceVersion`; the last one is repeated once the script runs out.
* the same path with `?watch=1` (or `true`): the next scripted watch, sent as a chunked stream of JSON watch
  events, one per line and one chunk each, as the API server does. An event is `(type, object)`; the stream
  ends after the last event, like a watch whose `timeoutSeconds` ran out. An exhausted script answers with
  an empty stream. `gone_event()` makes the ERROR event an expired resourceVersion produces.

Every request is recorded (path and query) so tests can check which resourceVersion the client resumed from.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

__all__ = ["MockApiServer", "gone_event", "gpu_pod"]

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
        if not (url.path == "/api/v1/pods" or (url.path.startswith("/api/v1/namespaces/")
                                                and url.path.endswith("/pods"))):
            self._send_json(404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": url.path})
            return
        if query.get("watch") in {"1", "true", "True"}:
            self._stream(self.server.next_watch())
        else:
            self._send_json(200, self.server.next_list())

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

    def __enter__(self) -> MockApiServer:
        self._thread = threading.Thread(target=self.serve_forever, name="mock-apiserver", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
