"""Every command the docs and configs show runs as written: none can go stale.

Commands are collected from README.md and docs/*.md (code blocks, and inline code that starts a command) and from the
comments of conf/**/*.yaml and the Makefile: ``python train.py|evaluate.py|annotate.py ...``,
``python -m multipos.<module> ...`` and ``make <target> ...``. The placeholders of a usage line are filled in the
way a reader would (:func:`concrete`): an optional ``[...]`` part and ``...`` are left out, ``a|b`` takes ``a``, a
sweep ``a,b`` its first value, ``<...>`` a valid choice for a config group and a plain word elsewhere. Then:

- a Hydra job's overrides compose with its config (``train``, ``evaluate``, ``annotate``), and the job it names is
  the script's (``job: evaluate`` studies go through evaluate.py); ``train.py`` runs with Tevatron or BEIR data are
  checked against :func:`multipos.data.sources.check_regime_keeps_positives`;
- ``python -m multipos.<module>`` names a module whose ``--help`` exits 0, and ``multipos.assets fetch`` names
  registered assets;
- ``make`` targets dry-run (``make -n``).
"""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, compose_cfg

SCRIPTS = {"train.py": "train", "evaluate.py": "evaluate", "annotate.py": "annotate"}
COMMAND = re.compile(r"^(?:[A-Z][A-Z0-9_]*=\S+\s+)*(?:python3?\s+(?:train\.py|evaluate\.py|annotate\.py|-m\s+multipos)"
                     r"|make\s+[a-z])")
#: Where a comment's command ends and its prose begins: two spaces, ``(``, ``)``, ``; ``, ``. ``.
PROSE_AFTER = re.compile(r"\s{2,}|\s\(|\)|;\s|;$|\.\s")
#: A valid choice for each config group a placeholder (``<...>``) stands for.
GROUP_CHOICE = {"eval": "nfcorpus_test", "experiment": "table2_homogeneous", "loss": "lsepair", "data": "nfcorpus",
                "model": "minilm", "scale": "cpu", "regime": "homogeneous", "trainer": "default",
                "passages": "frozen_index", "prompts": "none", "recipe": "top1", "logger": "csv"}
#: A valid value for keys whose placeholder must be a known name, not any word.
VALUE_CHOICE = {"NAME": "table2_homogeneous", "SCALE": "cpu", "data_path": "/data/prepared", "eval.paths": "[a,b]"}


def _md_commands(path: Path) -> list[tuple[str, str]]:
    """(where, command) of a Markdown page: lines of code blocks, joined at a trailing ``\\``, and inline code."""
    out, fenced, pending, start = [], False, "", 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            if pending:
                pending += " " + line.strip()
            elif COMMAND.match(line.strip()):
                pending, start = line.strip(), n
            if pending and not pending.endswith("\\"):
                out.append((f"{path.name}:{start}", pending))
                pending = ""
            elif pending:
                pending = pending[:-1].rstrip()
            continue
        for span in re.findall(r"`([^`]+)`", line):
            if COMMAND.match(span.strip()):
                out.append((f"{path.name}:{n}", span.strip()))
    return out


def _comment_commands(path: Path) -> list[tuple[str, str]]:
    """(where, command) of the comments of a YAML file or the Makefile: a comment that starts with a command (its
    ``\\`` continuation lines joined; each ``&&`` part), and inline code that starts one."""
    out, pending, start = [], "", 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        comment = line.split("#", 1)[1].lstrip("#").strip() if "#" in line else ""
        if pending:
            pending += " " + comment
        elif COMMAND.match(comment):
            pending, start = comment, n
        else:
            out += [(f"{path.relative_to(REPO)}:{n}", span.strip()) for span in re.findall(r"`([^`]+)`", comment)
                    if COMMAND.match(span.strip())]
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
        elif pending:
            out += [(f"{path.relative_to(REPO)}:{start}", PROSE_AFTER.split(part.strip())[0])
                    for part in pending.split("&&")]
            pending = ""
    return out


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))


def documented_commands() -> list[tuple[str, str]]:
    """Every command of README.md, docs/*.md, conf/**/*.yaml comments and Makefile comments, with its place."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        found += _md_commands(page)
    for config in sorted((REPO / "conf").rglob("*.yaml")):
        found += _comment_commands(config)
    found += _comment_commands(REPO / "Makefile")
    return found


def _drop_optional(tokens: list[str]) -> list[str]:
    """Leave out optional parts: a run of tokens from one that opens with ``[`` to the one that closes it (a list
    value, ``key=[...]``, is no optional part), and ``...``."""
    out, depth = [], 0
    for token in tokens:
        if depth or token.startswith("["):
            depth += token.count("[") - token.count("]")
            continue
        if token not in ("...", "[overrides...]"):
            out.append(token)
    return out


def _first(value: str) -> str:
    """The first alternative of ``a|b`` and the first value of a sweep ``a,b`` (not inside brackets or braces)."""
    if value.startswith(("[", "{", "'", '"')):
        return value
    return re.split(r"[|,]", value)[0]


def concrete(command: str) -> list[str]:
    """The tokens of ``command`` with its placeholders filled in (see the module docstring)."""
    text = re.sub(r"<[^<>]*>", lambda m: m.group(0).replace(" ", "_"), command)
    tokens = []
    for token in _drop_optional(shlex.split(text, comments=True)):
        key, sep, value = token.partition("=")
        if sep and "<" in value:
            group = key.split("/")[-1] if "/" in key else key
            choice = "table3_ood" if group == "experiment" and "evaluate.py" in text else GROUP_CHOICE.get(group)
            value = VALUE_CHOICE.get(key) or choice or re.sub(r"<[^<>]*>", "placeholder", value)
            if key.endswith("/model") or key == "init_from" or key.endswith("name_or_path"):
                value = "/data/run/model"
        elif "<" in token:
            token = re.sub(r"<[^<>]*>", "placeholder", token)
        tokens.append(f"{key}={_first(value)}" if sep else token)
    return tokens


COMMANDS = documented_commands()


def test_the_docs_show_commands_of_every_kind():
    kinds = {next((k for k in (*SCRIPTS, "-m", "make") if k in cmd.split()), None) for _, cmd in COMMANDS}
    assert {"train.py", "evaluate.py", "annotate.py", "-m", "make"} <= kinds and len(COMMANDS) > 60


def _hydra_overrides(tokens: list[str]) -> list[str]:
    return [t for t in tokens if "=" in t and not t.startswith("-")]


HYDRA_JOB = re.compile(r"^(?:[A-Z][A-Z0-9_]*=\S+\s+)*python3?\s+(?:train|evaluate|annotate)\.py")


@pytest.mark.parametrize(("where", "command"), [c for c in COMMANDS if HYDRA_JOB.match(c[1])],
                         ids=[w for w, c in COMMANDS if HYDRA_JOB.match(c)])
def test_a_documented_hydra_command_composes(where, command, tmp_path):
    tokens = concrete(command)
    script = next(t for t in tokens if t in SCRIPTS)
    overrides = _hydra_overrides(tokens[tokens.index(script) + 1:])
    cfg = compose_cfg(SCRIPTS[script], overrides, return_hydra_config=True)
    if script != "annotate.py":
        assert cfg.job == SCRIPTS[script], f"{where}: {command!r} is a job: {cfg.job} study, not {script}'s"
    else:
        assert not isinstance(cfg.judge, str), f"{where}: {command!r} replaces the judge node by a string"
    if script == "train.py":
        from multipos.data.sources import check_regime_keeps_positives

        check_regime_keeps_positives(cfg.data.source, cfg.stages, where=f"{where}: {command}")


def _module_commands():
    return [c for c in COMMANDS if re.search(r"python3?\s+-m\s+multipos", c[1])]


MODULES = sorted({re.search(r"-m\s+(multipos[\w.]*\w)", c).group(1) for _, c in _module_commands()})


@pytest.mark.parametrize("module", MODULES)
def test_a_documented_module_answers_help(module, monkeypatch):
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(io.StringIO()):
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert done.value.code in (0, None), module


def test_documented_asset_fetches_name_registered_assets():
    from multipos.assets.registry import REGISTRY

    for where, command in _module_commands():
        tokens = concrete(command)
        if "multipos.assets" in tokens and "fetch" in tokens:
            names = [t for t in tokens[tokens.index("fetch") + 1:] if not t.startswith("-") and "=" not in t]
            assert names and all(n in REGISTRY for n in names), f"{where}: {command!r}"


def test_documented_make_targets_dry_run():
    targets = _make_targets()
    for where, command in [c for c in COMMANDS if c[1].startswith("make ")]:
        tokens = concrete(command)
        assert tokens[1] in targets, f"{where}: {command!r}: no Makefile target {tokens[1]!r}"
        p = subprocess.run(["make", "-n", *tokens[1:]], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, f"{where}: {command!r}: {p.stderr[-500:]}"
