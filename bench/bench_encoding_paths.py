"""Fast corpus encoding without native bf16: fp32 against dynamic int8 quantisation of the encoder's linear layers
(one weight scale per layer, ``int8``, or per output channel, ``int8_per_channel``) and against the encoders exported
to ONNX and run by ONNX Runtime (``onnxruntime``, fp32; needs the ``onnx`` extra), with bf16 autocast (``bf16``, only
where the CPU has native bf16) as the reference for the gap the project already accepts where bf16 is native.

On a CPU without AVX512-BF16 / AMX, multipos encodes the frozen index and the evaluation corpora in fp32 (bf16 is
emulated there and many times slower). This benchmark measures the candidates against fp32:
``torch.ao.quantization.quantize_dynamic`` (int8 weights, activations quantised per batch, ``nn.Linear`` only) and
ONNX Runtime's CPU provider (optimum, which would wrap it, is not installable here), each encoding the full NFCorpus
and TREC DL 2019 / 2020 sub-corpora (256 tokens, batch 64, length-sorted as
``multipos.retrieval.encoding.encode`` does), for the zero-shot start and, with ``--trained``, one trained seed (a
``model/`` folder of ``make train``). For every (model, set, path): passages a second and test nDCG@10; then the
largest |nDCG@10(path) - nDCG@10(fp32)|, the speed-up, and the two-sided paired t-test's p over the set's queries
against fp32 (``p_vs_fp32``). The issue's rule: adopt a path only where that gap is at most 0.002 on every set
(docs/reliability.md).

Each fp32 row also gives its rate against this CPU's fp32 matrix-multiply rate, measured in the same run
(:func:`matmul_rate`): the encoder's floating-point operations per passage (:func:`encoder_flops`, each
length-sorted batch of 64 counted at its longest passage) times passages a second, over the best of a
(16,384 × 384) · (384 × 1,536) product (the feed-forward layer's shape) and a 2,048² square one. A fraction f says
that no exact fp32 path can encode more than 1/f times faster here. Sequence packing is not a candidate for
encoding: the length-sorted batches already carry 1.06 tokens through the encoder per real token
(``multipos.retrieval.encoding``).

    MULTIPOS_BF16=0 python bench/bench_encoding_paths.py [--trained multirun/default-cpu/seed=42/model]
        [--sets nfcorpus_test,trec_dl19,trec_dl20] [--paths fp32,int8,int8_per_channel,onnxruntime,bf16]

Appends one JSON line to ``bench/results/encoding_paths.jsonl``. On the 2-core AMD EPYC each (model, path) takes
about 9 min in fp32 over the three sets, 4–5 min in int8 or bf16.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_result, machine_info  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "encoding_paths.jsonl"
SETS = {"nfcorpus_test": ("nfcorpus", 1), "trec_dl19": ("trec-dl-2019", 2), "trec_dl20": ("trec-dl-2020", 2)}
TOLERANCE = 0.002
#: The quantised paths (``--paths``), each with whether its weight scales are per output channel.
QUANTISED = {"int8": False, "int8_per_channel": True}
BATCH, MAX_LENGTH = 64, 256


def matmul_rate(repeats: int = 10) -> float:
    """This CPU's fp32 matrix-multiply rate in GFLOP/s (2·m·n·k operations a product; torch's threads as set): the
    best median over a (16,384 × 384) · (384 × 1,536) product and a 2,048² square one, after 3 warm-up calls."""
    import statistics

    import torch

    best = 0.0
    for m, k, n in ((BATCH * MAX_LENGTH, 384, 1536), (2048, 2048, 2048)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        best = max(best, 2 * m * n * k / statistics.median(times) / 1e9)
    return best


def encoder_flops(model, texts: list[str]) -> float:
    """Floating-point operations (GFLOP) that the passage encoder of ``model`` (a BERT-style DualEncoder) spends on
    ``texts``: per layer and padded token 8·h² (query, key, value and output projections) + 4·h·f (feed-forward)
    + 4·n·h (attention scores and their weighted sum over the batch's n columns), h the hidden size, f the
    feed-forward size; batches of 64 sorted by token count, each padded to its longest (at most 256 tokens).
    Embeddings, layer norms, activations and pooling are not counted, so the true count is a little higher."""
    import numpy as np

    cfg = model.passage_encoder.config
    h, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    lengths = []
    for start in range(0, len(texts), 1024):
        tokens = model.tokenize(texts[start : start + 1024], kind="passage", max_length=MAX_LENGTH)
        lengths.extend(tokens["attention_mask"].sum(1).tolist())
    lengths = np.sort(np.asarray(lengths))[::-1]
    total = 0.0
    for start in range(0, len(lengths), BATCH):
        n = int(lengths[start])
        rows = len(lengths[start : start + BATCH])
        total += rows * n * layers * (8 * h * h + 4 * h * f + 4 * n * h)
    return total / 1e9


def int8_copy(model, per_channel: bool = False):
    """A copy of ``model`` (a DualEncoder) whose encoders' ``nn.Linear`` layers are dynamically quantised to int8:
    one weight scale per layer (``torch.ao``'s default), or with ``per_channel`` one per output row
    (``per_channel_dynamic_qconfig``: finer weights, the same int8 kernels and activations quantised per batch)."""
    import torch
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    spec = {torch.nn.Linear: per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig}
    out = copy.deepcopy(model).eval()
    out.query_encoder = quantize_dynamic(out.query_encoder, spec, dtype=torch.qint8)
    out.passage_encoder = out.query_encoder if model.shared else quantize_dynamic(
        out.passage_encoder, spec, dtype=torch.qint8)
    return out


def onnxruntime_encoder(module, folder: Path, name: str):
    """``module`` (an encoder of a DualEncoder) exported to ``folder/name.onnx`` and run by ONNX Runtime's CPU
    execution provider, as a ``torch.nn.Module`` called as the transformers module is (``input_ids``,
    ``attention_mask`` [B, L] int64) whose output's ``last_hidden_state`` is a float32 tensor [B, L, H]; ``config`` is
    the exported module's (H is read from it). Exported with ``torch.onnx.export``'s TorchScript exporter (opset 17,
    batch and token axes dynamic); the session runs ``intra_op_num_threads`` = torch's thread count with its default
    graph optimisations (all). Raises ModuleNotFoundError naming the ``onnx`` extra when onnxruntime or onnx is not
    installed."""
    import types

    import torch

    try:
        import onnx  # noqa: F401  (torch.onnx.export writes through it)
        import onnxruntime
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f"the onnxruntime path needs onnxruntime and onnx: pip install -e '.[onnx]' ({err})"
                                  ) from err

    class Hidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class OnnxRuntimeEncoder(torch.nn.Module):
        def __init__(self, session, config):
            super().__init__()
            self.session, self.config = session, config
            # encode() reads the model's device from its first parameter: an empty one, on the CPU
            self.device_marker = torch.nn.Parameter(torch.zeros(0), requires_grad=False)

        def forward(self, input_ids, attention_mask):
            feed = {"input_ids": input_ids.cpu().numpy(), "attention_mask": attention_mask.cpu().numpy()}
            return types.SimpleNamespace(last_hidden_state=torch.from_numpy(self.session.run(None, feed)[0]))

    file = folder / f"{name}.onnx"
    example = torch.ones(2, 8, dtype=torch.long)
    mask = example.clone()
    mask[1, 5:] = 0  # a padded row, so that tracing keeps the attention mask's path
    axes = {k: {0: "batch", 1: "tokens"} for k in ("input_ids", "attention_mask", "last_hidden_state")}
    with torch.no_grad():
        torch.onnx.export(Hidden(module).eval(), (example, mask), str(file), dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                          dynamic_axes=axes)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
    session = onnxruntime.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
    return OnnxRuntimeEncoder(session, module.config).eval()


def onnxruntime_copy(model, folder: Path):
    """A copy of ``model`` (a DualEncoder) whose query and passage encoders are :func:`onnxruntime_encoder` exports
    (one when the encoder is shared), written under ``folder``."""
    out = copy.deepcopy(model).eval()
    out.query_encoder = onnxruntime_encoder(model.query_encoder, folder, "query_encoder")
    out.passage_encoder = out.query_encoder if model.shared else onnxruntime_encoder(
        model.passage_encoder, folder, "passage_encoder")
    return out


def score(model, name: str, bf16: bool = False) -> tuple[float, float, dict[str, float], list[str]]:
    """(encoding seconds, test nDCG@10, {query id: nDCG@10}, the corpus texts) of ``model`` on the set ``name``
    (bf16 autocast only with ``bf16``; no cache)."""
    from multipos.evaluation.sets import EvalSet
    from multipos.retrieval.dense import dense_run

    path, threshold = SETS[name]
    eval_set = EvalSet(name=name, path=path, split="test", relevance_threshold=threshold,
                       metrics=["ndcg@10"])
    data = eval_set.load()
    start = time.perf_counter()
    run = dense_run(model, data, k=1000, batch_size=BATCH, bf16=bf16, passage_max_length=MAX_LENGTH, cache=None,
                    progress=False, device=None)
    seconds = time.perf_counter() - start
    means, per_query = eval_set.score(eval_set.clean(run), data)[name]
    return seconds, float(means["ndcg@10"]), per_query["ndcg@10"], data.corpus.texts(data.corpus.ids)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trained", default=None, help="a trained model/ folder (one seed of make train)")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--paths", default="fp32,int8")
    args = ap.parse_args(argv)
    import tempfile

    from multipos.hardware import cpu_bf16
    from multipos.model.encoder import DualEncoder
    from multipos.report.significance import paired_ttest

    models = {"zero-shot": "all-MiniLM-L6-v2", **({"trained": args.trained} if args.trained else {})}
    rows, per_query, flops = [], {}, {}  # per_query: (model, set, path) -> {query id: nDCG@10}; flops: set -> GFLOP
    paths = args.paths.split(",")
    unknown = sorted(set(paths) - {"fp32", "bf16", "onnxruntime", *QUANTISED})
    if unknown:
        ap.error(f"--paths: unknown path(s) {unknown}; choose from fp32, bf16, onnxruntime, {', '.join(QUANTISED)}")
    if "bf16" in paths and not cpu_bf16():  # emulated bf16 is many times slower than fp32
        print("bf16: this CPU has no native bf16 (AVX512-BF16 / AMX); path skipped", flush=True)
        paths.remove("bf16")
    peak = matmul_rate()
    print(f"fp32 matrix-multiply rate: {peak:.1f} GFLOP/s", flush=True)
    for label, path in models.items():
        base = DualEncoder(path, pooling="mean", normalize=True).eval()
        variants = {"fp32": base, **{p: int8_copy(base, per_channel=QUANTISED[p]) for p in paths if p in QUANTISED}}
        if "onnxruntime" in paths:
            exported = tempfile.TemporaryDirectory(prefix="multipos-onnx-")
            variants["onnxruntime"] = onnxruntime_copy(base, Path(exported.name))
        for name in args.sets.split(","):
            for kind in paths:
                seconds, ndcg, per_query[label, name, kind], texts = score(variants.get(kind, base), name,
                                                                           bf16=kind == "bf16")
                rows.append({"model": label, "set": name, "path": kind,
                             "passages_per_s": round(len(texts) / seconds, 2), "ndcg@10": round(ndcg, 4)})
                if kind == "fp32":
                    if name not in flops:  # the same count for every model: one tokenizer, one architecture
                        flops[name] = encoder_flops(base, texts)
                    gflops = flops[name] / seconds
                    rows[-1].update(gflop_per_s=round(gflops, 1), of_fp32_matmul_rate=round(gflops / peak, 3))
                print(json.dumps(rows[-1]), flush=True)
    compared = {}  # path -> [(|nDCG@10 gap| to fp32, speed-up over fp32)] of each (model, set)
    for r in rows:
        if r["path"] == "fp32":
            continue
        ref = next(x for x in rows if x["path"] == "fp32" and x["model"] == r["model"] and x["set"] == r["set"])
        _, p_value = paired_ttest(per_query[r["model"], r["set"], r["path"]], per_query[r["model"], r["set"], "fp32"])
        r["p_vs_fp32"] = round(p_value, 4)  # two-sided paired t-test over the set's queries
        compared.setdefault(r["path"], []).append((abs(r["ndcg@10"] - ref["ndcg@10"]),
                                                   r["passages_per_s"] / ref["passages_per_s"]))
    candidates = [pairs for p, pairs in compared.items() if p != "bf16"]  # bf16 is the reference, not a candidate
    gaps = [g for pairs in candidates for g, _ in pairs]
    speedups = [s for pairs in candidates for _, s in pairs]
    per_path = {}
    for p, pairs in compared.items():
        gap = round(max(g for g, _ in pairs), 4)
        per_path[p] = {"max_ndcg_gap": gap, "speedup_min": round(min(s for _, s in pairs), 2),
                       "within_tolerance": gap <= TOLERANCE}
    record = {**machine_info(), "bench": "encoding_paths",
              "command": "python bench/bench_encoding_paths.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "bf16_env": os.environ.get("MULTIPOS_BF16"), "tolerance": TOLERANCE,
              "fp32_matmul_gflop_per_s": round(peak, 1), "rows": rows,
              "max_ndcg_gap": round(max(gaps), 4) if gaps else None,
              "speedup_min": round(min(speedups), 2) if speedups else None,
              "within_tolerance": max(gaps) <= TOLERANCE if gaps else None,  # None: no candidate measured
              "per_path": per_path}
    append_result(RESULTS, record)
    print(json.dumps({k: record[k] for k in ("max_ndcg_gap", "speedup_min", "within_tolerance", "per_path")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
