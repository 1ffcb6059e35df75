"""Schemathesis against a live daphne: every /api/v1/ operation of docs/openapi.yaml, with valid and invalid input.

Every response must be no server error (5xx), carry a status, content type, headers and body the document
declares for that operation. The database holds real objects (tests.alerts.test_pages' world: rules, alerts in
every state, silences, channels, remediation actions, audit entries; plus a channel pointing at an allowlisted
local receiver and a queued agent command), and half of the cases of an operation with a path parameter use
those objects' ids, so the 200 paths are exercised, not only 404s. Collector endpoints get a collector token,
operator endpoints a read-write operator token; every secured operation is also tried without credentials.

Deterministic (derandomized, no example database, no shrinking) and small by default; BW_API_SCHEMA_LONG=1
runs many more examples per operation.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import requests
import schemathesis
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from alerts.models import AgentCommand, Channel
from alerts.receiver import Receiver
from dashboard.openapi import document
from telemetry.actions import do_create_collector_token
from tenancy.actions import do_create_api_token
from tests.alerts.test_pages import data  # noqa: F401  (the fixture: the alerting world)
from tests.conftest import AsgiServer, _wait_for_backends_to_exit

LONG = os.environ.get("BW_API_SCHEMA_LONG", "") not in ("", "0")
EXAMPLES = {GenerationMode.POSITIVE: 150 if LONG else 6, GenerationMode.NEGATIVE: 150 if LONG else 4}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
SCHEMA = schemathesis.openapi.from_dict(document())
OPERATIONS = [r.ok() for r in SCHEMA.get_all_operations()]
# BW_API_SCHEMA_ONLY="GET /alerts": fuzz only the operations whose label contains it (to chase one failure).
ONLY = os.environ.get("BW_API_SCHEMA_ONLY", "")
AGENT_HOST = "gpu-0042"


@pytest.fixture(scope="module")
def receiver():
    with Receiver() as rec:
        yield rec


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker, receiver):
    """daphne on the test database, with the test URL configuration (the document's own routes) and the
    receiver's loopback address allowed as a channel URL."""
    from urllib.parse import quote

    from django.conf import settings as django_settings

    db = django_settings.DATABASES["default"]
    url = f"postgresql://{quote(db['USER'])}:{quote(db['PASSWORD'])}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    srv = AsgiServer({**os.environ, "DATABASE_URL": url, "DB_CONN_MAX_AGE": "0", "LOG_LEVEL": "ERROR", "DEBUG": "0",
                      "OUTBOUND_URL_ALLOWLIST": f"127.0.0.1:{receiver.port}"})
    srv.start()
    yield srv
    srv.stop()
    _wait_for_backends_to_exit(db["NAME"], django_db_blocker)


@pytest.fixture
def world(data, receiver, django_user_model) -> dict:  # noqa: F811
    """The objects the operations act on, and the credentials of each kind of caller."""
    ops = django_user_model.objects.create_user("olivia", is_staff=True)
    _, api = do_create_api_token("schema-test", user=ops, read_only=False)
    hook = Channel.objects.create(name="local-receiver", kind="webhook", config={"url": receiver.url("/hook")})
    now = timezone.now()
    cmd = AgentCommand.objects.create(hostname=AGENT_HOST, command="power_cap", params={"index": 0, "watts": 500},
                                      created_at=now, expires_at=now + timedelta(hours=1))
    ids = {"alert_id": data["hot"].pk, "rule_id": data["rule"].pk, "silence_id": data["silence"].pk,
           "channel_id": hook.pk, "action_id": data["awaiting"].pk, "command_id": cmd.pk}
    yield {"ids": ids, "collector": f"Bearer {do_create_collector_token('schema-test')}", "api": f"Bearer {api}"}
    # The audit log refuses TRUNCATE (alerts migration 0003) unless the session allows it: the flush after a
    # transactional test runs on this connection.
    with connection.cursor() as cur:
        cur.execute("SET breakwater.allow_truncate = 'on'")


def _credentials(operation, world: dict) -> dict:
    schemes = {name for req in operation.definition.raw.get("security", []) for name in req}
    if "collectorToken" in schemes:
        return {"Authorization": world["collector"]}
    return {"Authorization": world["api"]} if schemes else {}


def _strategy(operation, mode: GenerationMode, world: dict):
    names = {p.name for p in operation.path_parameters}
    if not names:
        return operation.as_strategy(generation_mode=mode)
    # Seeded objects' ids, or any id (mostly 404s); a negative case keeps the ids valid, so the route matches.
    fixed = operation.as_strategy(generation_mode=mode, path_parameters={n: world["ids"][n] for n in names})
    return fixed if mode == GenerationMode.NEGATIVE else st.one_of(fixed, operation.as_strategy(generation_mode=mode))


def _run(operation, mode: GenerationMode, world: dict, session, base_url: str) -> list[str]:
    failures: list[str] = []
    headers = _credentials(operation, world)

    @settings(max_examples=EXAMPLES[mode], derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=_strategy(operation, mode, world))
    def fuzz(case):
        try:
            case.call_and_validate(base_url=base_url, session=session, headers=headers, checks=CHECKS, timeout=30)
        except FailureGroup as exc:
            if len(failures) < 3:
                failures.append(f"{operation.label} [{mode.value}]: {exc}"[:3000])

    try:
        fuzz()
    except Unsatisfiable:  # nothing to make invalid: an operation without parameters or body (negative mode)
        assert mode == GenerationMode.NEGATIVE, operation.label
    return failures


@pytest.mark.django_db(transaction=True)
def test_every_operation_conforms_to_the_document(server, world):
    base_url = server.url + "/api/v1"
    failures: list[str] = []
    with requests.Session() as session:
        for operation in (op for op in OPERATIONS if ONLY in op.label):
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                failures += _run(operation, mode, world, session, base_url)
    assert not failures, "\n\n".join(failures)


@pytest.mark.django_db(transaction=True)
def test_every_secured_operation_refuses_a_caller_without_credentials(server, world):
    base_url = server.url + "/api/v1"
    checked = 0
    with requests.Session() as session:
        for operation in OPERATIONS:
            if not operation.definition.raw.get("security", [{}]):
                continue
            body = {"media_type": "application/json", "body": {}} if operation.body else {}
            case = operation.Case(path_parameters=dict.fromkeys(
                (p.name for p in operation.path_parameters), 1), **body)
            response = case.call(base_url=base_url, session=session)
            assert response.status_code == 401, (operation.label, response.status_code, response.text[:300])
            case.validate_response(response, checks=CHECKS)
            checked += 1
    assert checked == len(OPERATIONS) - 2  # all but the document's own two routes
