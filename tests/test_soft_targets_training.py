"""Soft-target objectives train end to end: grade weights from the qrels reach the loss as a target matrix, with
groups and in-batch negatives (two-tower) and with every corpus passage a candidate (query-side)."""

from __future__ import annotations

import json

import pytest
import torch

from multipos.data.groups import Group, group_targets
from multipos.train import train
from multipos.training import module as module_mod
from tests.helpers import compose_cfg, tiny_overrides

GRADED = ["data.source.qrels_file=qrels-graded/train.s-3.qrel", "regime=all",
          "++data.source.grade_weights={2: 1.0, 1: 0.5}"]


def test_group_targets_put_each_querys_weights_in_its_columns():
    a = Group("qa", "a", ["p1", "p2", "n1"], 2, {"p1", "p2"}, {"p1": 1.0, "p2": 0.5})
    b = Group("qb", "b", ["p2", "n2", "n3"], 1, {"p2"}, {"p2": 1.0})
    t = group_targets([a, b])
    assert t.tolist() == [[1.0, 0.5, 0.0, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="grade_weights"):
        group_targets([Group("qc", "c", ["p"], 1, {"p"})])


@pytest.mark.parametrize("loss,extra", [("kl", ()), ("jointlh_weighted", ()),
                                        ("summarglh_weighted", ("passages=frozen_index", "passages.candidates=corpus")),
                                        ("kl", ("passages=frozen_index", "passages.candidates=corpus"))],
                         ids=["kl-two_tower", "jointlh_weighted-two_tower", "summarglh_weighted-corpus", "kl-corpus"])
def test_a_soft_target_objective_trains_on_grade_weights(tiny_beir, tiny_bert, tmp_path, monkeypatch, loss, extra):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    seen = []
    real = module_mod.RetrieverModule.training_step

    def spy(self, batch, batch_idx):
        out = real(self, batch, batch_idx)
        seen.append((self.soft_targets, batch.groups[0].weights))
        return out

    monkeypatch.setattr(module_mod.RetrieverModule, "training_step", spy)
    out = tmp_path / "run"
    cfg = compose_cfg("train", [*extra, *tiny_overrides(tiny_beir, tiny_bert, out, f"loss={loss}", *GRADED)])
    train(cfg)
    assert seen and all(soft for soft, _ in seen)
    assert set(seen[0][1].values()) <= {1.0, 0.5} and 1.0 in seen[0][1].values()
    assert json.loads((out / "run_info.json").read_text())["status"] == "complete"
    assert torch.isfinite(torch.tensor(json.loads((out / "metrics.json").read_text())["tiny_test"]["ndcg@10"]))


def test_a_soft_target_objective_without_weights_names_the_setting(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path / "run", "loss=kl"))
    with pytest.raises(ValueError, match="grade_weights"):
        train(cfg)


def test_a_grade_without_a_weight_is_refused(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path / "run", "loss=kl", *GRADED[:2],
                                              "++data.source.grade_weights={2: 1.0}"))
    with pytest.raises(ValueError, match=r"grade 1, which data.source.grade_weights"):
        train(cfg)


def test_grade_weights_change_no_hard_objectives_run_so_the_study_reuses_them():
    """experiment=soft_targets's paper-objective cells have the equivalence key of query_side_objectives's cells
    (the weights are read by soft-target objectives only); its soft cells differ from each other."""
    from multipos.runs.spec import run_spec

    def key(experiment, loss, extra=()):
        cfg = compose_cfg("train", [f"experiment={experiment}", f"loss={loss}", "seed=42", "paths.output_dir=o",
                                    *extra])
        return run_spec(cfg).equivalence_key()

    for loss in ("jointlh", "lsepair", "summarglh"):
        assert key("soft_targets", loss) == key("query_side_objectives", loss, ["recipe=top1"])
    assert len({key("soft_targets", loss) for loss in ("kl", "jointlh_weighted", "summarglh_weighted")}) == 3
    assert key("soft_targets", "kl") != key("soft_targets", "kl", ["data.source.grade_weights={2: 1.0, 1: 0.25}"])


@pytest.mark.parametrize("loss,extra", [("margin_mse", ()),
                                        ("kl", ("passages=frozen_index", "passages.candidates=corpus"))],
                         ids=["margin_mse-two_tower", "kl-corpus"])
def test_a_teacher_score_file_trains_the_soft_objectives(tiny_beir, tiny_bert, tmp_path, monkeypatch, loss, extra):
    """A TREC run over every training pair of the tiny data (a stand-in teacher: a score per topic word overlap)."""
    from multipos.formats.trec import read_qrels

    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    qrels = read_qrels(tiny_beir / "qrels-graded" / "train.s-3.qrel")
    corpus = [json.loads(x)["_id"] for x in (tiny_beir / "corpus.jsonl").read_text().splitlines()]
    lines = [f"{q} Q0 {p} {r + 1} {docs.get(p, 0) * 1.5 - r * 0.01:.4f} teacher"
             for q, docs in qrels.items() for r, p in enumerate(corpus)]
    (tmp_path / "teacher.trec").write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    teacher = f"++data.source.teacher_scores={{path: '{tmp_path}/teacher.trec', temperature: 0.5}}"
    cfg = compose_cfg("train", [*extra, *tiny_overrides(tiny_beir, tiny_bert, out, f"loss={loss}", *GRADED[:2],
                                                        teacher)])
    train(cfg)
    info = json.loads((out / "run_info.json").read_text())
    assert info["status"] == "complete" and info["stage_records"][0]["teacher_scores"]["scored_queries"] == 5
