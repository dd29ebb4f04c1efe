"""The OpenAI-compatible HTTP judge against a real OpenAI-compatible server on 127.0.0.1: ``transformers serve``
(transformers' FastAPI server, the ``fastapi`` and ``uvicorn`` packages of the test extra) serving a tiny random causal
LM built in the test, and SmolLM2-135M-Instruct's GGUF when ``MULTIPOS_SMOLLM2_GGUF`` names the file."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from multipos.annotate.cache import CallCache
from multipos.annotate.judges import OpenAIJudge
from tests.annotate.test_pipeline import _cfg

pytest.importorskip("fastapi", reason="transformers serve needs fastapi (pip install -e '.[test]')")
pytest.importorskip("uvicorn", reason="transformers serve needs uvicorn (pip install -e '.[test]')")
SERVE = Path(sys.executable).with_name("transformers")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(model: str, log: Path, timeout: float = 180.0):
    """Start ``transformers serve <model>`` on a free port of 127.0.0.1 → (process, base URL), once /health answers."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(SERVE), "serve", model, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"transformers serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"transformers serve did not answer /health within {timeout:.0f} s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def server(tiny_lm, tmp_path_factory):
    if not SERVE.is_file():
        pytest.skip(f"{SERVE}: no transformers command")
    proc, url = _serve(str(tiny_lm), tmp_path_factory.mktemp("serve") / "serve.log")
    yield url, str(tiny_lm)
    proc.terminate()
    proc.wait(timeout=30)


def test_the_http_judge_asks_a_real_openai_compatible_server_and_caches(server, tmp_path):
    url, model = server
    judge = OpenAIJudge(url, model, max_tokens=4, max_retries=0, cache=CallCache(tmp_path))
    messages = [{"role": "user", "content": "heart cholesterol"}]
    first = judge.ask(messages, "v1")
    assert first.prompt_tokens > 0 and 0 < first.completion_tokens <= 4  # the server's own usage counts
    assert judge.ask(messages, "v1") == first and judge.stats.calls == 1 and judge.stats.cache_hits == 1


def test_the_pipeline_over_http_records_a_random_models_answers_as_malformed(server, tiny_beir, tmp_path):
    """A random LM answers no grade: every answer is re-asked, then recorded as malformed, never a label."""
    from multipos.annotate.job import annotate

    url, model = server
    cfg = _cfg(tiny_beir, url, tmp_path, "out", f"judge.model={model}", "judge.max_tokens=4", "data.max_queries=2",
               "candidates.retrievers=[{kind: bm25, depth: 2}]", "stages.pseudo_answer=false", "stages.utility=false",
               "max_format_retries=1")
    summary = annotate(cfg)
    out = tmp_path / "out"
    malformed = [json.loads(x) for x in (out / "malformed.jsonl").read_text().splitlines()]
    assert summary["pairs"] == 4 and len(malformed) == 4 and all(len(m["raw"]) == 2 for m in malformed)
    assert summary["totals"]["calls"] == 8 and summary["training_queries"] == 0
    assert (out / "qrels" / "relevance.tsv").read_text().splitlines() == ["query-id\tcorpus-id\tscore"]
    again = annotate(cfg)  # nothing asked twice
    assert again["totals"]["calls"] == 0 and again["totals"]["cache_hits"] == 8


GGUF = os.environ.get("MULTIPOS_SMOLLM2_GGUF")


@pytest.mark.skipif(not GGUF or not Path(GGUF).is_file(),
                    reason="MULTIPOS_SMOLLM2_GGUF does not name the SmolLM2-135M-Instruct GGUF file")
def test_smollm2_served_over_http_answers(tmp_path):
    """``transformers serve`` 5.23 cannot load a GGUF file itself (its config has no ``architectures``): the test
    dequantises it through transformers' ``gguf_file`` loading into a model folder and serves that."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, folder = tmp_path / "gguf", tmp_path / "smollm2"
    source.mkdir()
    shutil.copyfile(GGUF, source / Path(GGUF).name)
    import torch

    AutoTokenizer.from_pretrained(source, gguf_file=Path(GGUF).name).save_pretrained(folder)
    gguf = AutoModelForCausalLM.from_pretrained(source, gguf_file=Path(GGUF).name, dtype=torch.float32)
    config = gguf.config  # a dequantised copy: a GGUF-loaded model refuses save_pretrained
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.architectures = [type(gguf).__name__]
    plain = type(gguf)(config)
    plain.load_state_dict(gguf.state_dict())
    plain.save_pretrained(folder)
    proc, url = _serve(str(folder), tmp_path / "serve.log")
    try:
        judge = OpenAIJudge(url, str(folder), max_tokens=16, max_retries=0)
        answer = judge.ask([{"role": "user", "content": "Reply with one digit from 0 to 3."}], "v1")
        assert answer.completion_tokens > 0 and answer.text.strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
