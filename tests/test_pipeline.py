"""The main job end to end on the tiny fixtures (tiny random BERT, tiny graded BEIR folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModel

from multipos.runs.spec import run_spec
from multipos.train import train
from tests.helpers import compose_cfg, tiny_overrides, trainer_overrides

METRICS = {"ndcg@10", "mrr@10", "recall@100", "recall@1000"}


@pytest.mark.parametrize("loss,regime", [("lsepair", "heterogeneous"), ("rand1lh", "homogeneous"),
                                         ("jointlh", "curriculum")])
def test_train_writes_metrics_runs_and_hf_model(tiny_beir, tiny_bert, tmp_path, loss, regime):
    out = tmp_path / "run"
    cfg = compose_cfg("train", [f"loss={loss}", f"regime={regime}",
                                *tiny_overrides(tiny_beir, tiny_bert, out)])
    results = train(cfg)

    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"tiny_dev", "tiny_test"}
    assert METRICS <= set(metrics["tiny_test"])
    assert all(0.0 <= v <= 1.0 for v in metrics["tiny_test"].values())
    assert metrics == json.loads(json.dumps(results))
    refs = json.loads((out / "references.json").read_text())
    assert set(refs) == {"bm25", "zero-shot"} and "tiny_test" in refs["bm25"]
    run_lines = (out / "run.tiny_test.trec").read_text().splitlines()
    assert run_lines and all(len(line.split()) == 6 for line in run_lines)
    AutoModel.from_pretrained(out / "model")  # HF format
    # the CSV logger recorded the training loss per step (one log per stage for the curriculum)
    logs = sorted((out / "csv").rglob("metrics.csv"))
    assert len(logs) == (2 if regime == "curriculum" else 1)
    for log_file in logs:
        text = log_file.read_text()
        assert "train/loss" in text and "val/ndcg@10" in text
    info = json.loads((out / "run_info.json").read_text())
    assert info["status"] == "complete" and info["wall_s"] > 0
    assert [r["objective"] for r in info["stage_records"]] == ([loss, "singlelh"] if regime == "curriculum" else [loss])
    assert all(r["training_queries"] > 0 and r["positive_labels"] >= r["training_queries"]
               for r in info["stage_records"])
    if regime == "curriculum":
        assert (out / "checkpoints" / "stage2" / "kept.json").is_file()
        assert [r["regime"] for r in info["stage_records"]] == ["homogeneous", "gold"]


def evaluate_overrides(tiny_beir, tiny_bert, out, *extra: str) -> list[str]:
    """The overrides of :func:`tiny_overrides` that ``conf/evaluate.yaml`` knows (encoder, eval sets, run folder)."""
    return [o for o in tiny_overrides(tiny_beir, tiny_bert, out, *extra) if o.startswith(("model.", "eval", "paths."))]


def test_evaluate_job_scores_a_trained_model_and_skips_it_when_finished(tiny_beir, tiny_bert, tmp_path):
    """evaluate.py with init_from (Table 3's cells): the trained model's metrics come back unchanged, the zero-shot
    row is the starting encoder (model.name_or_path), nothing is trained, and the finished cell is skipped when run
    again; its spec is an evaluation spec (no seed, no training sections)."""
    from multipos.evaluate import evaluate

    first = tmp_path / "trained"
    train(compose_cfg("train", ["loss=lsepair", *tiny_overrides(tiny_beir, tiny_bert, first)]))
    out = tmp_path / "evaluated"
    cfg = compose_cfg("evaluate", [f"init_from={first / 'model'}", "eval.references=true",
                                   *evaluate_overrides(tiny_beir, tiny_bert, out)])
    results = evaluate(cfg)
    trained = json.loads((first / "metrics.json").read_text())
    for name in ("tiny_dev", "tiny_test"):
        assert results[name] == pytest.approx(trained[name], abs=1e-6)
    refs, first_refs = (json.loads((d / "references.json").read_text()) for d in (out, first))
    for name in ("tiny_dev", "tiny_test"):
        assert refs["zero-shot"][name] == pytest.approx(first_refs["zero-shot"][name])
    assert not (out / "checkpoints").exists() and not (out / "model").exists()
    info, spec = (json.loads((out / f).read_text()) for f in ("run_info.json", "spec.json"))
    assert info["status"] == "complete" and info["run_key"] == run_spec(cfg).key()
    assert spec["stages"] == [] and spec["seed"] is None and spec["init_from"] == str(first / "model")
    (out / "per_query.tiny_test.json").unlink()  # a finished cell is not evaluated again
    assert evaluate(cfg) == json.loads((out / "metrics.json").read_text())
    assert not (out / "per_query.tiny_test.json").exists()


def test_train_refuses_a_plan_that_trains_nothing(tiny_beir, tiny_bert, tmp_path):
    out = tmp_path / "run"
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, out, "trainer.max_epochs=0"))
    with pytest.raises(ValueError, match="nothing to train.*python evaluate.py init_from="):
        train(cfg)
    assert not out.exists()


def test_missing_init_from_names_the_key_before_writing(tiny_beir, tiny_bert, tmp_path):
    out = tmp_path / "run"
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, out,
                                              f"++init_from={tmp_path / 'nowhere' / 'model'}"))
    with pytest.raises(FileNotFoundError, match="init_from=.*nowhere"):
        train(cfg)
    assert not out.exists()


def test_a_stage_that_keeps_its_last_weights_runs_no_dev_retrieval(tiny_beir, tiny_bert, tmp_path):
    """keep=last (Table 5's one-epoch silver stage at CPU scale): nothing to select, so no dev retrieval in that
    stage; the next stage still validates and the final evaluation still scores dev."""
    out = tmp_path / "run"
    train(compose_cfg("train", ["loss=jointlh", "data=nfcorpus", "regime=curriculum", "++stages.silver.keep=last",
                                *tiny_overrides(tiny_beir, tiny_bert, out)]))
    silver, gold = (json.loads((out / "checkpoints" / s / "kept.json").read_text()) for s in ("stage1", "stage2"))
    assert silver["record"]["best_dev"] is None and silver["checkpoint"].endswith("last.ckpt")
    assert gold["record"]["best_dev"] is not None
    logs = {p.parent.name: p.read_text() for p in (out / "csv").rglob("metrics.csv")}
    assert "val/ndcg@10" not in logs["stage1"] and "val/ndcg@10" in logs["stage2"]
    assert "tiny_dev" in json.loads((out / "metrics.json").read_text())


def test_invalid_group_size_fails_before_writing(tiny_beir, tiny_bert, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text('{"keep": 1}')
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, out, "data.group_size=1"))
    with pytest.raises(Exception, match="group_size"):
        train(cfg)
    assert (out / "metrics.json").read_text() == '{"keep": 1}'


def test_m_larger_than_g_is_rejected(tiny_beir, tiny_bert, tmp_path):
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path / "r", "data.max_positives=9"))
    with pytest.raises(Exception, match="max_positives"):
        train(cfg)


def test_unknown_objective_lists_choices(tiny_beir, tiny_bert, tmp_path):
    with pytest.raises(Exception, match="lsepair"):
        cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path / "r", "loss=nope"))
        train(cfg)
    cfg = compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, tmp_path / "r", "loss.name=nope"))
    with pytest.raises(Exception, match="allowed"):
        train(cfg)


def test_paper_scale_msmarco_config_on_tevatron_fixture(tiny_beir, tiny_bert, tmp_path):
    """data=msmarco_hetero reads the Tevatron JSONL schema (here a small fixture in that schema)."""
    fixture = Path(__file__).parent / "fixtures" / "tevatron_train.jsonl"
    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny_beir, tiny_bert, out) if not o.startswith("data.source.")]
    cfg = compose_cfg("train", ["data=msmarco_hetero", *overrides, f"data.source.path={fixture}",
                                "eval.references=false"])
    assert cfg.data.source.gold_positives == 1 and cfg.stages.main.regime == "heterogeneous"
    train(cfg)
    assert (out / "metrics.json").is_file()


def _documented_command(marker: str) -> list[str]:
    """The overrides of a command in docs/training.md: the bash block after ``<!-- <marker> command:``."""
    import shlex

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    block = text.split(f"<!-- {marker} command:", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:2] == ["python", "train.py"], words
    return words[2:]


@pytest.mark.parametrize("marker,extra", [("own-data", ()), ("own-data", ("scale=cpu_query_side",)),
                                          ("own-data", ("data=msmarco_hetero", "regime=heterogeneous")),
                                          ("own-beir", ())],
                         ids=["two_tower", "query_side", "heterogeneous", "beir_folder"])
def test_the_own_data_command_of_the_docs_runs(tiny_beir, tiny_bert, tmp_path, monkeypatch, marker, extra):
    """docs/training.md's "Training on your own data" commands, their paths pointed at a Tevatron JSONL fixture and
    the tiny BEIR folder (graded train qrels), on the tiny model for one epoch: each trains and evaluates on the BEIR
    folder."""
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    fixture = Path(__file__).parent / "fixtures" / "tevatron_train.jsonl"
    command = [o.replace("/data/train.jsonl", str(fixture)).replace("/data/my_beir_folder", str(tiny_beir))
               for o in _documented_command(marker)]
    assert any(o.startswith("data.source.path=") for o in command) and "eval=beir" in command
    out = tmp_path / "run"
    cfg = compose_cfg("train", [*command, *extra, f"paths.output_dir={out}", f"model.name_or_path={tiny_bert}",
                                *trainer_overrides(), "trainer.max_epochs=1", "trainer.enable_progress_bar=false",
                                "data.batch_size=2", "eval.bf16=false", "eval.k=20", "eval.references=false"])
    assert cfg.passages.frozen == ("scale=cpu_query_side" in extra)
    assert cfg.stages.main.regime == ("heterogeneous" if "data=msmarco_hetero" in extra or marker == "own-beir"
                                      else "homogeneous")
    train(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics) == [tiny_beir.name] and 0 <= metrics[tiny_beir.name]["ndcg@10"] <= 1  # one folder, no average
    assert json.loads((out / "run_info.json").read_text())["status"] == "complete"


def test_bert_base_config_is_the_papers_encoder():
    cfg = compose_cfg("train", ["model=bert_base"])
    assert cfg.model.name_or_path == "bert-base-uncased"
    assert cfg.model.pooling == "cls" and cfg.model.normalize is False and cfg.model.temperature == 1.0


def test_evaluate_entry_point_scores_any_checkpoint(tiny_beir, tiny_bert, tmp_path):
    from multipos.evaluate import evaluate

    out = tmp_path / "eval"
    cfg = compose_cfg("evaluate", [f"model.name_or_path={tiny_bert}", "eval=nfcorpus_test", f"paths.output_dir={out}",
                                   f"eval.test_sets.nfcorpus_test.path={tiny_beir}", "eval.bf16=false", "eval.k=20",
                                   "eval.references=true"])
    results = evaluate(cfg)
    written = json.loads((out / "metrics.json").read_text())
    assert written == json.loads(json.dumps(results)) and set(written) == {"nfcorpus_test"}
    assert (out / "run.nfcorpus_test.trec").is_file()


def test_evaluate_any_beir_folder(tiny_beir, tiny_bert, tmp_path):
    from multipos.evaluate import evaluate

    out = tmp_path / "eval"
    cfg = compose_cfg("evaluate", [f"model.name_or_path={tiny_bert}", "eval=beir", f"eval.paths=[{tiny_beir}]",
                                   "eval.split=dev", f"paths.output_dir={out}", "eval.bf16=false", "eval.k=20"])
    evaluate(cfg)
    written = json.loads((out / "metrics.json").read_text())
    assert list(written) == [tiny_beir.name]
    assert "ndcg@10" in next(iter(written.values()))


def test_missing_split_names_the_split(tiny_beir, tiny_bert, tmp_path):
    from multipos.evaluate import evaluate

    cfg = compose_cfg("evaluate", [f"model.name_or_path={tiny_bert}", "eval=beir", f"eval.paths=[{tiny_beir}]",
                                   "eval.split=validation", f"paths.output_dir={tmp_path / 'e'}"])
    with pytest.raises(FileNotFoundError, match="validation"):
        evaluate(cfg)


def test_evaluate_scores_an_existing_run_file(tiny_beir, tmp_path):
    from multipos.evaluate import evaluate

    run = tmp_path / "bm25.trec"
    run.write_text("q-heart-1 Q0 heart-0 1 2.0 t\nq-heart-1 Q0 nope-9 2 1.0 t\nq-diet-1 Q0 heart-1 1 1.0 t\n")
    out = tmp_path / "eval"
    cfg = compose_cfg("evaluate", ["eval=beir", f"eval.paths=[{tiny_beir}]", "eval.metrics=[mrr@10]", f"run_file={run}",
                                   f"paths.output_dir={out}"])
    results = evaluate(cfg)[tiny_beir.name]
    # test queries: q-heart-1, q-diet-1, q-bone-1 (see conftest); only q-heart-1 has a hit, at rank 1
    assert results["mrr@10"] == pytest.approx(1 / 3)
