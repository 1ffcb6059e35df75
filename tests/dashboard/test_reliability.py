"""The reliability page: access, the empty state, the figures and hazard table after
`fit_survival` has run on a subset of the real ORNL Titan records, and this fleet's own failures
from seeded GPU events beside them."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from anomaly.models import ModelKind, ModelStatus, ModelVersion
from dashboard.pages import reliability as reliability_page
from tests import personas
from tests.conftest import SHARED_DATA
from tests.telemetry.reliability_seed import NOW as FLEET_NOW
from tests.telemetry.reliability_seed import expected_failures, gpu_days, seed_fleet

TITAN = SHARED_DATA / "traces" / "titan-gpu-failures" / "gc_full.csv"
PASSWORD = personas.PASSWORD


def titan_subset(path, digits: str = "0123") -> None:
    """The real file cut to the GPUs whose serial ends in one of `digits`, with all their rows."""
    with open(TITAN, encoding="utf-8") as f:
        header, *rows = f.read().splitlines()
    path.write_text("\n".join([header, *(r for r in rows if r.split(",", 1)[0][-1:] in digits)]) + "\n")


@pytest.fixture
def operator(client, django_user_model):
    return personas.signed_in(personas.operator("rel-operator"), client)


@pytest.fixture
def fitted(tmp_path):
    csv = tmp_path / "gc_subset.csv"
    titan_subset(csv)
    call_command("fit_survival", "--csv", str(csv), "--points", "60", stdout=io.StringIO())
    return ModelVersion.objects.get(kind=ModelKind.SURVIVAL, status=ModelStatus.ACTIVE)


@pytest.mark.django_db
def test_reliability_anonymous_is_redirected_to_login(client):
    response = client.get(reverse("reliability"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.django_db
def test_reliability_without_fitted_model_says_how_to_fit(operator):
    response = operator.get(reverse("reliability"))
    html = response.content.decode()
    assert response.status_code == 200
    assert "No survival model fitted yet" in html and "./dev manage fit_survival" in html
    assert "bw-reliability-figures" not in html and "plotly-cartesian" not in html


@pytest.mark.django_db
def test_fit_survival_registers_and_promotes_a_survival_version(fitted):
    assert fitted.version == 1 and fitted.metrics["primary"] == "concordance"
    assert 0.5 < fitted.metrics["concordance"] <= 1 and fitted.metrics["higher_is_better"] is True
    assert fitted.metrics["failures"] > 1000 and "cage=2" in fitted.features and "batch=new" in fitted.features
    assert fitted.train_start < fitted.train_end


@pytest.mark.django_db
def test_reliability_after_fit_shows_curves_and_hazard_table(operator, fitted):
    response = operator.get(reverse("reliability"))
    html = response.content.decode()
    assert response.status_code == 200
    figures = json.loads(re.search(r'<script id="bw-reliability-figures" type="application/json">(.*?)</script>',
                                   html, re.S).group(1))
    assert {"bw-km-cage", "bw-km-node", "bw-km-slot", "bw-forest"} <= set(figures)
    cage_lines = [t["name"] for t in figures["bw-km-cage"]["data"] if t.get("mode") == "lines"]
    assert [name.split(" (")[0] for name in cage_lines] == ["cage 0", "cage 1", "cage 2"]
    assert all(t["fill"] == "toself" for t in figures["bw-km-cage"]["data"] if "fill" in t)  # the bands
    assert 'id="bw-km-cage"' in html and 'data-name="cage=2"' in html and 'data-name="batch=new"' in html
    sentence = re.search(r'id="bw-cage-effect">(.*?)</p>', html, re.S).group(1)
    assert re.search(r"GPUs in cage 2 fail \d+\.\d× as fast as those in cage 0 \(hazard ratio, 95% CI", sentence)


@pytest.mark.django_db
def test_reliability_serves_plotly_locally_and_switches_batch(operator, fitted):
    html = operator.get(reverse("reliability")).content.decode()
    scripts = re.findall(r'<script src="([^"]+)"', html)
    assert any(s.startswith("/static/vendor/plotly-cartesian-") for s in scripts)
    assert all(s.startswith("/") for s in scripts)  # nothing from a CDN
    new = operator.get(reverse("reliability") + "?batch=new").content.decode()
    assert '<a href="?batch=new" aria-current="page">' in new
    assert operator.get(reverse("reliability") + "?batch=nonsense").status_code == 200


@pytest.mark.django_db
def test_fit_survival_missing_file_says_so(tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        call_command("fit_survival", "--csv", str(tmp_path / "absent.csv"))


@pytest.mark.django_db
def test_fit_survival_bad_row_names_line_and_field(tmp_path):
    csv = tmp_path / "bad.csv"
    with open(TITAN, encoding="utf-8") as f:
        lines = [next(f) for _ in range(4)]
    lines[3] = lines[3].replace(lines[3].split(",")[1], "cabinet-9", 1)
    csv.write_text("".join(lines))
    with pytest.raises(CommandError, match=r"line 4: field 'location' value 'cabinet-9'"):
        call_command("fit_survival", "--csv", str(csv))
    assert not ModelVersion.objects.filter(kind=ModelKind.SURVIVAL).exists()


# --- this fleet's own failures, beside the reference ---------------------------------------------------

@pytest.fixture
def seeded(db):
    return seed_fleet()


@pytest.fixture
def pinned(operator, monkeypatch):
    monkeypatch.setattr(reliability_page, "now", lambda: FLEET_NOW)
    return operator


def cell(html: str, element_id: str) -> str:
    return re.sub(r"\s+", " ", re.search(rf'id="{element_id}">(.*?)</', html, re.S).group(1)).strip()


@pytest.mark.django_db
def test_reliability_shows_this_fleets_failures_from_its_events(pinned, seeded):
    html = pinned.get(reverse("reliability")).content.decode()
    failures, days = expected_failures(), gpu_days(seeded.values())
    assert cell(html, "bw-fleet-failures").startswith(f"{len(failures)} <small>on "
                                                     f"{len({(f.host, f.index) for f in failures})} GPUs")
    assert cell(html, "bw-fleet-rate") == f"{1000 * len(failures) / days:,.2f}"
    assert cell(html, "bw-fleet-mtbf") == f"{days / len(failures):,.1f} GPU-days"
    assert cell(html, "bw-fleet-gpus") == str(len(seeded))
    recent = re.search(r'id="bw-fleet-recent">(.*?)</table>', html, re.S).group(1)
    newest = sorted(failures, key=lambda f: f.at, reverse=True)
    assert re.findall(r'<a href="(/gpus/[^"]+/)">([^<]+)</a>', recent) == [
        (f"/gpus/{seeded[(f.host, f.index)].uuid}/", f"GPU {f.index} of {f.host}") for f in newest]
    assert 'data-kind="xid" data-code="79"' in html and "XID 79: GPU has fallen off the bus" in html
    # The two sources are labelled apart, and the weekly figure is drawn from this fleet's data.
    assert '<h2 id="bw-fleet-h" class="bw-rel-source">This fleet' in html
    assert '<h2 id="bw-titan-h" class="bw-rel-source">Titan reference (OLCF)' in html
    figures = json.loads(re.search(r'id="bw-reliability-figures" type="application/json">(.*?)</script>',
                                   html, re.S).group(1))
    assert sum(figures["bw-fleet-weekly"]["data"][0]["y"]) == len(failures)


@pytest.mark.django_db
def test_reliability_titan_reference_is_labelled_with_its_years(operator, fitted):
    html = operator.get(reverse("reliability")).content.decode()
    label = f"Titan reference (OLCF, {fitted.train_start.year}–{fitted.train_end.year})"
    assert f'<h2 id="bw-titan-h" class="bw-rel-source">{label}' in html
    assert 'id="bw-fleet-empty"' in html  # no GPU in this inventory: nothing counted, nothing invented
