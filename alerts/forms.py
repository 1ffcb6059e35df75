"""Forms of the alerting pages: rules, silences, the history and audit searches, remediation decisions, channels.

Text inputs that stand for lists and maps ("48, 79", "team=ml, site=a", "alertname=GpuHot, node=~gpu-0.*")
are parsed here, with errors that name the piece at fault; the actions validate the rest.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from django import forms
from django.core.exceptions import ValidationError

from alerts import urlguard
from alerts.matching import check_regexes
from alerts.models import (
    MATCH_OPS,
    AlertState,
    Channel,
    EntityKind,
    Op,
    RuleKind,
    Severity,
    SilenceKind,
)

LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
# One matcher of the text form: name, operator, then a bare value up to the next comma or a quoted one.
MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|[^,]*?)\s*(?:,|$)')
DURATION = re.compile(r"(\d+)\s*([smhdw])")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MATCHER_ROWS = 4

# Which rule fields each kind uses; the form hides the others (data-kinds) and ignores them.
KIND_FIELDS = {
    "metric": (RuleKind.THRESHOLD, RuleKind.RATE, RuleKind.JOB),
    "op": (RuleKind.THRESHOLD, RuleKind.RATE, RuleKind.ANOMALY, RuleKind.RISK),
    "threshold": (RuleKind.THRESHOLD, RuleKind.RATE, RuleKind.ANOMALY, RuleKind.RISK, RuleKind.NODE_DOWN),
    "window_seconds": (RuleKind.RATE, RuleKind.XID),
    "xid_codes": (RuleKind.XID,),
    "xid_actions": (RuleKind.XID,),
}


def parse_list(text: str, *, ints: bool = False) -> list:
    """"48, 79" -> [48, 79]; "drain_node, rma" -> ["drain_node", "rma"]."""
    items = [x.strip() for x in text.replace(";", ",").split(",") if x.strip()]
    if not ints:
        return items
    bad = [x for x in items if not x.isdigit()]
    if bad:
        raise ValidationError(f"{bad[0]!r} is not a number; write XID codes like 48, 79")
    return [int(x) for x in items]


def parse_labels(text: str) -> dict[str, str]:
    """"team=ml, site=a" -> {"team": "ml", "site": "a"}."""
    labels: dict[str, str] = {}
    for i, part in enumerate(p.strip() for p in text.split(",")):
        if not part:
            continue
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or not LABEL_NAME.match(name):
            raise ValidationError(f"label {i + 1} ({part!r}): write name=value, the name in letters, digits and _")
        labels[name] = value.strip()
    return labels


def parse_matchers(text: str) -> list[dict]:
    """`name=value, name!=value, name=~regex, name!~regex` (Alertmanager's syntax; quote values with commas)."""
    text = text.strip().removeprefix("{").removesuffix("}").strip()
    matchers, pos, n = [], 0, 0
    while pos < len(text):
        n += 1
        m = MATCHER.match(text, pos)
        if not m or m.end() == pos:
            piece = text[pos:].split(",")[0].strip()
            raise ValidationError(f"matcher {n} ({piece!r}): write name=value, name!=value, name=~regex or "
                                  f"name!~regex; the name in letters, digits and _")
        name, op, value = m.group(1), m.group(2), m.group(3)
        if value.startswith('"') and value.endswith('"') and len(value) >= 2:
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        matchers.append({"name": name, "op": op, "value": value})
        pos = m.end()
    return matchers


def parse_duration(text: str) -> timedelta:
    """"2h", "1d 12h", "90m" -> a timedelta."""
    text = text.strip().lower()
    parts = DURATION.findall(text)
    if not parts or DURATION.sub("", text).strip():
        raise ValidationError(f"{text!r}: write a duration like 30m, 2h or 1d 12h")
    return timedelta(seconds=sum(int(n) * DURATION_UNITS[u] for n, u in parts))


def as_utc(moment: datetime | None) -> datetime | None:
    """The pages show UTC, so a time typed without a zone is UTC."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _input(**attrs) -> forms.TextInput:
    return forms.TextInput(attrs=attrs)


class RuleForm(forms.Form):
    """An alert rule; the list and map fields are typed as text."""

    name = forms.CharField(max_length=100, help_text="Becomes the alert's alertname label, e.g. GpuOverheating")
    kind = forms.ChoiceField(choices=RuleKind.choices)
    entity = forms.ChoiceField(choices=EntityKind.choices, initial=EntityKind.GPU)
    metric = forms.CharField(max_length=64, required=False,
                             help_text="A telemetry field (gpu_temp, memory_temp); straggler or divergence for jobs")
    op = forms.ChoiceField(choices=Op.choices, initial=Op.GT, label="Comparison")
    threshold = forms.FloatField(required=False)
    for_seconds = forms.IntegerField(min_value=0, initial=0, label="For (seconds)",
                                     help_text="The condition must hold this long before the alert fires")
    window_seconds = forms.IntegerField(min_value=1, initial=300, label="Window (seconds)",
                                        help_text="Rate window for counters; look-back for XID events")
    xid_codes = forms.CharField(required=False, label="XID codes", widget=_input(placeholder="48, 79"))
    xid_actions = forms.CharField(required=False, label="XID action classes",
                                  widget=_input(placeholder="drain_node, reset_gpu, rma"))
    severity = forms.ChoiceField(choices=Severity.choices, initial=Severity.WARNING)
    labels = forms.CharField(required=False, widget=_input(placeholder="team=ml, site=ams"),
                             help_text="Added to every alert the rule raises")
    summary = forms.CharField(max_length=300, required=False,
                              widget=_input(placeholder="GPU at {value:.0f} °C on {entity}"),
                              help_text="Placeholders: {entity}, {value}, {threshold}")
    enabled = forms.BooleanField(required=False, initial=True)

    def clean_xid_codes(self) -> list[int]:
        return parse_list(self.cleaned_data["xid_codes"], ints=True)

    def clean_xid_actions(self) -> list[str]:
        return parse_list(self.cleaned_data["xid_actions"])

    def clean_labels(self) -> dict[str, str]:
        return parse_labels(self.cleaned_data["labels"])

    @classmethod
    def initial_from(cls, rule: dict) -> dict:
        """A selector's rule row as the form's initial text values."""
        return {**rule, "xid_codes": ", ".join(str(c) for c in rule["xid_codes"]),
                "xid_actions": ", ".join(rule["xid_actions"]),
                "labels": ", ".join(f"{k}={v}" for k, v in rule["labels"].items())}

    # The kinds that use a field, space-separated, for the template's data-kinds.
    field_kinds = {name: " ".join(kinds) for name, kinds in KIND_FIELDS.items()}


class SilenceForm(forms.Form):
    """A silence or maintenance window: matchers as rows and/or text, a start, an end (or duration), a comment."""

    kind = forms.ChoiceField(choices=SilenceKind.choices, initial=SilenceKind.SILENCE)
    matchers_text = forms.CharField(required=False, label="Matchers",
                                    widget=_input(placeholder='alertname=GpuOverheating, node=~"gpu-00(1|2)"'),
                                    help_text="name=value, name!=value, name=~regex, name!~regex; comma-separated")
    starts_at = forms.DateTimeField(required=False, label="Starts (UTC)", help_text="Empty: now",
                                    widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    ends_at = forms.DateTimeField(required=False, label="Ends (UTC)",
                                  widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    duration = forms.CharField(required=False, initial="2h", widget=_input(placeholder="2h"),
                               help_text="Used when no end is given: 30m, 2h, 1d")
    comment = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), help_text="Why; shown to everyone")

    def __init__(self, *args, now: datetime, **kwargs):
        super().__init__(*args, **kwargs)
        self.now = now
        for i in range(MATCHER_ROWS):
            self.fields[f"m{i}_name"] = forms.CharField(required=False, label="Label")
            self.fields[f"m{i}_op"] = forms.ChoiceField(choices=[(o, o) for o in MATCH_OPS], initial="=",
                                                        label="Operator")
            self.fields[f"m{i}_value"] = forms.CharField(required=False, label="Value")

    def matcher_rows(self) -> list[tuple]:
        """(name, op, value) bound fields per row, for the template."""
        return [(self[f"m{i}_name"], self[f"m{i}_op"], self[f"m{i}_value"]) for i in range(MATCHER_ROWS)]

    def clean_matchers_text(self) -> list[dict]:
        return parse_matchers(self.cleaned_data["matchers_text"])

    def clean_duration(self) -> timedelta | None:
        text = self.cleaned_data["duration"].strip()
        return parse_duration(text) if text else None

    def _row_matchers(self) -> list[dict]:
        rows = []
        for i in range(MATCHER_ROWS):
            name, value = self.cleaned_data.get(f"m{i}_name", "").strip(), self.cleaned_data.get(f"m{i}_value", "")
            if not name and not value:
                continue
            if not LABEL_NAME.match(name):
                self.add_error(f"m{i}_name", f"matcher row {i + 1}: a label name (letters, digits and _)")
                continue
            rows.append({"name": name, "op": self.cleaned_data.get(f"m{i}_op") or "=", "value": value})
        return rows

    def clean(self) -> dict:
        data = super().clean()
        matchers = self._row_matchers() + (data.get("matchers_text") or [])
        if "matchers_text" not in self.errors:
            if not matchers:
                self.add_error("matchers_text", "give at least one matcher (a silence of everything is refused)")
            elif bad := check_regexes(matchers):
                self.add_error("matchers_text", bad)
        starts = as_utc(data.get("starts_at")) or self.now
        ends = as_utc(data.get("ends_at"))
        if ends is None and data.get("duration"):
            ends = starts + data["duration"]
        if ends is None and "duration" not in self.errors:
            self.add_error("ends_at", "give an end or a duration")
        elif ends is not None and ends <= starts:
            self.add_error("ends_at", "must be after the start")
        data.update(matchers=matchers, starts_at=starts, ends_at=ends)
        return data


class _TimeRangeForm(forms.Form):
    """A search over a time range: From and Until, read as UTC."""

    since = forms.DateTimeField(required=False, label="From (UTC)",
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = forms.DateTimeField(required=False, label="Until (UTC)",
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))

    def clean(self) -> dict:
        data = super().clean()
        data["since"], data["until"] = as_utc(data.get("since")), as_utc(data.get("until"))
        return data


class HistoryForm(_TimeRangeForm):
    """The alert history search."""

    q = forms.CharField(required=False, max_length=100, label="Name or label text")
    state = forms.ChoiceField(required=False, choices=[("", "Any state"), *AlertState.choices])
    severity = forms.ChoiceField(required=False, choices=[("", "Any severity"), *Severity.choices])
    field_order = ["q", "state", "severity", "since", "until"]

    def clean(self) -> dict:
        data = super().clean()
        if data["since"] and data["until"] and data["until"] < data["since"]:
            self.add_error("until", "must not be before From")
        return data


class AuditForm(_TimeRangeForm):
    """The audit log search."""

    actor = forms.CharField(required=False, max_length=150)
    verb = forms.CharField(required=False, max_length=40, widget=_input(placeholder="rule., action.approve"))
    object_kind = forms.CharField(required=False, max_length=40, label="Object kind",
                                  widget=_input(placeholder="rule, alert, silence, action"))
    object_id = forms.CharField(required=False, max_length=200, label="Object id")
    field_order = ["actor", "verb", "object_kind", "object_id", "since", "until"]


class RejectForm(forms.Form):
    """Rejecting a remediation action needs a reason (it goes to the audit log)."""

    reason = forms.CharField(max_length=500)


class DrainForm(forms.Form):
    """Ask for a node to be drained, by hand; it waits for an approval like any other action."""

    hostname = forms.CharField(max_length=253)
    reason = forms.CharField(max_length=500)


class ChannelForm(forms.ModelForm):
    """A notification channel (the admin's form): its URL must pass the outbound URL guard (alerts.urlguard)."""

    class Meta:
        model = Channel
        fields = "__all__"

    def clean(self) -> dict:
        data = super().clean()
        try:
            urlguard.validate_channel(data.get("kind", ""), data.get("config"), field="config")
        except ValidationError as exc:
            self.add_error("config", exc.message_dict["config"])
        return data
