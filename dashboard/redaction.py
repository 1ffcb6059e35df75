"""Passwords inside URLs never reach an error report or a log line.

Django's SafeExceptionReporterFilter hides settings by NAME (KEY, SECRET, PASS, TOKEN...), so a URL that
carries user:password@ under another name (the Celery broker, the channel layer's Redis hosts, a cache
LOCATION) is printed as it is. Here the VALUE is cleansed too: `scheme://user:pass@host` becomes
`scheme://user:********@host` wherever it occurs, in settings (nested dicts and lists included), in a
frame's local variables, in the final text of a report and in every formatted log line.

Kept apart from dashboard.security on purpose: LOGGING names the formatter below, and Django configures
logging before the app registry is ready, so this module imports nothing that needs models.
"""

from __future__ import annotations

import logging
import re

from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

MASK = "********"

# scheme://[user]:PASSWORD@ — the password runs to the last "@" of the token (an unencoded "@" or "/" in a
# password must not leave its tail visible); a token ends at whitespace, a quote or an angle bracket, which
# is how URLs sit inside reprs, HTML and log lines.
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:/?#@\s'\"<>]*:)[^\s'\"<>]+(?=@)", re.IGNORECASE)


def mask_url_passwords(value):
    """`value` with the password of every URL in it masked; dicts, lists and tuples are cleansed inside.

    Anything else (numbers, callables, objects) is returned unchanged.
    """
    if isinstance(value, str):
        return _URL_PASSWORD.sub(lambda m: m["head"] + MASK, value) if "://" in value else value
    if isinstance(value, dict):
        return {k: mask_url_passwords(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [mask_url_passwords(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


class UrlPasswordFilter(SafeExceptionReporterFilter):
    """settings.DEFAULT_EXCEPTION_REPORTER_FILTER: Django's name-based masking, plus URL passwords in values."""

    def cleanse_setting(self, key, value):
        # Django recurses into dicts, lists and tuples through this same method, so every leaf passes here.
        cleansed = super().cleanse_setting(key, value)
        return mask_url_passwords(cleansed) if isinstance(cleansed, str) else cleansed

    def get_traceback_frame_variables(self, request, tb_frame):
        return [(name, mask_url_passwords(value))
                for name, value in super().get_traceback_frame_variables(request, tb_frame)]


class UrlPasswordReporter(ExceptionReporter):
    """settings.DEFAULT_EXCEPTION_REPORTER: the report's final text is cleansed as well, because the exception's
    own message (a driver naming the URL it failed to reach, say) is not something the filter sees."""

    def get_traceback_html(self):
        return mask_url_passwords(str(super().get_traceback_html()))

    def get_traceback_text(self):
        return mask_url_passwords(str(super().get_traceback_text()))


class RedactingFormatter(logging.Formatter):
    """The project's log formatter: a formatted line (its traceback included) never shows a URL's password."""

    def format(self, record):
        return mask_url_passwords(super().format(record))
