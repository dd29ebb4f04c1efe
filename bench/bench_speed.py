"""Speed benchmarks on the real assets (all-MiniLM-L6-v2, NFCorpus). Run with ``make bench``.

Measures, and appends to ``bench/results/speed.jsonl`` (one JSON line per run, with machine info):
* corpus encoding throughput (passages/s) at 256 tokens, bf16 autocast and fp32;
* NFCorpus test evaluation wall time (323 queries, 3.6k passages) with and without cached corpus
  embeddings — encoding, FAISS IndexFlatIP top-1000 and ranx metrics;
* one training step (B=16 queries × G=8 passages, 32/128 tokens, LSEPair, AdamW), bf16 and fp32 with
  attention dropout 0 (``model=minilm``), and bf16 with the checkpoint's attention dropout 0.1.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch
from common import append_result, machine_info

OUT = Path(__file__).resolve().parent / "results" / "speed.jsonl"


def timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    os.environ.setdefault("MULTIPOS_CACHE", tempfile.mkdtemp(prefix="multipos-bench-"))
    from multipos.evaluation import EvalSet, dense_run, evaluate_run
    from multipos.losses import ContrastiveLoss
    from multipos.model import DualEncoder
    from multipos.retrieval import encode

    res = {**machine_info(),
           "torch": torch.__version__, "threads": torch.get_num_threads()}
    # as conf/model/minilm.yaml (attention dropout 0); the train step is also timed with the checkpoint's 0.1
    model = DualEncoder("all-MiniLM-L6-v2", pooling="mean", normalize=True, temperature=0.05, attention_dropout=0.0)
    data = EvalSet("nfcorpus_test", "nfcorpus", split="test").load()
    texts = data.corpus.texts()[:512]
    for bf16 in (True, False):
        secs = timed(lambda: encode(model, texts, "passage", max_length=256, bf16=bf16, progress=False))
        res[f"encode_passages_per_s_256tok_{'bf16' if bf16 else 'fp32'}"] = round(len(texts) / secs, 1)

    cache = Path(os.environ["MULTIPOS_CACHE"])

    def evaluate():
        run = dense_run(model, data, k=1000, cache=cache, progress=False)
        return evaluate_run(data.qrels, run)

    res["eval_nfcorpus_test_s_cold"] = round(timed(evaluate), 2)  # encodes the corpus, fills the cache
    res["eval_nfcorpus_test_s_cached"] = round(timed(evaluate, repeat=3), 2)

    loss = ContrastiveLoss("lsepair")
    q = model.tokenize(["what is the effect of statins on breast cancer"] * 16, "query")
    p = model.tokenize(texts[:128], "passage", max_length=128)
    pos = torch.zeros(16, 128, dtype=torch.bool)
    for i in range(16):
        pos[i, i * 8: i * 8 + 4] = True
    dropout_01 = DualEncoder("all-MiniLM-L6-v2", pooling="mean", normalize=True, temperature=0.05)
    for tag, m, bf16 in (("bf16", model, True), ("fp32", model, False), ("bf16_attn_dropout0.1", dropout_01, True)):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-5)
        m.train()

        def step(m=m, opt=opt, bf16=bf16):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                scores = m.score(m.encode_queries(q), m.encode_passages(p))
            value = loss(scores, pos, ~pos)
            opt.zero_grad()
            value.backward()
            opt.step()
        step()  # warm-up
        res[f"train_step_s_B16_G8_{tag}"] = round(timed(step, repeat=2), 2)

    append_result(OUT, res)


if __name__ == "__main__":
    main()
