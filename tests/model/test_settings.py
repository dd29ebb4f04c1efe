"""multipos.model.settings: where each encoder setting comes from when a checkpoint folder is loaded."""

from __future__ import annotations

import json
import logging

import pytest

from multipos.model.settings import DEFAULTS, resolve_settings

UNSET = dict.fromkeys(DEFAULTS)


def test_nothing_saved_or_given_gives_the_defaults_and_a_given_value_wins(tmp_path):
    assert resolve_settings(tmp_path, UNSET, prefer_saved=True) == DEFAULTS
    got = resolve_settings(tmp_path, {**UNSET, "pooling": "mean", "temperature": "0.05"}, prefer_saved=True)
    assert got["pooling"] == "mean" and got["temperature"] == 0.05 and got["normalize"] is False


def test_a_saved_value_wins_unless_prefer_saved_is_off_and_each_conflict_is_named(tmp_path, caplog):
    (tmp_path / "multipos_encoder.json").write_text(json.dumps({"pooling": "mean", "temperature": 0.05,
                                                                "normalize": True}))
    given = {**UNSET, "pooling": "cls", "temperature": 0.05 + 1e-12}  # the same temperature up to rounding
    with caplog.at_level(logging.WARNING):
        kept = resolve_settings(tmp_path, given, prefer_saved=True)
    assert (kept["pooling"], kept["temperature"], kept["normalize"]) == ("mean", 0.05, True)
    assert caplog.text.count("differs from") == 1 and "model.pooling=cls" in caplog.text
    forced = resolve_settings(tmp_path, given, prefer_saved=False)
    assert forced["pooling"] == "cls" and forced["normalize"] is True  # unset: still the saved value


def test_a_given_mapping_without_a_field_is_refused(tmp_path):
    with pytest.raises(KeyError, match="pooling"):
        resolve_settings(tmp_path, {k: v for k, v in UNSET.items() if k != "pooling"}, prefer_saved=True)
