"""multipos.runs.speed: this machine's rates from a few timed batches, and a job's wall time predicted from them."""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import pytest

from multipos.runs.speed import Corpus, Job, Speed, _padded_tokens, corpus_rate, job_from_config, measure, predict


def _job(model, seeds=2, epochs=3) -> Job:
    texts = tuple(f"passage {i} about statins and cancer risk" for i in range(40))
    return Job(model=str(model), corpora=(Corpus("a", texts, 32), Corpus("b", texts[:20], 16)), train_queries=10,
               batch_size=4, query_max_length=8, epochs=epochs, seeds=seeds, dev_queries=6, test_queries=5,
               encode_batch_size=8, queries=("statins cancer", "diet risk"))


def test_predict_scales_the_measured_rates_by_the_jobs_counts(tiny_bert):
    job = _job(tiny_bert)
    rates = Speed(passages_per_s={"a": 10.0, "b": 4.0}, step_s=0.5, queries_per_s=2.0, precision="fp32",
                  measured_at="now", measuring_s=1.0)
    out = predict(job, rates)
    assert out["encode"] == pytest.approx(40 / 10 + 20 / 4)
    assert out["train"] == pytest.approx(2 * 3 * math.ceil(10 / 4) * 0.5)
    assert out["evaluate"] == pytest.approx(2 * (3 * 6 + 5) / 2.0)
    assert out["total"] == pytest.approx(out["encode"] + out["train"] + out["evaluate"])
    assert predict(job, rates, cached_corpora=frozenset({"a", "b"}))["encode"] == 0


def test_side_by_side_seeds_run_at_the_one_thread_step_shared_among_the_cores(tiny_bert):
    job = replace(_job(tiny_bert, seeds=3), side_by_side=3)
    rates = Speed(passages_per_s={"a": 10.0, "b": 4.0}, step_s=0.5, queries_per_s=2.0, precision="fp32",
                  measured_at="now", measuring_s=1.0, step_1thread_s=0.6, cores=2)
    per_seed = 3 * math.ceil(10 / 4)
    assert predict(job, rates)["train"] == pytest.approx(per_seed * 0.6 * 3 / 2)  # three runs on two cores
    assert predict(replace(job, side_by_side=2), rates)["train"] == pytest.approx(2 * per_seed * 0.6)  # 2 rounds
    assert predict(replace(job, side_by_side=1), rates)["train"] == pytest.approx(3 * per_seed * 0.5)
    gpu = Speed(**{**asdict(rates), "step_1thread_s": None})  # no one-thread step measured: one after another
    assert predict(job, gpu)["train"] == pytest.approx(3 * per_seed * 0.5)


def test_a_corpus_rate_counts_the_positions_of_its_length_sorted_batches(tiny_bert):
    from multipos.model.encoder import DualEncoder

    model = DualEncoder(str(tiny_bert))
    short, long_ = "statins", " ".join(["statins and cancer risk"] * 12)
    sample = [short, long_] * 4  # half of the sample long, a tenth of the corpus
    corpus = Corpus("c", tuple([short] * 80 + [long_] * 8), 64)
    lengths = [int(n) for n in model.tokenize(sample, max_length=64)["attention_mask"].sum(1)]
    assert _padded_tokens(lengths, 4) == 4 * max(lengths) + 4 * min(lengths)  # longest first, batches of 4
    assert _padded_tokens([3, 50, 3, 3], 2) == 2 * 50 + 2 * 3
    rate = corpus_rate(model, corpus, sample, seconds=1.0, batch_size=4)
    positions = 2 * 4 * max(lengths) + 20 * 4 * min(lengths)  # the corpus's sorted batches
    assert rate == pytest.approx(len(corpus.texts) / (positions / _padded_tokens(lengths, 4)), rel=0.1)
    assert rate > 2 * len(sample) / 1.0  # the sample's own rate would say 8 passages/s


def test_measure_times_every_corpus_and_a_step_then_reads_the_measurement_back(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path))
    job = _job(tiny_bert)
    first = measure(job, bf16=False, sample=16, steps=2)
    assert set(first.passages_per_s) == {"a", "b"} and all(v > 0 for v in first.passages_per_s.values())
    assert first.step_s > 0 and first.queries_per_s > 0 and first.precision == "fp32" and not first.cached
    assert first.step_1thread_s > 0 and first.cores >= 1
    again = measure(job, bf16=False, sample=16, steps=2)
    assert again.cached and again == first  # the cached measurement, not a new one
    other = measure(_job(tiny_bert, seeds=5), bf16=False, sample=16, steps=2)
    assert other.cached  # seeds and epochs change the prediction, not the rates
    (next((tmp_path / "speed").glob("*.json"))).write_text("not json")
    assert not measure(job, bf16=False, sample=16, steps=2).cached  # a damaged file is measured again


def test_a_composed_config_gives_the_jobs_corpora_and_queries(tiny_beir, tiny_bert):
    from multipos.config_resolvers import compose_train

    cfg = compose_train(["experiment=own_data", f"data_path={tiny_beir}", f"model.name_or_path={tiny_bert}"])
    job = job_from_config(cfg, seeds=3)
    assert job.seeds == 3 and job.epochs == cfg.trainer.max_epochs and job.batch_size == cfg.data.batch_size
    assert job.train_queries == 5 and len(job.queries) == 5  # the five train queries with a positive
    assert all(len(c.texts) == 40 for c in job.corpora)
    from multipos.data.preparation import TEACHER_PASSAGE_MAX_LENGTH

    # the teacher orders at its own length: one corpus (one cache entry) where that is the evaluation's
    assert {c.max_length for c in job.corpora} == {cfg.eval.passage_max_length, TEACHER_PASSAGE_MAX_LENGTH}
    assert job.dev_queries > 0 and job.test_queries > 0
