"""The XID catalogue: required codes, well-formed entries, and the actions operators rely on. No database."""

from __future__ import annotations

import dataclasses

import pytest

from telemetry.xid import (
    ACTIONS,
    CATALOGUE,
    SEVERITIES,
    XidInfo,
    describe,
    effective_action,
    recovery_action_from_message,
)

REQUIRED = (8, 13, 31, 32, 38, 43, 45, 48, 56, 57, 58, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 110, 119, 120,
            121, 140, 143, 144, 145, 146, 147, 148, 149, 150, 154)


def test_catalogue_covers_required_codes() -> None:
    assert set(REQUIRED) <= set(CATALOGUE)


@pytest.mark.parametrize("code", sorted(CATALOGUE))
def test_entry_is_well_formed(code: int) -> None:
    info = CATALOGUE[code]
    assert info.code == code and info.known
    assert info.severity in SEVERITIES and info.action in ACTIONS
    assert info.name and info.meaning and info.mnemonic.isupper()


def test_xid_info_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        describe(48).action = "none"  # type: ignore[misc]


def test_xid_79_is_lost_gpu_with_drain_action() -> None:
    info = describe(79)
    assert info.gpu_lost and info.severity == "critical"
    assert info.action in ("drain_node", "reset_gpu")
    assert [c for c, i in CATALOGUE.items() if i.gpu_lost] == [79]


def test_xid_48_dbe_is_critical_reset_gpu() -> None:
    info = describe(48)
    assert (info.severity, info.action) == ("critical", "reset_gpu")
    assert "ECC" in info.name


@pytest.mark.parametrize("code", [13, 31, 43])
def test_application_level_xids_restart_app_or_none(code: int) -> None:
    info = describe(code)
    assert info.action in ("restart_app", "none") and info.severity != "critical" and not info.gpu_lost


def test_unknown_code_is_warning_with_no_action() -> None:
    info = describe(9999)
    assert info == XidInfo(9999, "UNKNOWN", "Unknown Xid 9999", info.meaning, "warning", "none", False, known=False)


@pytest.mark.parametrize(("message", "action"), [
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "reset_gpu"),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "reboot_node"),
    ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", "drain_node"),
    ("GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)", "none"),
    ("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", "reset_gpu"),
])
def test_xid_154_message_maps_to_recovery_action(message: str, action: str) -> None:
    assert recovery_action_from_message(message) == action
    assert effective_action(154, message) == action


def test_xid_154_unrecognised_message_falls_back_to_none() -> None:
    assert recovery_action_from_message("something else") is None
    assert effective_action(154, "something else") == "none"
    assert effective_action(48) == "reset_gpu"


def test_actions_are_ordered_by_disruption() -> None:
    # callers take max(..., key=ACTIONS.index) to combine recommendations for one GPU
    assert ACTIONS.index("none") < ACTIONS.index("restart_app") < ACTIONS.index("reset_gpu") < ACTIONS.index("rma")
