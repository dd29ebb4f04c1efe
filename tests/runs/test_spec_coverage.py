"""No silent run-key collision: every setting of every study cell and of the main job is either part of the run spec
(changing it changes the key) or declared in ``multipos.runs.spec.NOT_IN_SPEC`` with the reason it changes nothing a
run computes. A new setting fails here until someone decides which."""

from __future__ import annotations

import copy
import fnmatch
from functools import lru_cache

import pytest
from omegaconf import OmegaConf

from multipos.runs.spec import NOT_IN_SPEC, spec_from_plain
from tests.helpers import compose_cfg
from tests.test_configs import EXPERIMENT_NEEDS, EXPERIMENTS, job_config, sweep_cells
from tests.test_study_cells import VARIANTS

#: Beyond the studies: the main job (train.yaml's default experiment), and settings that only count when a feature
#: is on (re-mining while training, GradCache, a checkpoint's saved settings ignored).
EXTRA = [("train", ["experiment=default"]),
         ("train", ["experiment=default", "data.source.negative_refresh_epochs=1"]),
         ("train", ["experiment=default", "module.grad_cache_chunk_size=8"])]


def _leaves(node, prefix=()):
    """(path, value) of every leaf of plain config data (an empty mapping is a leaf; so is a list of scalars)."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, (*prefix, k))
    elif isinstance(node, list) and any(isinstance(v, (dict, list)) for v in node):
        for i, v in enumerate(node):
            yield from _leaves(v, (*prefix, i))
    else:
        yield prefix, node


def _changed(value):
    """Another value of the same kind (a null becomes a string: an optional feature switched on)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 1.5 + 1
    if isinstance(value, str):
        return value + "_changed"
    if isinstance(value, list):
        return [*value, "changed"]
    return {"changed": 1} if isinstance(value, dict) else "changed"


def _set(plain, path, value):
    for k in path[:-1]:
        plain = plain[k]
    plain[path[-1]] = value


def _key(plain) -> str | None:
    try:
        return spec_from_plain(plain).key()
    except Exception:  # the spec reads it (a stage plan or section that refuses the value)
        return None


def _configs():
    for experiment in EXPERIMENTS:
        job = job_config(experiment)
        for variant in VARIANTS:
            for cell in sweep_cells(experiment, seeds_once=True)[:2]:
                yield job, [f"experiment={experiment}", *variant, *cell, *EXPERIMENT_NEEDS.get(experiment, [])]
    yield from EXTRA


@lru_cache(maxsize=1)
def _walk() -> tuple[frozenset[str], frozenset[str]]:
    """(every leaf path seen, the paths whose change changed the key in at least one config)."""
    seen, in_spec = set(), set()
    for job, overrides in _configs():
        plain = OmegaConf.to_container(compose_cfg(job, [*overrides, "paths.output_dir=out"]), resolve=True)
        base = _key(plain)
        for path, value in _leaves(plain):
            name = ".".join(map(str, path))
            seen.add(name)
            if name in in_spec:
                continue
            changed = copy.deepcopy(plain)
            _set(changed, path, _changed(value))
            if _key(changed) != base:
                in_spec.add(name)
    return frozenset(seen), frozenset(in_spec)


def _declared(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in NOT_IN_SPEC)


@pytest.fixture(scope="module")
def walk(monkeypatch_module):
    return _walk()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MULTIPOS_BF16", "0")  # a key does not depend on this machine's bf16
        yield mp


def test_every_setting_is_in_the_spec_or_declared_as_changing_nothing(walk):
    seen, in_spec = walk
    undeclared = sorted(n for n in seen - in_spec if not _declared(n))
    assert not undeclared, ("settings that change no run key and are not in multipos.runs.spec.NOT_IN_SPEC (put each "
                            "in the spec or declare it there with the reason):\n" + "\n".join(undeclared))


def test_no_declared_setting_changes_the_key(walk):
    _, in_spec = walk
    contradicted = sorted(n for n in in_spec if _declared(n) and not n.endswith(("._target_", "._partial_")))
    assert not contradicted, f"declared in NOT_IN_SPEC but part of the spec: {contradicted}"


def test_every_declaration_matches_a_setting(walk):
    seen, _ = walk
    unused = sorted(p for p in NOT_IN_SPEC if not any(fnmatch.fnmatchcase(n, p) for n in seen))
    assert not unused, f"NOT_IN_SPEC patterns that match no setting of any study: {unused}"


@pytest.mark.parametrize("override, section", [("module.gradient_clip_val=0.5", "module_clipping"),
                                               ("model.prefer_saved=false", "prefer_saved")])
def test_a_module_clip_of_its_own_and_ignoring_saved_settings_change_the_key(override, section, monkeypatch_module):
    base = OmegaConf.to_container(compose_cfg("train", ["experiment=default", "paths.output_dir=out"]), resolve=True)
    changed = OmegaConf.to_container(compose_cfg("train", ["experiment=default", override, "paths.output_dir=out"]),
                                     resolve=True)
    assert spec_from_plain(base).key() != spec_from_plain(changed).key()
    assert section in str(spec_from_plain(changed).to_dict())
