"""The model registry: versions, promotion only when no worse on the holdout, one-command rollback."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from sklearn.dummy import DummyClassifier

from anomaly.models import ModelStatus, ModelVersion
from anomaly.registry import (
    RegistryError,
    do_promote_version,
    do_register_version,
    do_rollback,
    load_active,
)
from tests.conftest import FIXED_NOW

pytestmark = pytest.mark.django_db


def _version(pr_auc: float, *, kind: str = "failure", constant: int = 0) -> ModelVersion:
    est = DummyClassifier(strategy="constant", constant=constant).fit([[0], [1]], [0, 1])
    return do_register_version(kind, est, params={"constant": constant}, features=["x"],
                               metrics={"primary": "pr_auc", "pr_auc": pr_auc}, now=FIXED_NOW)


def test_versions_are_numbered_per_kind_and_keep_their_artefact():
    a, b = _version(0.5), _version(0.6)
    c = _version(0.1, kind="cohort")
    assert (a.version, b.version, c.version) == (1, 2, 1)
    assert a.status == ModelStatus.CANDIDATE and len(a.artefact_sha256) == 64
    assert ModelVersion.objects.get(pk=b.pk).params == {"constant": 0}


def test_first_version_is_promoted_and_loaded():
    v = _version(0.5, constant=1)
    p = do_promote_version(v)
    assert p.promoted and "first version" in p.reason
    version, est = load_active("failure")
    assert version.pk == v.pk and est.predict([[0]]).tolist() == [1]


def test_a_worse_candidate_is_rejected_and_the_active_version_stays():
    good = _version(0.8)
    do_promote_version(good)
    worse = _version(0.7)
    p = do_promote_version(worse)
    assert not p.promoted and "worse than active v1" in p.reason
    worse.refresh_from_db()
    assert worse.status == ModelStatus.REJECTED
    assert load_active("failure")[0].pk == good.pk


def test_an_equal_or_better_candidate_replaces_the_active_one():
    first = _version(0.8)
    do_promote_version(first)
    assert do_promote_version(_version(0.8)).promoted  # "no worse" includes equal
    first.refresh_from_db()
    assert first.status == ModelStatus.RETIRED


def test_lower_is_better_metrics_compare_the_other_way():
    est = DummyClassifier().fit([[0], [1]], [0, 1])
    def reg(rate):
        return do_register_version("cohort", est, params={}, features=[], now=FIXED_NOW,
                                   metrics={"primary": "flag_rate", "flag_rate": rate, "higher_is_better": False})
    do_promote_version(reg(0.01))
    assert not do_promote_version(reg(0.02)).promoted
    assert do_promote_version(reg(0.005)).promoted


def test_force_promotes_a_worse_version_and_says_so():
    do_promote_version(_version(0.9))
    p = do_promote_version(_version(0.1), force=True)
    assert p.promoted and p.reason.startswith("forced over")


def test_rollback_restores_the_previous_version_and_the_command_does_it_in_one_step(capsys):
    v1, v2 = _version(0.5, constant=0), _version(0.6, constant=1)
    do_promote_version(v1)
    do_promote_version(v2)
    assert load_active("failure")[1].predict([[0]]).tolist() == [1]
    call_command("models", "rollback", "failure")
    assert "v1 is active again" in capsys.readouterr().out
    assert load_active("failure")[0].pk == v1.pk
    assert load_active("failure")[1].predict([[0]]).tolist() == [0]  # the memo was dropped
    v2.refresh_from_db()
    assert v2.status == ModelStatus.RETIRED and "rolled back" in v2.note


def test_rollback_with_nothing_before_is_a_clear_error():
    do_promote_version(_version(0.5))
    with pytest.raises(RegistryError, match="nothing to roll back to"):
        do_rollback("failure")
    with pytest.raises(CommandError, match="no active cohort model"):
        call_command("models", "rollback", "cohort")


def test_a_corrupted_artefact_is_refused():
    v = _version(0.5)
    do_promote_version(v)
    ModelVersion.objects.filter(pk=v.pk).update(artefact=b"not a model")
    load_active.cache_clear()
    with pytest.raises(RegistryError, match="does not match its SHA-256"):
        load_active("failure")


def test_only_one_active_version_per_kind_is_possible():
    from django.db import IntegrityError, transaction

    a, b = _version(0.5), _version(0.6)
    ModelVersion.objects.filter(pk=a.pk).update(status=ModelStatus.ACTIVE)
    with pytest.raises(IntegrityError), transaction.atomic():
        ModelVersion.objects.filter(pk=b.pk).update(status=ModelStatus.ACTIVE)


def test_models_list_shows_status_and_primary_metric(capsys):
    do_promote_version(_version(0.75))
    call_command("models", "list", "failure")
    out = capsys.readouterr().out
    assert "failure" in out and "active" in out and "pr_auc=0.7500" in out
