"""The annotation pipeline end to end against an OpenAI-compatible server on 127.0.0.1 started by the test.

The server is a recorded-response stub, not a language model: it grades a passage 3 when it names the query's topic,
else 0, writes a fixed pseudo-answer, grades utility 2, and never gives a grade for the passage titled
"sleep study 3" (a malformed answer). It counts the requests, so the tests can check what the cache saves.
"""

from __future__ import annotations

import http.server
import json
import re
import threading

import pytest

from multipos.annotate.job import annotate
from multipos.data.sources import TevatronSource
from tests.helpers import CONF


class _Stub(http.server.BaseHTTPRequestHandler):
    requests: list = []
    fail_after: int | None = None

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        if type(self).fail_after is not None and len(type(self).requests) > type(self).fail_after:
            self.send_response(500)
            self.end_headers()
            return
        first_user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        query = re.search(r"(?:Query|Question): (.*)", first_user).group(1)
        topic = query.split()[-1]
        if "Answer:" in first_user:  # utility
            text = "Final score: 2"
        elif "Passages:" in first_user:  # pseudo-answer
            text = f"About {topic}: see the passages."
        elif "sleep study 3" in first_user:
            text = "It seems relevant, I would say."
        else:
            passage = first_user.split("Passage:", 1)[1]
            text = "Final score: 3" if topic in passage else "Final score: 0"
        out = {"id": "stub", "object": "chat.completion", "created": 0, "model": body["model"],
               "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def stub_server():
    _Stub.requests, _Stub.fail_after = [], None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _cfg(tiny_beir, base_url, tmp_path, out="out", *extra):
    from hydra import compose, initialize_config_dir

    from multipos.config_resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("annotate", overrides=[
            f"data.path={tiny_beir}", "candidates.retrievers=[{kind: bm25, depth: 8}]", f"judge.base_url={base_url}",
            "judge.model=stub", "judge.max_retries=0", f"cache={tmp_path}/calls", f"out={tmp_path}/{out}",
            "concurrency=3", *extra])


def _files(folder):
    return {name: (folder / name).read_bytes() for name in ("train.jsonl", "qrels/relevance.tsv", "qrels/utility.tsv",
                                                            "malformed.jsonl")}


def test_the_pipeline_writes_training_data_and_grades(tiny_beir, stub_server, tmp_path):
    summary = annotate(_cfg(tiny_beir, stub_server, tmp_path))
    out = tmp_path / "out"
    lines = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert summary["queries"] == 10 and len(lines) == summary["training_queries"] > 0
    for line in lines:
        topic = line["query"].split()[-1]
        assert all(topic in p["title"] + " " + p["text"] for p in line["positive_passages"])
        assert all(topic not in p["title"] + " " + p["text"] for p in line["negative_passages"])
    malformed = [json.loads(x) for x in (out / "malformed.jsonl").read_text().splitlines()]
    assert malformed and all(m["stage"] == "relevance" and len(m["raw"]) == 3 for m in malformed)  # 1 + 2 retries
    relevance = (out / "qrels" / "relevance.tsv").read_text()
    assert all(f"\t{m['passage_id']}\t" not in relevance for m in malformed)  # never counted as a label
    totals = summary["totals"]
    assert totals["calls"] == len(_Stub.requests) and totals["prompt_tokens"] == 50 * totals["calls"]
    assert set(summary["stages"]) == {"relevance", "pseudo_answer", "utility"}
    examples = TevatronSource(str(out / "train.jsonl")).load()[1]  # train.py reads it as it is
    assert len(examples) == len(lines) and examples[0].silver


def test_a_rerun_asks_nothing_again_and_writes_the_same_files(tiny_beir, stub_server, tmp_path):
    first = annotate(_cfg(tiny_beir, stub_server, tmp_path))
    files, asked = _files(tmp_path / "out"), len(_Stub.requests)
    second = annotate(_cfg(tiny_beir, stub_server, tmp_path))
    assert len(_Stub.requests) == asked and second["totals"]["calls"] == 0
    assert second["totals"]["cache_hits"] == first["totals"]["calls"]
    assert _files(tmp_path / "out") == files


def test_a_run_killed_midway_resumes_from_the_cache(tiny_beir, stub_server, tmp_path):
    annotate(_cfg(tiny_beir, stub_server, tmp_path, "whole"))
    whole = _files(tmp_path / "whole")
    total = len(_Stub.requests)
    _Stub.requests, _Stub.fail_after = [], 20
    with pytest.raises(Exception):
        annotate(_cfg(tiny_beir, stub_server, tmp_path, "killed", "cache=" + str(tmp_path / "calls2")))
    assert not (tmp_path / "killed" / "train.jsonl").exists()
    before, _Stub.fail_after = len(_Stub.requests), None
    annotate(_cfg(tiny_beir, stub_server, tmp_path, "killed", "cache=" + str(tmp_path / "calls2")))
    assert _files(tmp_path / "killed") == whole
    assert len(_Stub.requests) - before <= total - 20  # the answers received before the failure are not asked again


def test_relevance_only_is_an_umbrela_style_judge(tiny_beir, stub_server, tmp_path):
    summary = annotate(_cfg(tiny_beir, stub_server, tmp_path, "out", "stages.pseudo_answer=false",
                            "stages.utility=false"))
    assert set(summary["stages"]) == {"relevance"} and summary["training_queries"] > 0
    assert (tmp_path / "out" / "qrels" / "utility.tsv").read_text() == "query-id\tcorpus-id\tscore\n"


def test_a_score_threshold_judge_grades_relevance_from_the_encoder_scores(tiny_beir, tiny_bert, tmp_path):
    """``judge.backend=score_threshold``: grade = thresholds reached by the model's score; relevance only."""
    import numpy as np

    from multipos.annotate.score_judge import grades_from_scores
    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.encoding import encode

    extra = ["judge.backend=score_threshold", f"judge.model={tiny_bert}", "judge.thresholds=[0.0,0.1,0.2]",
             "stages.pseudo_answer=false", "stages.utility=false", "stages.relevance_threshold=2"]
    summary = annotate(_cfg(tiny_beir, "http://unused", tmp_path, "out", *extra))
    out = tmp_path / "out"
    grades = [line.split("\t") for line in (out / "qrels" / "relevance.tsv").read_text().splitlines()[1:]]
    assert summary["pairs"] == len(grades) == summary["stages"]["relevance"]["calls"] and not summary["malformed"]
    from multipos.formats.beir import read_corpus, read_queries

    corpus, queries = read_corpus(tiny_beir / "corpus.jsonl"), read_queries(tiny_beir / "queries.jsonl")
    model = DualEncoder(str(tiny_bert))
    q, p, g = grades[0]
    score = float(np.dot(encode(model, [queries[q]], kind="query", progress=False)[0],
                         encode(model, corpus.texts([p]), kind="passage", progress=False)[0]))
    assert int(g) == int(grades_from_scores(np.array([score]), [0.0, 0.1, 0.2])[0])
    lines = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    positives = {(line["query_id"], d["docid"]) for line in lines for d in line["positive_passages"]}
    assert positives == {(q, p) for q, p, g in grades if int(g) >= 2}
    with pytest.raises(ValueError, match="stages.pseudo_answer=false"):
        annotate(_cfg(tiny_beir, "http://unused", tmp_path, "out2", *extra[:3]))


def test_score_thresholds_must_ascend():
    from multipos.annotate.score_judge import grades_from_scores

    assert list(grades_from_scores([0.1, 0.5, 0.9], [0.5])) == [0, 1, 1]
    assert list(grades_from_scores([0.1, 0.5, 0.9], [0.2, 0.5, 0.95])) == [0, 2, 2]
    with pytest.raises(ValueError, match="ascending"):
        grades_from_scores([0.1], [0.5, 0.2])
