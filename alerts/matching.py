"""Label matchers and fingerprints, as Alertmanager defines them; shared by routing, silences and inhibition."""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache


@lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    # Alertmanager anchors regex matchers: "gpu-.*" must match the whole value.
    return re.compile(f"^(?:{pattern})$")


def match_one(labels: dict, matcher: dict) -> bool:
    """One matcher against a label set; a missing label is the empty string (Alertmanager's rule)."""
    value = str(labels.get(matcher["name"], ""))
    op = matcher.get("op", "=")
    if op == "=":
        return value == matcher["value"]
    if op == "!=":
        return value != matcher["value"]
    hit = _regex(matcher["value"]).match(value) is not None
    return hit if op == "=~" else not hit


def matches(labels: dict, matchers: list[dict]) -> bool:
    """All matchers hold (an empty list matches everything, like the root route)."""
    return all(match_one(labels, m) for m in matchers)


def fingerprint(labels: dict) -> str:
    """A stable 64-hex id of a label set: the same labels always give the same alert."""
    canon = json.dumps({str(k): str(v) for k, v in labels.items()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def check_regexes(matchers: list[dict]) -> str | None:
    """The first bad regex among matchers, as an error message, or None."""
    for i, m in enumerate(matchers):
        if m.get("op") in ("=~", "!~"):
            try:
                _regex(m["value"])
            except re.error as exc:
                return f"matcher {i} ({m['name']}): bad regex {m['value']!r}: {exc}"
    return None
