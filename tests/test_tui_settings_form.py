"""The settings screen's form: text fields to config changes, refusals with what is wrong."""

from __future__ import annotations

import pytest

from swarmling.app.tui.screens.settings import SettingsError, changes_from_form

FORM = {"questions": "", "external_groups": "4", "threads": "", "preset": "starter", "on_stop": "abandon",
        "max_memory_gb": "", "pause_on_battery": "yes", "windows": ""}


def test_settings_form_maps_blank_to_auto():
    changes = changes_from_form(FORM, resolved_questions=8)
    assert changes == {"round.questions": None, "round.external_groups": 4, "round.preset": "starter",
                       "backend.threads": None, "run.on_stop": "abandon", "resources.max_memory_gb": None,
                       "resources.pause_on_battery": True, "resources.windows": []}
    nights = changes_from_form(FORM | {"windows": "22:00-07:00, 12:00-13:00", "max_memory_gb": "3.5",
                                       "pause_on_battery": "no"}, resolved_questions=8)
    assert nights["resources.windows"] == ["22:00-07:00", "12:00-13:00"]
    assert nights["resources.max_memory_gb"] == 3.5 and nights["resources.pause_on_battery"] is False


@pytest.mark.parametrize("field,value,message", [
    ("external_groups", "8", "must be below"),
    ("external_groups", "", "whole number"),
    ("questions", "four", "not a whole number"),
    ("threads", "1.5", "not a whole number"),
    ("max_memory_gb", "lots", "not a number of GB"),
    ("max_memory_gb", "-1", "positive"),
    ("windows", "nights", "not a time window"),
])
def test_settings_form_refuses(field, value, message):
    with pytest.raises(SettingsError, match=message):
        changes_from_form(FORM | {field: value}, resolved_questions=8)
