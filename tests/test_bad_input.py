"""Bad input, item by item (issue 8): every case fails with a clear error naming the file and line (or the
config field), or, where the input is usable, is counted and logged; nothing already written is lost.

One test per item of the issue's list; the table in the final report maps each item to its test here.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from multipos.assets import AssetNotFoundError
from multipos.data.budget import apply_budget
from multipos.data.datamodule import MultiPosDataModule
from multipos.data.groups import GroupBuilder, TrainQuery
from multipos.data.sources import BeirGradedSource, TevatronSource
from multipos.formats.beir import load_beir, read_corpus, read_queries
from multipos.formats.tevatron import parse_tevatron, read_tevatron
from multipos.formats.trec import read_qrels, read_run
from multipos.formats.types import DataFormatError
from tests.helpers import compose_cfg, tiny_overrides

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tevatron_train.jsonl"
TRAIN_QRELS = "qrels-graded/train.s-3.qrel"


def jsonl(path: Path, rows: list[dict], tail: str = "") -> Path:
    """Write ``rows`` as JSONL, then ``tail`` verbatim (e.g. a truncated last line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail, encoding="utf-8")
    return path


def tevatron_rows() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


@pytest.fixture
def beir_copy(tiny_beir, tmp_path) -> Path:
    """A private copy of the tiny BEIR folder that a test may damage."""
    return Path(shutil.copytree(tiny_beir, tmp_path / "beir"))


def datamodule(folder: Path, tokenizer: Path, **kw) -> MultiPosDataModule:
    source = BeirGradedSource(str(folder), TRAIN_QRELS, negative_depth=kw.pop("negative_depth", 20))
    args = dict(regime="heterogeneous", group_size=4, max_positives=2, batch_size=2)
    return MultiPosDataModule(source, str(tokenizer), **{**args, **kw})


# ---------------------------------------------------------------------------------------------------------
# files: truncation, encoding, empty texts, duplicate and unknown ids, grades
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reader, rows", [
    (read_corpus, [{"_id": "d1", "text": "statins"}]),
    (read_queries, [{"_id": "q1", "text": "cholesterol"}]),
    (read_tevatron, tevatron_rows()[:2]),
])
def test_truncated_jsonl_names_file_and_line(tmp_path, reader, rows):
    path = jsonl(tmp_path / "cut.jsonl", rows, tail='{"_id": "d9", "text": "cut in the mid')  # no newline
    with pytest.raises(DataFormatError) as exc:
        reader(path)
    assert f"{path}:{len(rows) + 1}:" in str(exc.value)
    assert "truncated file" in str(exc.value)


@pytest.mark.parametrize("reader, good, bad", [
    (read_corpus, b'{"_id": "d1", "text": "ok"}\n', b'{"_id": "d2", "text": "caf\xe9"}\n'),
    (read_queries, b'{"_id": "q1", "text": "ok"}\n', b'{"_id": "q2", "text": "\xff\xfe"}\n'),
    (read_qrels, b"q1 0 d1 1\n", b"q\xe92 0 d1 1\n"),
    (read_run, b"q1 Q0 d1 1 2.0 t\n", b"q1 Q0 d\xe92 2 1.0 t\n"),
])
def test_invalid_utf8_names_file_line_and_byte_offset(tmp_path, reader, good, bad):
    path = tmp_path / "bad.txt"
    path.write_bytes(good + bad)
    with pytest.raises(DataFormatError) as exc:
        reader(path)
    offset = len(good) + bad.index(bytes([next(b for b in bad if b >= 0x80)]))
    assert f"{path}:2:" in str(exc.value) and f"byte offset {offset}" in str(exc.value)


def test_empty_query_or_passage_text_names_file_and_line(tmp_path, beir_copy, caplog):
    # an empty corpus passage is kept (the corpus is evaluated as published) and counted in a warning
    corpus = jsonl(tmp_path / "corpus.jsonl", [{"_id": "d1", "text": "a"}, {"_id": "d2", "title": "", "text": " "}])
    with caplog.at_level(logging.WARNING):
        assert len(read_corpus(corpus)) == 2
    assert f"{corpus}: 1 passages with an empty 'text' and no 'title' (first at line 2), kept" in caplog.text
    # a judged query with empty text: training query q-heart-0 (line 1), test query q-heart-1 (line 2)
    queries = [json.loads(line) for line in (beir_copy / "queries.jsonl").read_text().splitlines()]
    assert [q["_id"] for q in queries[:2]] == ["q-heart-0", "q-heart-1"]
    queries[0]["text"] = queries[1]["text"] = "  "
    jsonl(beir_copy / "queries.jsonl", queries)
    with pytest.raises(DataFormatError, match=r"queries\.jsonl:1: query 'q-heart-0' has an empty 'text'"):
        BeirGradedSource(str(beir_copy), TRAIN_QRELS, negative_depth=5).load()
    with pytest.raises(DataFormatError, match=r"queries\.jsonl:2: query 'q-heart-1' has an empty 'text'"):
        load_beir(beir_copy, "test")
    # Tevatron: empty query, passage without text
    for mutate, needle in ((lambda r: r.__setitem__("query", ""), "empty 'query' text"),
                           (lambda r: r["negative_passages"][1].update(title="", text=""), "negative_passages[1]")):
        rows = tevatron_rows()
        mutate(rows[1])
        path = jsonl(tmp_path / "t.jsonl", rows)
        with pytest.raises(DataFormatError, match=rf"{path}:2: .*{needle}".replace("[", r"\[").replace("]", r"\]")):
            read_tevatron(path)


def test_duplicate_ids_name_both_lines(tmp_path):
    corpus = jsonl(tmp_path / "corpus.jsonl", [{"_id": "d1", "text": "a"}, {"_id": "d2", "text": "b"},
                                               {"_id": "d1", "text": "c"}])
    with pytest.raises(DataFormatError, match=rf"{corpus}:3: duplicate passage id 'd1' \(first at line 1\)"):
        read_corpus(corpus)
    queries = jsonl(tmp_path / "queries.jsonl", [{"_id": 7, "text": "a"}, {"_id": "7", "text": "b"}])
    with pytest.raises(DataFormatError, match=rf"{queries}:2: duplicate query id '7' \(first at line 1\)"):
        read_queries(queries)
    rows = tevatron_rows()
    rows.append(dict(rows[0]))
    path = jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataFormatError, match=rf"{path}:{len(rows)}: duplicate query_id '1001' \(first at {path}:1\)"):
        TevatronSource(str(path)).load()


def test_unknown_ids_in_qrels_fail_and_in_runs_are_counted(beir_copy, tiny_beir, tmp_path, caplog):
    from multipos.evaluate import score_run_file
    from multipos.evaluation.sets import EvalSet

    train = beir_copy / TRAIN_QRELS
    with train.open("a") as f:
        f.write("q-heart-0 0 ghost-passage 1\n")
    with pytest.raises(DataFormatError, match=rf"{train}: 1 passage ids not in corpus.jsonl, e.g. \['ghost-passage'\]"):
        BeirGradedSource(str(beir_copy), TRAIN_QRELS, negative_depth=5).load()
    test = beir_copy / "qrels" / "test.tsv"
    test.write_text(test.read_text() + "q-ghost\theart-0\t1\n")
    with pytest.raises(DataFormatError, match=rf"{test}: 1 query ids not in queries.jsonl, e.g. \['q-ghost'\]"):
        load_beir(beir_copy, "test")
    # a run is another system's output: unknown passages and unjudged queries are dropped and counted
    run = tmp_path / "run.trec"
    run.write_text("q-heart-1 Q0 heart-0 1 3.0 x\nq-heart-1 Q0 ghost-1 2 2.0 x\nq-nobody Q0 heart-1 1 1.0 x\n")
    es = EvalSet(name="tiny", path=str(tiny_beir), split="test", metrics=["ndcg@10"])
    with caplog.at_level(logging.WARNING):
        results = score_run_file(str(run), [es])
    assert "dropping 1 passage ids not in the tiny corpus, e.g. ['ghost-1']" in caplog.text
    assert "dropping 1 run queries without qrels, e.g. ['q-nobody']" in caplog.text
    assert 0 < results["tiny"]["ndcg@10"] < 1  # q-heart-1 found one of its passages; the other test queries none


@pytest.mark.parametrize("grade, what", [("1.5", "is not an integer"), ("high", "is not a number")])
def test_non_integer_grade_names_file_and_line(tmp_path, grade, what):
    path = tmp_path / "train.qrel"
    path.write_text(f"q1 0 d1 2\nq1 0 d2 2.0\nq1 0 d3 {grade}\n")
    with pytest.raises(DataFormatError, match=rf"{path}:3: relevance grade '{grade}' {what}"):
        read_qrels(path)


def test_negative_grades_are_judged_non_relevant_with_a_counted_warning(tmp_path, caplog):
    """TREC qrels use -2 (junk) and -1 (pooled, not judged): trec_eval counts them as non-relevant; rejecting
    them would make such collections unreadable."""
    path = tmp_path / "test.qrel"
    path.write_text("q1 0 d1 2\nq1 0 d2 -2\nq1 0 d3 -1\n")
    with caplog.at_level(logging.WARNING):
        qrels = read_qrels(path)
    assert qrels == {"q1": {"d1": 2, "d2": 0, "d3": 0}}
    assert f"{path}: 2 judgments with a negative grade (first at line 2) read as 0" in caplog.text


# ---------------------------------------------------------------------------------------------------------
# training data: zero positives, too few negatives, G and M, empty splits, missing qrels, Tevatron rows
# ---------------------------------------------------------------------------------------------------------

def test_zero_positive_queries_are_counted_and_logged(beir_copy, tiny_bert, caplog):
    with (beir_copy / TRAIN_QRELS).open("a") as f:  # judged, but only as non-relevant
        f.write("q-heart-1 0 heart-7 0\nq-bone-1 0 bone-7 0\n")
    dm = datamodule(beir_copy, tiny_bert)
    with caplog.at_level(logging.WARNING):
        dm.setup()
    assert "2 of 7 training queries have no judgment with grade >= 1" in caplog.text
    assert "regime heterogeneous: skipped 2 of 7 training queries with no positive" in caplog.text
    assert dm.stats["skipped_no_positive"] == 2 and dm.stats["training_queries"] == 5
    assert "q-heart-1" in caplog.text
    # the skipped queries' judged passages are still never negatives of theirs (kept in TrainQuery.judged)
    assert {q.query_id: q.judged for q in dm.queries}["q-heart-1"] == {"heart-7"}


def test_too_few_hard_negatives_are_topped_up_and_logged_or_rejected(tiny_beir, tiny_bert, caplog):
    dm = datamodule(tiny_beir, tiny_bert, negative_depth=1)  # 1 mined negative; G=4, M=2 needs 2
    with caplog.at_level(logging.WARNING):
        dm.setup()
    assert "5 of 5 training queries have fewer mined hard negatives than their group needs" in caplog.text
    assert "random corpus passages fill the rest" in caplog.text and "lacks 1" in caplog.text
    assert dm.stats["topped_up_negatives"] == 5
    batch = next(iter(dm.train_dataloader()))
    assert batch.positive_mask.shape == (2, 8)  # every group still has G passages
    # 40 passages, 6 judged per query: G = 37 cannot be filled even from the whole corpus
    dm = datamodule(tiny_beir, tiny_bert, group_size=37, negative_depth=1)
    with pytest.raises(ValueError, match=r"data.group_size \(G=37\) needs 35 negatives but the corpus has only 34"):
        dm.setup()


@pytest.mark.parametrize("G, M, field", [(1, 1, "data.group_size"), (0, 1, "data.group_size"),
                                         (4, 4, "data.max_positives"), (4, 6, "data.max_positives"),
                                         (4, 0, "data.max_positives")])
def test_group_size_and_max_positives_are_checked_at_construction(tiny_beir, tiny_bert, G, M, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        datamodule(tiny_beir, tiny_bert, group_size=G, max_positives=M)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        GroupBuilder(G, M)


def test_empty_split_is_an_error(beir_copy, tiny_bert):
    (beir_copy / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n")
    with pytest.raises(DataFormatError, match=r"qrels/dev\.tsv: split 'dev' is empty \(no judged query\)"):
        load_beir(beir_copy, "dev")
    # the regime keeps no training query (no gold: grade 3 is never given) → before training starts
    dm = datamodule(beir_copy, tiny_bert, regime="gold")
    dm.source.gold_grade = 3
    with pytest.raises(ValueError, match=r"no training query has a positive under regime 'gold'.*5 queries"):
        dm.steps_per_epoch("gold")
    (beir_copy / TRAIN_QRELS).write_text("")
    with pytest.raises(DataFormatError, match="no training query"):
        BeirGradedSource(str(beir_copy), TRAIN_QRELS).load()
    with pytest.raises(ValueError, match="no training query has >= 5 positives"):
        apply_budget([TrainQuery("q", "t", silver=["a"])], "homogeneous", 1, 1.0, pool_min_positives=5)


def test_beir_folder_without_qrels_names_folder_and_file(beir_copy):
    shutil.rmtree(beir_copy / "qrels")
    with pytest.raises(FileNotFoundError) as exc:
        load_beir(beir_copy, "test")
    assert str(beir_copy / "qrels" / "test.tsv") in str(exc.value) and f"not found in {beir_copy}" in str(exc.value)
    with pytest.raises(FileNotFoundError, match=r"qrels-graded/nope\.qrel: training qrels .*train\.s-3\.qrel"):
        BeirGradedSource(str(beir_copy), "qrels-graded/nope.qrel").load()


@pytest.mark.parametrize("value, needle", [(..., "missing field 'positive_passages'"), (None, "missing field"),
                                           ([], "empty 'positive_passages' list"),
                                           ("d11", "field 'positive_passages' must be a list")])
def test_tevatron_row_missing_positive_passages(tmp_path, value, needle):
    rows = tevatron_rows()
    if value is ...:
        del rows[1]["positive_passages"]
    else:
        rows[1]["positive_passages"] = value
    path = jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataFormatError, match=rf"{path}:2: .*{needle}"):
        TevatronSource(str(path)).load()
    with pytest.raises(DataFormatError, match=rf"ds\[train\] row 4: .*{needle}"):
        parse_tevatron(rows[1], "ds[train] row 4")


def test_a_missing_local_path_is_named_and_never_looked_up_or_downloaded(tmp_path, monkeypatch):
    """A filesystem path (absolute, ./, ../, ~) that does not exist is an error naming the setting, not a hub lookup
    (Tevatron data) or a BEIR download with the path as the dataset name (BEIR folders)."""
    import multipos.assets as assets
    from multipos.assets import AssetNotFoundError, is_local_path, resolve_dataset
    from multipos.data.sources import TevatronSource

    assert is_local_path("/data/x") and is_local_path("./x") and is_local_path("~/x")
    assert not is_local_path("nfcorpus") and not is_local_path("cqadupstack/android")

    def no_download(*args, **kwargs):
        raise AssertionError("a filesystem path was downloaded")

    monkeypatch.setattr(assets, "_download_beir", no_download)
    missing = tmp_path / "nowhere" / "train.jsonl"
    with pytest.raises(FileNotFoundError, match=r"data\.source\.path: .*nowhere/train\.jsonl does not exist"):
        TevatronSource(str(missing)).load()
    with pytest.raises(AssetNotFoundError, match=r"nowhere: does not exist .*BEIR folder"):
        resolve_dataset(str(tmp_path / "nowhere"))
    (tmp_path / "corpus.jsonl").write_text("{}\n")
    with pytest.raises(AssetNotFoundError, match="is a file, not a BEIR folder"):
        resolve_dataset(str(tmp_path / "corpus.jsonl"))


# ---------------------------------------------------------------------------------------------------------
# checkpoints and tokenizers
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("damage, needle", [
    (lambda d: [p.unlink() for p in d.iterdir()], "missing config.json"),
    (lambda d: (d / "model.safetensors").unlink(), "missing model weights"),
    (lambda d: [(d / f).unlink() for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json")],
     "missing tokenizer"),
    (lambda d: (d / "multipos_encoder.json").write_text('{"pooling": '), "multipos_encoder.json: not valid JSON"),
])
def test_checkpoint_dir_that_is_not_a_model(tiny_bert, tmp_path, damage, needle):
    from multipos.model.encoder import DualEncoder

    ckpt = Path(shutil.copytree(tiny_bert, tmp_path / "ckpt"))
    damage(ckpt)
    with pytest.raises((FileNotFoundError, DataFormatError)) as exc:
        DualEncoder(str(ckpt))
    assert str(ckpt) in str(exc.value) and needle in str(exc.value)


def test_untied_checkpoint_without_passage_encoder_and_missing_path(tiny_bert, tmp_path):
    from multipos.model.encoder import DualEncoder

    model = DualEncoder(str(tiny_bert), shared=False)
    model.save_pretrained(tmp_path / "untied")
    shutil.rmtree(tmp_path / "untied" / "passage_encoder")
    with pytest.raises(FileNotFoundError, match=r"untied/passage_encoder is not a model checkpoint: missing config"):
        DualEncoder(str(tmp_path / "untied"))
    with pytest.raises(AssetNotFoundError, match=r"nowhere: checkpoint folder not found \(model.name_or_path"):
        DualEncoder(str(tmp_path / "nowhere"))


def test_tokenizer_larger_than_the_embedding_matrix(tiny_bert, tmp_path):
    from transformers import BertTokenizerFast

    from multipos.model.encoder import DualEncoder

    ckpt = Path(shutil.copytree(tiny_bert, tmp_path / "ckpt"))
    vocab = (ckpt / "vocab.txt").read_text().split() + [f"extra{i}" for i in range(50)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (ckpt / f).unlink(missing_ok=True)
    BertTokenizerFast(str(tmp_path / "vocab.txt")).save_pretrained(ckpt)
    rows = len(vocab) - 50
    with pytest.raises(ValueError, match=rf"{ckpt}: the tokenizer has {len(vocab)} tokens but the model's embedding "
                                         rf"matrix has {rows} rows"):
        DualEncoder(str(ckpt))
    # data.tokenizer pointing at another checkpoint than the trained model: checked when training starts
    from multipos.data import StageInputs

    model = DualEncoder(str(tiny_bert))
    dm = datamodule(tmp_path / "unused", ckpt)
    dm.set_inputs(StageInputs(encoder=model))  # the model the stage trains, without its tokenizer
    with pytest.raises(ValueError, match=rf"data.tokenizer={ckpt}: the tokenizer has {len(vocab)} tokens"):
        dm.train_dataloader()


# ---------------------------------------------------------------------------------------------------------
# configuration names and budgets
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, listed", [("loss=nope", "lsepair_minp_maxn"), ("experiment=nope", "table7_budget"),
                                              ("regime=nope", "curriculum")])
def test_unknown_config_group_choice_lists_the_allowed_ones(override, listed):
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException) as exc:
        compose_cfg("train", [override])
    assert f"Could not find '{override.split('=')[0]}/nope'" in str(exc.value) and listed in str(exc.value)


def test_data_regime_names_the_one_place_the_regime_is_set(tmp_path):
    from multipos.train import train

    with pytest.raises(ValueError, match=r"data.regime=gold: the regime is the stage plan's, set with regime=<name>"):
        train(compose_cfg("train", ["+data.regime=gold", f"paths.output_dir={tmp_path / 'run'}"]))
    assert not (tmp_path / "run").exists()


def test_unknown_objective_or_regime_name_lists_the_allowed_ones(tiny_beir, tiny_bert):
    from multipos.losses import check_name
    from multipos.training.stages import plan

    allowed = r"allowed: jointlh, jointlh_weighted, kl, lsepair"
    with pytest.raises(ValueError, match=r"unknown objective 'nope' \(loss.name\); " + allowed):
        check_name("nope")
    with pytest.raises(ValueError, match=r"stages.main.objective: unknown objective 'nope'.*allowed: jointlh"):
        plan({"main": {"regime": "gold", "objective": "nope", "epochs": 1}})
    with pytest.raises(ValueError, match=r"stages.main.regime='mixed' is not allowed; choose one of: homogeneous, "):
        plan({"main": {"regime": "mixed", "objective": "jointlh", "epochs": 1}})
    with pytest.raises(ValueError, match=r"unknown regime 'mixed'; allowed: homogeneous, heterogeneous"):
        datamodule(tiny_beir, tiny_bert, regime="mixed")
    cfg = compose_cfg("train", ["loss.name=nope"])
    with pytest.raises(ValueError, match=r"allowed: jointlh"):
        plan(cfg.stages)


@pytest.mark.parametrize("budget, match", [
    ({"query_fraction": 0.0}, r"data.budget.query_fraction must be in \(0, 1\], got 0.0"),
    ({"query_fraction": -0.5}, r"query_fraction must be in \(0, 1\], got -0.5"),
    ({"query_fraction": 1.01}, r"query_fraction must be in \(0, 1\], got 1.01"),
    ({"positives_per_query": 0}, r"data.budget.positives_per_query must be >= 1, got 0"),
    ({"fraction": 0.5}, r"data.budget: unknown keys \['fraction'\]"),
])
def test_budget_fraction_outside_unit_interval_and_m_below_one(tiny_beir, tiny_bert, budget, match):
    with pytest.raises(ValueError, match=match):
        datamodule(tiny_beir, tiny_bert, budget=budget)
    if "fraction" not in budget:
        with pytest.raises(ValueError, match=match.replace("data.budget: ", "")):
            apply_budget([TrainQuery("q", "t", silver=["a"])], "homogeneous", budget.get("positives_per_query", 1),
                         budget.get("query_fraction", 1.0))


# ---------------------------------------------------------------------------------------------------------
# nothing already written is lost
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["truncated corpus", "not a model", "empty regime"])
def test_bad_input_fails_before_the_run_directory_is_touched(beir_copy, tiny_bert, tmp_path, case):
    from multipos.train import train

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text('{"keep": 1}')
    extra = []
    if case == "truncated corpus":
        corpus = beir_copy / "corpus.jsonl"
        corpus.write_text(corpus.read_text()[:-30])
    elif case == "not a model":
        (tmp_path / "empty_ckpt").mkdir()
        extra = [f"model.name_or_path={tmp_path / 'empty_ckpt'}", f"data.tokenizer={tiny_bert}"]
    else:
        extra = ["data.source.gold_grade=3", "regime=gold"]
    cfg = compose_cfg("train", tiny_overrides(beir_copy, tiny_bert, out, "eval.references=false", *extra))
    needle = {"truncated corpus": "truncated file", "not a model": "is not a model checkpoint",
              "empty regime": "no training query has a positive under regime 'gold'"}[case]
    with pytest.raises(Exception, match=needle):  # a model error arrives wrapped by Hydra's instantiate
        train(cfg)
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]
    assert (out / "metrics.json").read_text() == '{"keep": 1}'


def test_the_log_says_what_each_regime_keeps_and_drops(tiny_beir, tiny_bert, caplog):
    """Graded qrels under regime=homogeneous: the gold positives are not used, and the log says how many and why."""
    from multipos.data import MultiPosDataModule
    from multipos.data.sources import BeirGradedSource

    source = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=5)
    dm = MultiPosDataModule(source, str(tiny_bert), regime="homogeneous", group_size=4, max_positives=2,
                            batch_size=2)
    with caplog.at_level("INFO", logger="multipos.data.datamodule"):
        dm.setup()
    assert ("regime homogeneous: 5 of 5 training queries, 20 of 10 gold + 20 silver positive labels; "
            "10 positive labels not used (homogeneous keeps silver positives only") in caplog.text


def test_lengths_set_by_hand_log_the_share_they_truncate(tiny_beir, tiny_bert, caplog):
    """Queries of the tiny data are 5-6 tokens with [CLS]/[SEP]: a query length of 4 cuts every one of them."""
    from multipos.data import MultiPosDataModule
    from multipos.data.sources import BeirGradedSource

    source = BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=5)
    dm = MultiPosDataModule(source, str(tiny_bert), regime="all", group_size=4, max_positives=2, batch_size=2,
                            query_max_length=4, passage_max_length=512)
    with caplog.at_level("INFO", logger="multipos.data.datamodule"):
        dm.setup()
    assert dm.stats["truncated"] == {"queries": 1.0, "passages": 0.0}
    assert "query_max_length 4 truncates 100.0% of the training queries" in caplog.text
