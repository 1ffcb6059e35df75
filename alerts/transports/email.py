"""Email through Django's mail framework (settings EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER/PASSWORD,
EMAIL_USE_TLS, DEFAULT_FROM_EMAIL).

Config: {"to": ["oncall@example.com", …]}. One message per notification with a plain-text and an HTML
part. SMTP 5xx answers (unknown recipient, relay denied, bad credentials) are permanent; 4xx answers,
refused connections and timeouts are retried.
"""

from __future__ import annotations

import smtplib

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.utils.html import format_html, format_html_join

from alerts.transports import render
from alerts.transports.base import DeliveryResult, Outbound, Transport, TransportError, clip, register

SUBJECT_MAX = 200
STATE_COLOUR = {"firing": "#d64545", "acknowledged": "#e0a100", "resolved": "#2e9d5b"}


def recipients(notification) -> list[str]:
    """The channel's recipients; none, or a malformed list, is a permanent configuration error."""
    to = Transport.config(notification, "to")
    if isinstance(to, str):
        to = [to]
    if not isinstance(to, list) or not to or not all(isinstance(a, str) and "@" in a for a in to):
        raise TransportError("email channel needs config {\"to\": [addresses]}", permanent=True)
    return to


def text_body(notification) -> str:
    """The plain-text part: headline, summary, one line per alert, the console link."""
    payload = notification.payload or {}
    lines = [render.headline(notification), ""]
    if payload.get("summary"):
        lines += [str(payload["summary"]), ""]
    lines += [f"- {render.alert_line(a)}" for a in render.alerts_of(payload)]
    if payload.get("url"):
        lines += ["", f"Open in Breakwater: {payload['url']}"]
    return "\n".join(lines) + "\n"


def _html_row(alert: dict) -> tuple:
    """The values of one alert's table row (escaped by format_html_join)."""
    state = alert.get("state") or "firing"
    what = " — ".join(p for p in (render.entity_of(alert), render.summary_of(alert)) if p)
    return STATE_COLOUR.get(state, "#6b7280"), state, alert.get("severity") or "", alert.get("name") or "alert", what


def html_body(notification) -> str:
    """The HTML part; every value is escaped (labels and annotations come from outside)."""
    payload = notification.payload or {}
    rows = format_html_join("", '<tr><td style="color:{}">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
                            (_html_row(a) for a in render.alerts_of(payload)))
    link = format_html('<p><a href="{}">Open in Breakwater</a></p>', payload["url"]) if payload.get("url") else ""
    return format_html(
        '<html><body style="font-family:sans-serif"><h2>{}</h2><p>{}</p>'
        '<table cellpadding="4"><tr><th>State</th><th>Severity</th><th>Alert</th><th>Entity</th></tr>{}</table>'
        "{}</body></html>",
        render.headline(notification), payload.get("summary") or "", rows, link)


@register
class EmailTransport(Transport):
    """Send the notification by SMTP to the channel's recipients."""

    kind = "email"
    label = "Email"

    def prepare(self, notification) -> Outbound:
        """The two-part message to the channel's recipients; the stored copy has no credentials."""
        to = recipients(notification)
        subject = clip(render.headline(notification), SUBJECT_MAX)
        message = EmailMultiAlternatives(subject=subject, body=text_body(notification),
                                         from_email=settings.DEFAULT_FROM_EMAIL, to=to,
                                         headers={"X-Breakwater-Delivery": str(notification.id)})
        message.attach_alternative(html_body(notification), "text/html")
        record = {"smtp": f"{settings.EMAIL_HOST}:{settings.EMAIL_PORT}", "from": settings.DEFAULT_FROM_EMAIL,
                  "to": to, "subject": subject, "body": message.body}
        return Outbound(message, record)

    def _send(self, outbound: Outbound) -> DeliveryResult:
        """Send over SMTP; 5xx answers are permanent, 4xx and connection errors retryable."""
        message: EmailMultiAlternatives = outbound.request
        try:
            with get_connection(timeout=settings.ALERT_HTTP_TIMEOUT_SECONDS) as connection:
                message.connection = connection
                message.send()
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            answer = "; ".join(f"{a}: {c} {m.decode(errors='replace') if isinstance(m, bytes) else m}"
                               for a, (c, m) in exc.recipients.items())
            raise TransportError(f"SMTP server refused every recipient: {answer}", permanent=min(codes) >= 500,
                                 status_code=max(codes), response=answer) from None
        except smtplib.SMTPResponseException as exc:
            answer = exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) else exc.smtp_error
            raise TransportError(f"SMTP server answered {exc.smtp_code}: {answer}",
                                 permanent=exc.smtp_code >= 500, status_code=exc.smtp_code,
                                 response=str(answer)) from None
        except (smtplib.SMTPException, OSError) as exc:
            raise TransportError(f"cannot send email via {settings.EMAIL_HOST}:{settings.EMAIL_PORT}: {exc}") from None
        return DeliveryResult(outcome="ok", status_code=250, response="accepted")
