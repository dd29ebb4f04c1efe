"""Equivalent runs (multipos.runs.reuse): SingleLH / Rand1LH cells that differ only in M or the positive
selection train the same model (checked by training both), a study reuses the finished one instead of training
again, and nothing is reused when it must not be."""

from __future__ import annotations

import json
import shutil

import pytest

from multipos import atomic
from multipos.runs.reuse import adopt, find_equivalent, link_or_copy
from multipos.runs.spec import run_key, run_spec
from tests.helpers import compose_cfg, tiny_overrides


def _cfg(tiny_beir, tiny_bert, out, *extra):
    return compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, out, "data=nfcorpus", "regime=homogeneous",
                                               "seed=917", *extra))


def _key(cfg) -> str:
    return run_spec(cfg).equivalence_key()


@pytest.mark.parametrize("loss", ["singlelh", "rand1lh"])
def test_single_positive_objectives_ignore_m_and_positive_selection(tiny_beir, tiny_bert, tmp_path, loss):
    a = _cfg(tiny_beir, tiny_bert, tmp_path / "a", f"loss={loss}", "data.max_positives=2")
    b = _cfg(tiny_beir, tiny_bert, tmp_path / "b", f"loss={loss}", "data.max_positives=3",
             "data.positive_selection=random")
    assert run_key(a) != run_key(b)  # the run directories stay apart
    assert _key(a) == _key(b)
    other_g = _cfg(tiny_beir, tiny_bert, tmp_path, f"loss={loss}", "data.group_size=5")
    assert _key(a) != _key(other_g)  # G changes the groups


def test_the_data_name_is_a_label(tiny_beir, tiny_bert, tmp_path):
    """``data.name`` is a label: it is not in the spec, so one run key and one equivalence key (a study reuses the
    other's run). The regime itself still changes the key."""
    named = _cfg(tiny_beir, tiny_bert, tmp_path, "loss=lsepair", "data.name=my_nfcorpus")
    plain = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path, "data=nfcorpus",
                                                "regime=homogeneous", "seed=917", "loss=lsepair"))
    assert (named.data.name, plain.data.name) == ("my_nfcorpus", "nfcorpus")
    assert run_key(named) == run_key(plain)
    assert _key(named) == _key(plain)
    assert _key(plain) != _key(compose_cfg("train", tiny_overrides(
        tiny_beir, tiny_bert, tmp_path, "data=nfcorpus", "regime=all", "seed=917", "loss=lsepair")))


@pytest.mark.parametrize("loss", ["jointlh", "summarglh", "lsepair"])
def test_multi_positive_objectives_depend_on_m(tiny_beir, tiny_bert, tmp_path, loss):
    a = _cfg(tiny_beir, tiny_bert, tmp_path, f"loss={loss}", "data.max_positives=2")
    b = _cfg(tiny_beir, tiny_bert, tmp_path, f"loss={loss}", "data.max_positives=3")
    c = _cfg(tiny_beir, tiny_bert, tmp_path, f"loss={loss}", "data.positive_selection=random")
    assert len({_key(a), _key(b), _key(c)}) == 3


def test_curriculum_with_a_multi_positive_stage_depends_on_m(tiny_beir, tiny_bert, tmp_path):
    a = _cfg(tiny_beir, tiny_bert, tmp_path, "loss=lsepair", "regime=curriculum", "data.max_positives=2")
    b = _cfg(tiny_beir, tiny_bert, tmp_path, "loss=lsepair", "regime=curriculum", "data.max_positives=3")
    assert _key(a) != _key(b)


def test_a_stage_field_left_out_null_or_at_its_default_is_one_key(tiny_beir, tiny_bert, tmp_path):
    base = _key(_cfg(tiny_beir, tiny_bert, tmp_path, "loss=lsepair"))
    for field, value in (("keep", "best"), ("keep", "null"), ("optimizer", "fresh"), ("lr_schedule", "restart"),
                         ("lr", "null")):
        assert _key(_cfg(tiny_beir, tiny_bert, tmp_path, "loss=lsepair", f"+stages.main.{field}={value}")) == base
    for field, value in (("keep", "last"), ("optimizer", "carry"), ("lr", "1e-4")):
        assert _key(_cfg(tiny_beir, tiny_bert, tmp_path, "loss=lsepair", f"+stages.main.{field}={value}")) != base


@pytest.mark.parametrize("loss", ["singlelh", "jointlh"])
def test_the_query_side_figure_cell_at_table_2s_group_is_table_2s_model(tmp_path, loss):
    """Table 2 leaves ``keep`` out, the figure writes ``keep: best``: under scale=cpu_query_side both keep the
    best dev checkpoint of the same training, so the figure's G=8, M=4 cells copy Table 2's runs."""
    def key(*overrides):
        return _key(compose_cfg("train", [*overrides, "scale=cpu_query_side", f"loss={loss}", "seed=42",
                                          f"paths.output_dir={tmp_path}"]))
    table2 = key("experiment=table2_homogeneous")
    assert key("experiment=figure_ratio_ablation", "ratio=g8_m4") == table2
    assert key("experiment=figure_ratio_ablation", "ratio=g16_m4") != table2


def test_a_study_copies_the_equivalent_finished_run_and_the_copy_equals_training(tiny_beir, tiny_bert, tmp_path):
    from multipos.report.render import provenance
    from multipos.report.runs import load_run
    from multipos.train import train

    first = tmp_path / "sweep" / "ratio-m2"
    expected = train(_cfg(tiny_beir, tiny_bert, first, "loss=singlelh", "data.max_positives=2"))
    info = json.loads((first / "run_info.json").read_text())
    assert info["status"] == "complete" and info["equivalence_key"] and "reused_from" not in info

    # the M=3 cell of the same study: nothing is trained, the results and model are copies of the M=2 run
    copied = tmp_path / "sweep" / "ratio-m3"
    metrics = train(_cfg(tiny_beir, tiny_bert, copied, "loss=singlelh", "data.max_positives=3",
                         "reuse_equivalent=true"))
    assert metrics == expected
    info = json.loads((copied / "run_info.json").read_text())
    assert info["status"] == "complete" and info["reused_from"] == str(first.resolve())
    assert info["equivalence_key"] == json.loads((first / "run_info.json").read_text())["equivalence_key"]
    assert not (copied / "checkpoints").exists()  # not trained
    assert ((copied / "model" / "model.safetensors").read_bytes()
            == (first / "model" / "model.safetensors").read_bytes())
    assert (sorted(p.name for p in copied.glob("per_query.*.json"))
            == sorted(p.name for p in first.glob("per_query.*.json")))
    assert "copied from the equivalent finished run" in (copied / "results.txt").read_text()

    # the claim behind the copy: training the M=3 cell gives the same model (bitwise, CPU fp32)
    trained = tmp_path / "trained" / "ratio-m3"
    assert train(_cfg(tiny_beir, tiny_bert, trained, "loss=singlelh", "data.max_positives=3")) == expected
    assert ((trained / "model" / "model.safetensors").read_bytes()
            == (first / "model" / "model.safetensors").read_bytes())

    runs = [load_run(first), load_run(copied)]
    line = provenance(tmp_path / "sweep", runs,
                      [json.loads((d / "run_info.json").read_text()) for d in (first, copied)])
    assert "1 of them copied from an equivalent finished run" in line
    assert "per trained run" in line


def test_nothing_is_reused_without_the_flag_with_resume_false_or_from_a_removed_run(tiny_beir, tiny_bert, tmp_path):
    from multipos.train import train

    first = tmp_path / "a"
    train(_cfg(tiny_beir, tiny_bert, first, "loss=rand1lh"))
    key = _key(_cfg(tiny_beir, tiny_bert, first, "loss=rand1lh"))
    assert find_equivalent(key, first) is None  # itself does not count
    assert find_equivalent(key, tmp_path / "b") == first.resolve()

    off = tmp_path / "off"  # default: reuse_equivalent=false trains
    train(_cfg(tiny_beir, tiny_bert, off, "loss=rand1lh", "data.max_positives=3"))
    assert (off / "checkpoints").is_dir() and "reused_from" not in json.loads((off / "run_info.json").read_text())

    again = tmp_path / "again"  # resume=false asks for training from scratch
    train(_cfg(tiny_beir, tiny_bert, again, "loss=rand1lh", "reuse_equivalent=true", "resume=false"))
    assert "reused_from" not in json.loads((again / "run_info.json").read_text())

    for d in (first, off, again):
        shutil.rmtree(d)
    gone = tmp_path / "gone"  # the index names removed runs only: train
    train(_cfg(tiny_beir, tiny_bert, gone, "loss=rand1lh", "reuse_equivalent=true"))
    assert "reused_from" not in json.loads((gone / "run_info.json").read_text())


def test_a_skipped_finished_run_from_before_the_key_is_indexed(tiny_beir, tiny_bert, tmp_path):
    from multipos.train import train

    old = tmp_path / "old"
    cfg = _cfg(tiny_beir, tiny_bert, old, "loss=singlelh", "data.group_size=5")
    train(cfg)
    info = json.loads((old / "run_info.json").read_text())
    key = info.pop("equivalence_key")
    (old / "run_info.json").write_text(json.dumps(info))  # as written before equivalence keys existed
    assert find_equivalent(key, tmp_path / "new") is None  # its index entry is not trusted without the key
    train(cfg)  # skipped as finished, and the key is added
    assert json.loads((old / "run_info.json").read_text())["equivalence_key"] == key
    assert find_equivalent(key, tmp_path / "new") == old.resolve()


def test_adopt_links_the_files_and_a_later_rewrite_of_either_run_leaves_the_other_as_it_was(tmp_path):
    """A copied cell costs no disk (its files are hard links to the source's), and since every writer replaces a
    file instead of writing into it, re-writing the source (a ``resume=false`` re-run) leaves the copy's results."""
    source = tmp_path / "source"
    (source / "model" / "query_encoder").mkdir(parents=True)
    atomic.write_json(source / "metrics.json", {"nfcorpus_test": {"ndcg@10": 0.33}})
    atomic.write_json(source / "per_query.nfcorpus_test.json", {"ndcg@10": {"q1": 0.33}})
    (source / "model" / "query_encoder" / "model.safetensors").write_bytes(b"weights")
    copy = tmp_path / "copy"
    assert adopt(source, copy, {"equivalence_key": "k"}) == {"nfcorpus_test": {"ndcg@10": 0.33}}
    for rel in ("metrics.json", "per_query.nfcorpus_test.json", "model/query_encoder/model.safetensors"):
        assert (copy / rel).stat().st_ino == (source / rel).stat().st_ino, rel  # one file on disk
    assert json.loads((copy / "run_info.json").read_text())["reused_from"] == str(source.resolve())
    atomic.write_json(source / "metrics.json", {"nfcorpus_test": {"ndcg@10": 0.1}})
    with atomic.replace_dir(source / "model") as tmp:
        (tmp / "model.safetensors").write_bytes(b"other")
    assert json.loads((copy / "metrics.json").read_text()) == {"nfcorpus_test": {"ndcg@10": 0.33}}
    assert (copy / "model" / "query_encoder" / "model.safetensors").read_bytes() == b"weights"


def test_link_or_copy_copies_where_a_hard_link_cannot_be_made(tmp_path, monkeypatch):
    (tmp_path / "a").write_text("x")
    (tmp_path / "b").write_text("old")

    def no_link(*args):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr("multipos.runs.reuse.os.link", no_link)
    link_or_copy(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "b").read_text() == "x" and (tmp_path / "b").stat().st_ino != (tmp_path / "a").stat().st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temporary file left
