"""`python -m telemetry.agent --server URL --token T`: the node agent (no Django, no database)."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from pathlib import Path

from telemetry.agent.commands import CommandChannel
from telemetry.agent.pusher import Pusher
from telemetry.agent.redfish import RedfishClient
from telemetry.agent.runner import discover, run


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m telemetry.agent", description=__doc__)
    ap.add_argument("--server", required=True, help="Breakwater base URL, e.g. https://breakwater.example:8000")
    token = ap.add_mutually_exclusive_group(required=True)
    token.add_argument("--token", help="collector token (prefer --token-file)")
    token.add_argument("--token-file", type=Path)
    ap.add_argument("--host", default=socket.gethostname(), help="this node's name (default: hostname)")
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--spool", type=Path, default=Path("/var/spool/breakwater-agent"))
    ap.add_argument("--max-spool-mb", type=int, default=256)
    ap.add_argument("--infiniband", type=Path, default=Path("/sys/class/infiniband"))
    ap.add_argument("--kmsg", default="/dev/kmsg", help="kernel log to watch for NVRM Xid lines ('' to disable)")
    ap.add_argument("--redfish", help="BMC base URL, e.g. https://10.0.0.5")
    ap.add_argument("--redfish-user")
    ap.add_argument("--redfish-password-file", type=Path)
    ap.add_argument("--accept-commands", action="store_true",
                    help="run remediation commands (power cap, GPU reset) the server queues for this node")
    ap.add_argument("--once", action="store_true", help="collect and push one batch, then exit")
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    token = args.token or args.token_file.read_text().strip()
    bmc = None
    if args.redfish:
        password = args.redfish_password_file.read_text().strip() if args.redfish_password_file else None
        bmc = RedfishClient(args.redfish, username=args.redfish_user, password=password)
    src = discover(args.host, ib_root=args.infiniband, kmsg_path=args.kmsg or None, redfish_client=bmc)
    for source, why in src.problems.items():
        logging.getLogger("telemetry.agent").warning("%s unavailable: %s", source, why)
    pusher = Pusher(args.server, token, args.spool, max_spool_bytes=args.max_spool_mb * 1024 * 1024)
    commands = CommandChannel(args.server, token, args.host) if args.accept_commands else None
    run(src, pusher, interval=args.interval, ticks=1 if args.once else None, commands=commands)
    return 0


if __name__ == "__main__":
    sys.exit(main())
