"""Follow GPU pods on a Kubernetes API server with the official client: list, then watch from the list's
resourceVersion, and hand every GPU pod to a sink (`do_sync_k8s_pods` by default).

The loop, as the API server's watch contract requires:

1. List all pods (one request, `_preload_content=False` so the pods stay the plain JSON the mapping reads);
   keep the GPU pods and sync them as a complete list, which also closes jobs deleted while nobody watched.
2. Watch from the list's resourceVersion. ADDED/MODIFIED events sync the pod; DELETED syncs it as gone;
   BOOKMARK events only advance the resourceVersion.
3. A watch request ends after `watch_timeout_s` (the server closes it): watch again from the last
   resourceVersion seen.
4. 410 Gone (as an ERROR event or an HTTP status) means that resourceVersion is too old for the server's
   history: go back to 1. Any other failure backs off (up to `MAX_BACKOFF_S`) and re-lists too, since
   events may have been missed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from telemetry.k8s.pods import is_gpu_pod

__all__ = ["PodWatcher", "Progress", "Sink", "WatchExpired", "make_core_api"]

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
GONE = 410


class Sink(Protocol):
    """Where pods go: `do_sync_k8s_pods` or a test's recorder."""

    def __call__(self, pods: list[dict], now: datetime, *, gone: bool = False, complete: bool = False) -> Any: ...


@dataclass(frozen=True)
class Progress:
    """One step of the watcher, for a command's output: kind is list, event, expired, error or closed."""

    kind: str
    detail: str
    resource_version: str = ""
    result: Any = None


class WatchExpired(Exception):
    """The API server no longer has history from our resourceVersion (410 Gone): re-list."""


def make_core_api(configuration: client.Configuration) -> client.CoreV1Api:
    """A CoreV1Api on its own ApiClient, so two watchers never share a connection pool or settings."""
    return client.CoreV1Api(client.ApiClient(configuration))


def _default_sink(pods: list[dict], now: datetime, *, gone: bool = False, complete: bool = False) -> Any:
    from telemetry.k8s.actions import do_sync_k8s_pods  # Django is only needed when the default sink runs

    return do_sync_k8s_pods(pods, now, gone=gone, complete=complete)


class PodWatcher:
    """List+watch of GPU pods in one namespace or all of them; see the module docstring for the loop."""

    def __init__(self, core: client.CoreV1Api, *, sink: Sink | None = None, namespace: str | None = None,
                 watch_timeout_s: int = 300, on_progress: Callable[[Progress], None] | None = None,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.core = core
        self.sink = sink or _default_sink
        self.namespace = namespace
        self.watch_timeout_s = watch_timeout_s
        self.on_progress = on_progress or (lambda p: None)
        self.clock = clock or (lambda: datetime.now(UTC))
        self.stop_event = threading.Event()
        self._watch: watch.Watch | None = None

    def stop(self) -> None:
        """Ask `run` to return; safe from another thread or a signal handler."""
        self.stop_event.set()
        if self._watch is not None:
            self._watch.stop()

    def _list_call(self) -> Callable[..., Any]:
        if self.namespace:
            return lambda **kw: self.core.list_namespaced_pod(self.namespace, **kw)
        return self.core.list_pod_for_all_namespaces

    def list_pods(self) -> str:
        """Step 1: list, sync the GPU pods as a complete list, return the list's resourceVersion."""
        response = self._list_call()(_preload_content=False)
        body = json.loads(response.data)
        pods = [p for p in body.get("items") or [] if is_gpu_pod(p)]
        version = (body.get("metadata") or {}).get("resourceVersion", "")
        result = self.sink(pods, self.clock(), complete=True)
        self.on_progress(Progress("list", f"{len(pods)} GPU pods of {len(body.get('items') or [])}", version,
                                  result))
        return version

    def watch_once(self, resource_version: str) -> str:
        """Steps 2-3: one watch request from `resource_version`; returns the last resourceVersion seen.
        Raises WatchExpired on 410 Gone."""
        self._watch = watch.Watch()
        # timeout_seconds also turns off the client's own silent retry after a 410, which would resume from
        # a version it picked itself; we want to re-list instead.
        stream = self._watch.stream(self._list_call(), resource_version=resource_version,
                                    timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True)
        try:
            for event in stream:
                resource_version = self._handle(event, resource_version)
                if self.stop_event.is_set():
                    break
        except ApiException as exc:
            if exc.status == GONE:
                raise WatchExpired(str(exc.reason)) from exc
            raise
        finally:
            self._watch = None
        self.on_progress(Progress("closed", "watch request ended", resource_version))
        return resource_version

    def _handle(self, event: dict, resource_version: str) -> str:
        kind, pod = event["type"], event["raw_object"]
        version = (pod.get("metadata") or {}).get("resourceVersion") or resource_version
        if kind == "BOOKMARK" or not is_gpu_pod(pod):
            return version
        result = self.sink([pod], self.clock(), gone=kind == "DELETED")
        name = f"{pod['metadata'].get('namespace', '')}/{pod['metadata'].get('name', '')}"
        self.on_progress(Progress("event", f"{kind} {name}", version, result))
        return version

    def run(self, *, max_watches: int | None = None) -> None:
        """Loop until `stop()` (or after `max_watches` watch requests, for tests and one-shot runs)."""
        watches, backoff, version = 0, 1.0, None
        while not self.stop_event.is_set() and (max_watches is None or watches < max_watches):
            try:
                if version is None:
                    version = self.list_pods()
                watches += 1
                version = self.watch_once(version)
                backoff = 1.0
            except WatchExpired as exc:
                self.on_progress(Progress("expired", f"410 Gone ({exc}); re-listing", version or ""))
                version = None
            except Exception as exc:  # the API server restarting or unreachable must not end the watcher
                logger.warning("k8s watch failed; re-listing in %.0fs: %s", backoff, exc)
                self.on_progress(Progress("error", f"{type(exc).__name__}: {exc}; retry in {backoff:.0f}s"))
                version = None
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                if max_watches is not None:
                    watches += 1  # bounded runs count failures too, so they always end
