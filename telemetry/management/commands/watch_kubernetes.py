"""Follow GPU pods on a Kubernetes cluster into jobs and the allocation ledger, printing what each step did.

Credentials come from `--kubeconfig` (and `--context`) or, without it, from the service account the pod
runs under (in-cluster). Runs until interrupted; `--once` lists and syncs once, for a cron job or a check.
"""

from __future__ import annotations

import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections, connection

from telemetry.k8s.actions import do_sync_k8s_pods
from telemetry.k8s.watch import PodWatcher, Progress, make_core_api

SHOWN_COUNTS = ("created", "updated", "state_changes", "allocations_opened", "allocations_closed", "vanished")


def _load_configuration(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import client, config  # heavy (~0.5 s): loaded only by the command that talks to a cluster
    from kubernetes.config.config_exception import ConfigException  # with the client above

    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (ConfigException, OSError) as exc:
        where = kubeconfig or "the in-cluster service account (pass --kubeconfig outside a cluster)"
        raise CommandError(f"cannot load Kubernetes credentials from {where}: {exc}") from exc
    return configuration


def _sync(pods: list[dict], now, *, gone: bool = False, complete: bool = False):
    # The watcher lives for days: drop a database connection the server closed before using it again (never
    # inside a caller's transaction, such as a test's).
    if not connection.in_atomic_block:
        close_old_connections()
    return do_sync_k8s_pods(pods, now, gone=gone, complete=complete)


class Command(BaseCommand):
    help = "List and watch GPU pods on a Kubernetes cluster; record them as jobs and GPU allocations."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kubeconfig", help="Path to a kubeconfig file (default: in-cluster credentials)")
        parser.add_argument("--context", help="kubeconfig context to use (default: its current context)")
        parser.add_argument("--namespace", help="Watch one namespace only (default: all namespaces)")
        parser.add_argument("--watch-timeout", type=int, default=300,
                            help="Seconds each watch request stays open before it is renewed (default 300)")
        parser.add_argument("--once", action="store_true", help="List and sync once, then exit")

    def handle(self, *args, kubeconfig: str | None, context: str | None, namespace: str | None,
               watch_timeout: int, once: bool, **options) -> None:
        configuration = _load_configuration(kubeconfig, context)
        self.stdout.write(f"Kubernetes API at {configuration.host}, "
                          f"{'namespace ' + namespace if namespace else 'all namespaces'}")
        watcher = PodWatcher(make_core_api(configuration), sink=_sync, namespace=namespace,
                             watch_timeout_s=watch_timeout, on_progress=self._show)
        if once:
            watcher.list_pods()
            return
        signal.signal(signal.SIGTERM, lambda *_: watcher.stop())
        try:
            watcher.run()
        except KeyboardInterrupt:
            watcher.stop()
        self.stdout.write("stopped")

    def _show(self, progress: Progress) -> None:
        counts = progress.result or {}
        shown = ", ".join(f"{k.replace('_', ' ')} {counts[k]}" for k in SHOWN_COUNTS if counts.get(k))
        line = f"[{progress.kind}] {progress.detail}" + (f" (rv {progress.resource_version})"
                                                          if progress.resource_version else "")
        style = self.style.WARNING if progress.kind in {"error", "expired"} else (lambda s: s)
        self.stdout.write(style(line + (f": {shown}" if shown else "")))
