"""The setting a run's numbers were made in — device kind and precision — and the rule that one table, slope or
figure compares runs of one setting only.

The project measured that re-training a cell on another CPU, or in another precision, moves nDCG@10 by up to about
0.005, the size of many differences its tables test; so the renderers (:func:`multipos.report.render.render_sweep`,
``python -m multipos.report.noise``) refuse runs of several settings, naming each setting's runs, unless told to mix
them (then the table says so under it).

A run's setting comes from its ``run_info.json``: ``device`` without its thread count ("CPU AMD EPYC, 2 cores"), and
``precision`` (training, encoding) as recorded by runs since 2026-12-02; for older runs the encoding precision is read
from ``spec.json`` (``evaluation.bf16``) or ``train.log`` (the embedding cache name and encoder lines say ``bf16`` or
``fp32``) and the training precision is "not recorded".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["MixedSettingsError", "run_setting", "check_one_setting", "describe_settings"]

_THREADS = re.compile(r",\s*\d+\s+torch threads?$")
_LOGGED = re.compile(r"(?:encoded .* \((bf16|fp32)\)|embeddings/[0-9a-f-]+-\d+-(bf16|fp32)\.npy)")


class MixedSettingsError(ValueError):
    """Runs of several settings (device kinds or precisions) were to be compared in one table."""


def _logged_encoding(run_dir: Path) -> str | None:
    """The encoding precision an older run used: its ``spec.json`` (``evaluation.bf16``), else its ``train.log``."""
    spec = run_dir / "spec.json"
    if spec.is_file():
        try:
            bf16 = json.loads(spec.read_text(encoding="utf-8")).get("evaluation", {}).get("bf16")
        except (ValueError, AttributeError):
            bf16 = None
        if isinstance(bf16, bool):
            return "bf16" if bf16 else "fp32"
    log = run_dir / "train.log"
    if not log.is_file():
        return None
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _LOGGED.search(line)
            if m:
                return m.group(1) or m.group(2)
    return None


def run_setting(info: Mapping, run_dir: str | Path | None = None) -> tuple[str, str, str]:
    """(device kind, training precision, encoding precision) of a run from its ``run_info.json`` content ``info``
    (and, for runs that did not record precision, its folder's ``train.log``). Unknown parts are ``"not recorded"``."""
    device = _THREADS.sub("", str(info.get("device") or "not recorded"))
    precision = info.get("precision") or {}
    training = str(precision.get("training") or "not recorded")
    encoding = precision.get("encoding") or (_logged_encoding(Path(run_dir)) if run_dir is not None else None)
    return device, training, str(encoding or "not recorded")


def describe_settings(settings: Mapping[tuple[str, str, str], Sequence[str]]) -> str:
    """One line per setting: ``device, training <p>, encoding <p>: n runs (e.g. <first run>)``."""
    return "; ".join(f"{d}, training {t}, encoding {e}: {len(runs)} run{'s' * (len(runs) != 1)} (e.g. {runs[0]})"
                     for (d, t, e), runs in settings.items())


def check_one_setting(runs: Sequence[tuple[str, Mapping, str | Path | None]], what: str,
                      allow_mixed: bool = False) -> str | None:
    """Check that ``runs`` — (name, run_info content, run folder) each — share one setting (:func:`run_setting`); a
    part a run did not record matches any.

    Returns:
        None when they do; with ``allow_mixed``, the note a table must carry when they do not.

    Raises:
        MixedSettingsError: they do not and ``allow_mixed`` is false; the message names each setting with its runs.
    """
    settings: dict[tuple[str, str, str], list[str]] = {}
    for name, info, folder in runs:
        settings.setdefault(run_setting(info, folder), []).append(name)
    devices = {k[0] for k in settings} - {"not recorded"}
    encodings = {k[2] for k in settings} - {"not recorded"}
    trainings = {k[1] for k in settings} - {"not recorded"}
    if len(devices) <= 1 and len(encodings) <= 1 and len(trainings) <= 1:
        return None
    text = f"{what} compares runs made in {len(settings)} settings: {describe_settings(settings)}"
    if not allow_mixed:
        raise MixedSettingsError(f"{text}. A table compares runs of one device kind and precision only: re-run the "
                                 "cells of one setting, or render the settings apart (--allow-mixed-settings renders "
                                 "them together with this note)")
    return f"Mixed settings, differences up to the cross-machine offset are not comparable: {text}."
