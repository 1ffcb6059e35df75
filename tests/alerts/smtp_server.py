"""A minimal real SMTP server for the email transport's tests (stdlib only, threaded).

It speaks enough of RFC 5321 for smtplib/Django: EHLO/HELO, MAIL, RCPT, DATA (with dot-unstuffing),
RSET, NOOP, QUIT. Accepted messages are parsed and kept in `messages`. `refuse_rcpt` maps an address to
the (code, text) to refuse it with; `data_reply` overrides the answer to the end of DATA (e.g. 451).
"""

from __future__ import annotations

import email
import email.policy
import socketserver
import threading
from dataclasses import dataclass, field
from email.message import EmailMessage


@dataclass
class Received:
    """One accepted message: the envelope and the parsed content."""

    mail_from: str
    rcpt_to: list[str]
    data: bytes

    @property
    def message(self) -> EmailMessage:
        return email.message_from_bytes(self.data, policy=email.policy.default)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def reply(self, code: int, text: str = "OK", *, more: list[str] = ()) -> None:
        lines = [f"{code}-{m}" for m in more] + [f"{code} {text}"]
        self.wfile.write(("\r\n".join(lines) + "\r\n").encode())

    def handle(self) -> None:
        self.mail_from, self.rcpt_to = "", []
        self.reply(220, "localhost test SMTP ready")
        while line := self.rfile.readline():
            verb, _, arg = line.decode(errors="replace").rstrip("\r\n").partition(" ")
            if not self.dispatch(verb.upper(), arg):
                return

    def dispatch(self, verb: str, arg: str) -> bool:
        if verb == "EHLO":
            self.reply(250, "SIZE 10485760", more=["localhost", "8BITMIME"])
        elif verb in ("HELO", "NOOP"):
            self.reply(250)
        elif verb == "MAIL":
            self.mail_from, self.rcpt_to = _address(arg), []
            self.reply(250)
        elif verb == "RCPT":
            self.rcpt(_address(arg))
        elif verb == "DATA":
            self.data()
        elif verb == "RSET":
            self.mail_from, self.rcpt_to = "", []
            self.reply(250)
        elif verb == "QUIT":
            self.reply(221, "bye")
            return False
        else:
            self.reply(502, "command not implemented")
        return True

    def rcpt(self, address: str) -> None:
        refused = self.server.owner.refuse_rcpt.get(address)
        if refused:
            self.reply(*refused)
            return
        self.rcpt_to.append(address)
        self.reply(250)

    def data(self) -> None:
        if not self.rcpt_to:
            self.reply(503, "need RCPT first")
            return
        self.reply(354, "end with <CRLF>.<CRLF>")
        lines = []
        while (line := self.rfile.readline()) not in (b".\r\n", b".\n", b""):
            lines.append(line[1:] if line.startswith(b"..") else line)
        owner = self.server.owner
        if owner.data_reply:
            self.reply(*owner.data_reply)
            return
        owner.record(Received(self.mail_from, list(self.rcpt_to), b"".join(lines)))
        self.reply(250, "queued")


def _address(arg: str) -> str:
    """'FROM:<a@b> SIZE=1' -> 'a@b'."""
    value = arg.partition(":")[2].strip()
    return value.split(">", 1)[0].lstrip("<") if value.startswith("<") else value.split(" ", 1)[0]


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: SmtpServer


@dataclass
class SmtpServer:
    """The server on a free loopback port; use as a context manager."""

    host: str = "127.0.0.1"
    refuse_rcpt: dict[str, tuple[int, str]] = field(default_factory=dict)
    data_reply: tuple[int, str] | None = None
    messages: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = _Server((self.host, 0), _Handler)
        self._server.owner = self
        self.port = self._server.server_address[1]

    def record(self, received: Received) -> None:
        with self._lock:
            self.messages.append(received)

    def __enter__(self) -> SmtpServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
