"""Kubernetes integration: GPU pods become jobs and allocation-ledger rows, Node objects become inventory.

`pods` is the pure mapping (no Django), `watch` the list+watch loop on the official client, `actions` the
writes. `manage.py watch_kubernetes` runs the watcher.
"""
