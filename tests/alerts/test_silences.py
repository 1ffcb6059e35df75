"""Silences, maintenance windows and inhibit rules: validation, audit, muting on creation, unmuting on expiry
(by hand or by the clock) and what the flush then sends."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from alerts.models import AlertEvent, AlertState, Silence
from alerts.muting import active_silences
from alerts.silences import do_create_silence, do_expire_silence, do_upsert_inhibit_rule
from core.models import AuditEntry
from tests.alerts.test_routing import alert_ids, flush, make_alert, make_channel, make_route, secs, set_state
from tests.conftest import FIXED_NOW

NOW = FIXED_NOW
pytestmark = pytest.mark.django_db

NODES_1_2 = [{"name": "node", "op": "=~", "value": "node-0[12]"}]


@pytest.fixture
def tree():
    page = make_channel("page")
    return make_route("root", channels=[page], group_by=["alertname", "node"], group_wait_s=0, group_interval_s=60)


@pytest.fixture
def three(tree):
    return [make_alert("Hot", node=f"node-0{i}") for i in (1, 2, 3)]


def silence(matchers=NODES_1_2, start=NOW, end=None, **kw) -> Silence:
    kw.setdefault("author", "ops")
    kw.setdefault("comment", "rack 7 recabling")
    return do_create_silence(matchers, start, end or secs(3600), now=kw.pop("now", NOW), **kw)


def test_regex_silence_mutes_matching_alerts_only_and_is_audited(three):
    s = silence()
    one, two, other = (a.__class__.objects.get(pk=a.pk) for a in three)
    assert one.silenced_by == s and two.silenced_by == s and other.silenced_by is None
    assert AlertEvent.objects.filter(kind="silenced", alert__in=[one, two]).count() == 2
    assert [alert_ids(n) for n in flush(NOW)] == [{other.pk}]  # groups of only muted alerts send nothing
    entry = AuditEntry.objects.get(verb="silence.create")
    assert entry.object_id == str(s.pk) and entry.actor == "ops" and entry.reason == "rack 7 recabling"
    assert entry.detail["matchers"] == NODES_1_2


def test_silence_made_after_notification_holds_back_the_repeat(three):
    assert len(flush(NOW)) == 3
    silence(matchers=[{"name": "node", "op": "=", "value": "node-01"}], end=secs(7200), now=secs(10))
    assert {frozenset(alert_ids(n)) for n in flush(secs(3600))} == {
        frozenset({three[1].pk}), frozenset({three[2].pk})}  # only the unmuted alerts repeat


def test_expiring_silence_unmutes_and_notifies_alerts_still_firing(three):
    s = silence()
    flush(NOW)
    set_state(three[1], AlertState.RESOLVED, secs(100))  # resolved while muted: stays quiet
    expired = do_expire_silence(s.pk, None, now=secs(200))

    assert expired.expired_at == secs(200) and s not in active_silences(secs(200))
    one = three[0].__class__.objects.get(pk=three[0].pk)
    assert one.silenced_by is None and AlertEvent.objects.filter(alert=one, kind="unmuted").count() == 1
    notes = flush(secs(200))
    assert [(n.event, alert_ids(n)) for n in notes] == [("trigger", {one.pk})]
    assert AuditEntry.objects.filter(verb="silence.expire", object_id=str(s.pk)).count() == 1
    do_expire_silence(s.pk, None, now=secs(300))  # already over: nothing happens twice
    assert AuditEntry.objects.filter(verb="silence.expire").count() == 1


def test_silence_ending_by_the_clock_unmutes_at_the_next_flush(three):
    silence(end=secs(600))
    flush(NOW)
    assert flush(secs(599)) == []
    notes = flush(secs(600))
    assert {frozenset(alert_ids(n)) for n in notes} == {frozenset({three[0].pk}), frozenset({three[1].pk})}
    assert AlertEvent.objects.filter(kind="unmuted").count() == 2


def test_future_silence_mutes_when_it_starts(tree):
    s = silence(start=secs(100), end=secs(600))
    a = make_alert("Hot", node="node-01")
    assert a.__class__.objects.get(pk=a.pk).silenced_by is None  # not started yet
    assert len(flush(NOW)) == 1
    flush(secs(100))
    a.refresh_from_db()
    assert a.silenced_by == s
    b = make_alert("Hot", node="node-02", at=secs(200))
    b.refresh_from_db()
    assert b.silenced_by == s
    assert flush(secs(260)) == []


def test_maintenance_window_mutes_like_a_silence(three):
    window = silence(matchers=[{"name": "node", "op": "=", "value": "node-03"}], kind="maintenance")
    three[2].refresh_from_db()
    assert window.kind == "maintenance" and three[2].silenced_by == window
    assert "maintenance" in AlertEvent.objects.get(alert=three[2], kind="silenced").note
    assert {frozenset(alert_ids(n)) for n in flush(NOW)} == {frozenset({three[0].pk}), frozenset({three[1].pk})}


def test_negative_matchers_mute_everything_else(three):
    silence(matchers=[{"name": "node", "op": "!~", "value": "node-0[12]"}, {"name": "alertname", "op": "=",
                                                                             "value": "Hot"}])
    assert [alert_ids(n) for n in flush(NOW)] == [{three[0].pk}, {three[1].pk}]


def test_start_in_the_past_begins_now_and_positional_comment_and_user_are_accepted(tree):
    user = get_user_model().objects.create_user("alice")
    s = do_create_silence(NODES_1_2, secs(-600), secs(600), "disk swap", user, kind="maintenance", now=NOW)
    assert s.starts_at == NOW and s.author == "alice" and s.created_by == user and s.comment == "disk swap"
    assert AuditEntry.objects.get(verb="silence.create").actor == "alice"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"matchers": []}, "matchers"),
    ({"matchers": [{"name": "node", "op": "==", "value": "x"}]}, "matchers"),
    ({"matchers": [{"name": "node", "op": "=~", "value": "node-(["}]}, "matchers"),
    ({"matchers": [{"name": "node", "op": "=~", "value": ".*"}]}, "matchers"),  # would mute everything
    ({"matchers": "node=x"}, "matchers"),
    ({"start": secs(100), "end": secs(50)}, "ends_at"),
    ({"start": secs(-7200), "end": secs(-60)}, "ends_at"),
    ({"comment": "  "}, "comment"),
    ({"kind": "holiday"}, "kind"),
])
def test_invalid_silence_is_refused_naming_the_field(tree, kwargs, field):
    with pytest.raises(ValidationError) as err:
        silence(**kwargs)
    assert field in err.value.message_dict
    assert not Silence.objects.exists() and not AuditEntry.objects.exists()


def test_inhibit_rule_upsert_validates_audits_and_releases_alerts_when_disabled(tree):
    spec = {"source_matchers": [{"name": "alertname", "op": "=", "value": "NodeDown"}],
            "target_matchers": [{"name": "alertname", "op": "=~", "value": "Xid.*"}], "equal": ["node"]}
    with pytest.raises(ValidationError) as err:
        do_upsert_inhibit_rule("r", **{**spec, "target_matchers": [{"name": "a", "op": "=~", "value": "("}]})
    assert "target_matchers" in err.value.message_dict
    do_upsert_inhibit_rule("r", **spec, now=NOW)
    down = make_alert("NodeDown", severity="critical", node="n1")
    xid = make_alert("XidGpuReset", node="n1", gpu="GPU-1")
    xid.refresh_from_db()
    assert xid.inhibited_by == down

    rule = do_upsert_inhibit_rule("r", **spec, enabled=False, now=secs(10))
    xid.refresh_from_db()
    assert not rule.enabled and xid.inhibited_by is None
    assert [e.verb for e in AuditEntry.objects.order_by("id")] == ["inhibit_rule.create", "inhibit_rule.update"]
    assert {frozenset(alert_ids(n)) for n in flush(secs(10))} == {frozenset({down.pk}), frozenset({xid.pk})}
