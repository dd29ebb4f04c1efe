"""multipos.data.preparation: sources only read; every format gets every step, in one declared order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multipos.data import MultiPosDataModule, StageInputs
from multipos.data.preparation import STEPS, StepSettings
from multipos.data.sources import BeirGradedSource, TevatronSource
from multipos.formats.beir import read_corpus, read_queries
from multipos.formats.trec import read_qrels

QRELS = "qrels-graded/train.s-3.qrel"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MULTIPOS_CACHE", str(folder))
    return folder


@pytest.fixture
def tevatron_twin(tiny_beir, tmp_path) -> Path:
    """The tiny BEIR folder's training queries as a Tevatron file: each query's gold (grade 2) positives first, then
    its silver ones, in the qrels file's order, and no negatives (both sources mine them from the same corpus)."""
    corpus = read_corpus(tiny_beir / "corpus.jsonl")
    texts = read_queries(tiny_beir / "queries.jsonl")
    path = tmp_path / "train.jsonl"
    with path.open("w") as f:
        for qid, docs in read_qrels(tiny_beir / QRELS).items():
            grades = list(docs.values())
            assert grades == sorted(grades, reverse=True) and grades.count(2) == 2  # gold first: gold_positives=2
            passages = [{"docid": d, "title": corpus[d].title, "text": corpus[d].text} for d in docs]
            f.write(json.dumps({"query_id": qid, "query": texts[qid], "positive_passages": passages}) + "\n")
    return path


def _teacher_run(tiny_beir, path: Path) -> Path:
    """A TREC run scoring every training query's positives and three other passages (teacher scores)."""
    ids = read_corpus(tiny_beir / "corpus.jsonl").ids
    lines = []
    for i, (qid, docs) in enumerate(read_qrels(tiny_beir / QRELS).items()):
        for r, d in enumerate([*docs, *ids[i: i + 3]]):
            lines.append(f"{qid} Q0 {d} {r + 1} {(7 * r + 3 * i) % 11 / 4:.2f} t")
    path.write_text("\n".join(lines) + "\n")
    return path


def _view(prepared) -> tuple:
    """Everything the steps decide, query by query, plus their counts and files."""
    queries = [(q.query_id, q.query, q.gold, q.silver, q.negatives, sorted(q.judged), q.weights, q.teacher_scores)
               for q in prepared.queries]
    return queries, [(r.step, r.counts) for r in prepared.reports], prepared.stats(), prepared.files()


STEP_CASES = {
    "teacher_order": {"ordering": "teacher"},
    "label_noise_bm25_every_split": {"label_noise": {"rate": 0.5, "kind": "bm25", "seed": 1, "exclude": "every_split"}},
    "label_noise_random": {"ordering": "teacher", "label_noise": {"rate": 0.34, "kind": "random", "seed": 2}},
    "grade_weights_and_noise": {"grade_weights": {2: 1.0, 1: 0.5}, "label_noise": {"rate": 0.5, "kind": "bm25"}},
    "negative_filter": {"ordering": "teacher", "negative_filter": {"share": 0.9, "reference": "first"}},
    "teacher_scores": {"teacher_scores": "run"},
}


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_a_tevatron_file_gets_every_step_a_beir_folder_gets(tiny_beir, tiny_bert, tevatron_twin, tmp_path, cache,
                                                            case):
    """The same data as a BEIR folder and as a Tevatron file, with the same step settings: the same training
    queries (positive order, negatives, weights, teacher scores, false positives), counts and run-folder files."""
    steps = {"negatives": "bm25", "negative_depth": 6, "teacher": str(tiny_bert), "negative_model": str(tiny_bert),
             **STEP_CASES[case]}
    if steps.get("teacher_scores") == "run":
        steps["teacher_scores"] = {"path": str(_teacher_run(tiny_beir, tmp_path / "teacher.run")), "temperature": 2.0}
    beir = BeirGradedSource(str(tiny_beir), QRELS, **steps)
    tevatron = TevatronSource(str(tevatron_twin), gold_positives=2, negative_corpus=str(tiny_beir / "corpus.jsonl"),
                              **steps)
    assert beir.preparation.names == tevatron.preparation.names
    from_beir, from_tevatron = beir.prepare(), tevatron.prepare()
    assert _view(from_tevatron) == _view(from_beir)
    if "label_noise" in steps:
        record = from_tevatron.files()["label_noise.json"]
        assert record["queries"] and from_tevatron.stats()["label_noise"]["replaced"] > 0
    if case == "teacher_order":
        assert from_beir.counts("teacher_order")["reordered"] > 0  # the random teacher reorders, on either format


def test_the_steps_run_in_one_declared_order_and_each_reports_what_it_did(tiny_beir, tiny_bert, tmp_path, cache):
    assert [step.name for step in STEPS] == ["grade_weights", "negatives", "teacher_order", "negative_filter",
                                             "teacher_scores", "label_noise"]
    source = BeirGradedSource(str(tiny_beir), QRELS, negative_depth=6, ordering="teacher", teacher=str(tiny_bert),
                              negative_model=str(tiny_bert), negative_filter={"margin": 0.5},
                              grade_weights={2: 1.0, 1: 0.25}, label_noise={"rate": 0.5, "kind": "bm25"})
    assert source.preparation.names == ["grade_weights", "negatives", "teacher_order", "negative_filter", "label_noise"]
    prepared = source.prepare()
    assert [r.step for r in prepared.reports] == source.preparation.names
    assert prepared.counts("grade_weights") == {"queries": 5, "positives": 30}
    mined = prepared.counts("negatives")
    assert (mined["kind"], mined["depth"], mined["queries"]) == ("bm25", 6, 5) and mined["negatives"] > 0
    assert list(prepared.stats()) == ["negative_filter", "label_noise"]  # the counts a stage record names
    assert list(prepared.files()) == ["label_noise.json"]
    assert BeirGradedSource(str(tiny_beir), QRELS).preparation.names == ["negatives"]  # BM25, nothing else


def test_tevatron_grade_weights_teacher_order_and_label_noise_reach_the_data_module(tevatron_twin, tiny_bert, cache):
    """A Tevatron file's gold positives have grade 2 and the others 1; the data module records the steps' counts and
    leaves label_noise.json for the run folder, as for a BEIR folder."""
    source = TevatronSource(str(tevatron_twin), gold_positives=1, ordering="teacher", teacher=str(tiny_bert),
                            grade_weights={2: 1.0, 1: 0.5}, label_noise={"rate": 0.5, "kind": "random", "seed": 0})
    dm = MultiPosDataModule(source, str(tiny_bert), regime="all", group_size=8, max_positives=4, batch_size=2)
    dm.set_stage("all", None)
    dm.setup()
    for q in dm.queries:
        assert sorted(q.weights.values()) == [0.5] * 5 + [1.0]  # 1 gold, 5 silver (one of them now false)
    assert dm.stats["label_noise"] == {"queries": 5, "replaced": 15, "positives": 30, "short": 0}
    record = dm.run_files()["label_noise.json"]
    assert record["rate"] == 0.5 and record["kind"] == "random" and len(record["queries"]) == 5
    assert list(dm.stats)[-2:] == ["label_noise", "truncated"]


def test_bad_step_settings_name_the_field_and_the_file(tevatron_twin, tiny_beir):
    with pytest.raises(ValueError, match=r"data\.source\.orderingg: not a setting of TevatronSource .*gold_positives"):
        TevatronSource(str(tevatron_twin), orderingg="teacher")
    with pytest.raises(ValueError, match=r"data.source.ordering=teacher needs data.source.teacher"):
        TevatronSource(str(tevatron_twin), ordering="teacher")
    with pytest.raises(ValueError, match=r"unknown data.source.negatives 'given'; allowed: bm25, dense"):
        BeirGradedSource(str(tiny_beir), QRELS, negatives="given")  # a BEIR folder has no negatives of its own
    with pytest.raises(ValueError, match=rf"{tevatron_twin}: query '.*' has a positive of grade 1, which "
                                         r"data.source.grade_weights \(\{2: 1.0\}\) gives no weight"):
        TevatronSource(str(tevatron_twin), gold_positives=2, grade_weights={2: 1.0}).prepare()
    assert "allowed_negatives" not in StepSettings.names()


def test_the_tokenizer_is_checked_against_the_encoder_the_stage_hands_over(tiny_beir, tiny_bert):
    """The data module checks the tokenizer against :attr:`StageInputs.encoder` (never the trainer's module); the
    model's own inputs (:meth:`StageInputs.of_encoder`) bring its tokenizer and prompts."""
    from types import SimpleNamespace

    from multipos.model.encoder import DualEncoder

    dm = MultiPosDataModule(BeirGradedSource(str(tiny_beir), QRELS, negative_depth=20), str(tiny_bert),
                            group_size=4, max_positives=2, batch_size=2)
    dm.set_stage("heterogeneous", None)
    dm.setup()
    model = DualEncoder(str(tiny_bert), query_prompt="query: ")
    dm.trainer = SimpleNamespace(lightning_module=None, world_size=1, global_rank=0, current_epoch=0)
    too_few = SimpleNamespace(query_encoder=SimpleNamespace(get_input_embeddings=lambda: SimpleNamespace(
        num_embeddings=len(model.tokenizer) - 1)))
    dm.set_inputs(StageInputs(encoder=too_few))
    with pytest.raises(ValueError, match=rf"data.tokenizer={tiny_bert}: the tokenizer has {len(model.tokenizer)} "):
        dm.train_dataloader()
    before = dm.stats["truncated"]
    dm.set_inputs(StageInputs.of_encoder(model, batch_groups=False))
    assert dm.tokenizer is model.tokenizer and dm.query_prompt == "query: "
    assert dm.stats["truncated"]["queries"] >= before["queries"]  # measured again, with the prompt
    assert dm.train_dataloader().collate_fn.keep_groups is False
