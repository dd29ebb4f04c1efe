"""The run folder has one owner (multipos.runs.folder): run folders in every state, and training, equivalent-run reuse,
the report and the notebooks' run finder agree on which are finished."""

from __future__ import annotations

import json

import pytest

from multipos.report.render import render_sweep
from multipos.runs.find import find_runs, sweep_runs
from multipos.runs.folder import is_finished, prepare_run_dir, read_json, read_run_info, write_run_info
from multipos.runs.reuse import find_equivalent, register
from tests.report.fakes import CONFIG, SET, qmap

HASH, KEY = "h-this", "k-this"
REPORT = """report:
  name: states
  title: "states"
  row_key: name
  columns: [nfcorpus_test:ndcg@10]
  plot: null
"""


def _folder(root, name, info=None, metrics=True, model=True):
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(CONFIG.format(data="d", G=8, M=4, objective="jointlh", seed=1)
                                                + REPORT + f"cell: {name}\n")
    (d / ".hydra" / "overrides.yaml").write_text(f"- loss=jointlh\n- +cell={name}\n")
    if info is not None:
        write_run_info(d, info)
    if metrics:
        (d / "metrics.json").write_text(json.dumps({SET: {"ndcg@10": 0.3}}))
        (d / f"per_query.{SET}.json").write_text(json.dumps({"ndcg@10": qmap([0.3, 0.3])}))
    if model:
        (d / "model").mkdir()
    return d


#: state → (run_info.json, metrics.json written, finished?)
STATES = {
    "running": ({"status": "running", "run_key": HASH, "equivalence_key": KEY}, False, False),
    "killed_before_its_last_write": ({"status": "running", "run_key": HASH, "equivalence_key": KEY}, True, False),
    "complete": ({"status": "complete", "run_key": HASH, "equivalence_key": KEY}, True, True),
    "reused": ({"status": "complete", "run_key": HASH, "equivalence_key": KEY, "reused_from": "/x"}, True, True),
    "other_config": ({"status": "complete", "run_key": "h-other", "equivalence_key": "k-other"}, True, True),
    "metrics_lost": ({"status": "complete", "run_key": HASH, "equivalence_key": KEY}, False, False),
    "no_run_info": (None, True, False),
}


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "states-cpu"
    for name, (info, metrics, _) in STATES.items():
        _folder(root, name, info, metrics)
    return root


def test_training_reuse_report_and_finder_agree_on_every_state(sweep, tmp_path):
    finished = {name for name, (_, _, done) in STATES.items() if done}
    for name, (_, _, done) in STATES.items():
        d = sweep / name
        assert is_finished(d) is done, name
        if name == "other_config":  # training refuses to touch a finished run of another configuration
            with pytest.raises(ValueError, match="another configuration"):
                prepare_run_dir(d, HASH)
        else:
            assert prepare_run_dir(d, HASH)[1] is done, name  # training: skip (finished) or resume
        register(KEY, d)  # reuse: only finished runs with the key enter the index and come back from it
    found = find_equivalent(KEY, tmp_path / "new_run")
    assert found is not None and found.name in {"complete", "reused"}
    index = read_json(tmp_path / "cache" / "runs" / f"{KEY}.json")
    assert {p.rsplit("/", 1)[-1] for p in index} == {"complete", "reused"}
    done, not_done = sweep_runs(sweep)  # the report
    assert {d.name for d in done} == finished and {d.name for d in not_done} == set(STATES) - finished
    assert {d.name for d in find_runs(sweep)} == finished  # the notebooks' finder
    assert {d.name for d in find_runs(sweep, complete=False)} == set(STATES) - {"no_run_info"}
    with pytest.warns(UserWarning, match="4 incomplete run dir"):
        md = render_sweep(sweep, tmp_path / "out")
    rows = {line.split(" | ")[0].strip("| ") for line in md.splitlines() if line.startswith("| ") and "---" not in line}
    assert finished <= rows and not (set(STATES) - finished) & rows


def test_a_corrupt_run_info_counts_as_unfinished_with_a_warning(tmp_path, caplog):
    d = _folder(tmp_path, "torn", None)
    (d / "run_info.json").write_text('{"status": "compl')
    assert read_run_info(d) == {} and not is_finished(d)
    assert "run_info.json ignored" in caplog.text
    with pytest.raises(ValueError, match=r"run_info.json: invalid JSON"):
        read_json(d / "run_info.json")
    assert read_json(d / "absent.json", missing_ok=True) is None
    with pytest.raises(FileNotFoundError):
        read_json(d / "absent.json")


def test_a_folder_keyed_before_specs_is_refused_with_the_migration_command(tmp_path):
    run = tmp_path / "sweep" / "run"
    write_run_info(run, {"status": "complete", "config_hash": "h-old"})
    (run / "metrics.json").write_text("{}")
    with pytest.raises(ValueError, match=r"python -m multipos.runs.migrate .*sweep"):
        prepare_run_dir(run, "h-new")


def test_a_refused_configuration_leaves_the_hydra_files_of_the_run_that_is_there(tmp_path):
    """Hydra writes a job's .hydra/ before the job starts; the job that refuses the folder puts the files back."""
    run = tmp_path / "run"
    hydra = run / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text("lr: 1\n")
    (hydra / "overrides.yaml").write_text("- lr=1\n")
    assert prepare_run_dir(run, "h-one") == ({}, False)  # accepted: its files are kept
    write_run_info(run, {"status": "complete", "run_key": "h-one"})
    (run / "metrics.json").write_text("{}")
    (hydra / "config.yaml").write_text("lr: 2\n")  # what Hydra does for the next job in this folder
    (hydra / "overrides.yaml").write_text("- lr=2\n")
    with pytest.raises(ValueError, match="another configuration"):
        prepare_run_dir(run, "h-two")
    assert (hydra / "config.yaml").read_text() == "lr: 1\n" and (hydra / "overrides.yaml").read_text() == "- lr=1\n"
    assert is_finished(run) and prepare_run_dir(run, "h-one")[1]  # the same configuration is still skipped


def test_without_a_kept_copy_the_refusal_says_that_hydra_replaced_the_files(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    write_run_info(run, {"status": "complete", "run_key": "h-one"})
    with pytest.raises(ValueError, match="Hydra has already replaced"):
        prepare_run_dir(run, "h-two")


def test_a_study_removes_the_resume_checkpoints_of_a_finished_run(tiny_beir, tiny_bert, tmp_path):
    """``keep_checkpoints: false`` (conf/scale, every study): once the run is complete its ``*.ckpt`` files go,
    ``model/`` and ``kept.json`` stay, the identical command still skips the run, and the config hash is unchanged
    (``scale`` is not in the spec). A run that is not finished keeps them (they are what it resumes from)."""
    from multipos.runs.folder import remove_checkpoints
    from multipos.runs.spec import run_key
    from multipos.train import train
    from tests.helpers import compose_cfg, tiny_overrides

    out = tmp_path / "run"
    overrides = [*tiny_overrides(tiny_beir, tiny_bert, out), "keep_checkpoints=false"]
    train(compose_cfg("train", overrides))
    assert not list((out / "checkpoints").rglob("*.ckpt"))
    assert (out / "checkpoints" / "stage1" / "kept.json").is_file() and (out / "model").is_dir()
    assert is_finished(out)
    assert train(compose_cfg("train", overrides)) == json.loads((out / "metrics.json").read_text())  # skipped
    assert run_key(compose_cfg("train", overrides)) == run_key(
        compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, out)))
    running = tmp_path / "running"
    (running / "checkpoints").mkdir(parents=True)
    (running / "run_info.json").write_text(json.dumps({"status": "running"}))
    with pytest.raises(ValueError, match="not a finished run"):
        remove_checkpoints(running)


def test_a_run_brought_back_without_its_model_is_finished_but_never_a_reuse_source(tmp_path, monkeypatch):
    """GPU sweeps travel back without checkpoints or models (experiments/sweeps/gpu-h100/, docs/gpu.md): a
    sweep copied from there skips those runs and renders them, and reuse never copies one (it has no model)."""
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    info = {"status": "complete", "run_key": HASH, "equivalence_key": KEY}
    d = _folder(tmp_path / "archived-cpu-gpu", "brought_back", info, metrics=True, model=False)
    assert is_finished(d)
    assert prepare_run_dir(d, HASH)[1] is True  # training skips it
    register(KEY, d)
    assert find_equivalent(KEY, tmp_path / "new_run") is None
    done, not_done = sweep_runs(d.parent)
    assert [r.name for r in done] == ["brought_back"] and not not_done
