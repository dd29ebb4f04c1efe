"""``python annotate.py``: the one reader of ``conf/annotate.yaml``; it builds the judge, prompts, data and
candidate pools, then runs :class:`multipos.annotate.pipeline.Annotator`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from multipos.annotate.cache import CallCache
from multipos.annotate.candidates import pool_candidates
from multipos.annotate.judges import Judge, OpenAIJudge, TransformersJudge
from multipos.annotate.pipeline import Annotator, StageSettings
from multipos.annotate.score_judge import ScoreThresholdJudge
from multipos.annotate.stages import Prompt
from multipos.assets import REPO_ROOT, cache_dir, resolve_dataset
from multipos.formats.beir import read_corpus, read_queries
from multipos.formats.trec import read_qrels
from multipos.formats.types import DataFormatError

__all__ = ["annotate", "build_judge", "load_queries"]

log = logging.getLogger(__name__)
PROMPTS = REPO_ROOT / "conf" / "annotate" / "prompts"


def build_judge(j: DictConfig, cache: CallCache) -> Judge | ScoreThresholdJudge:
    """The judge of the ``judge`` settings ``j`` (``backend``: openai | transformers | score_threshold). Raises
    ValueError for another backend."""
    if j.backend == "score_threshold":
        return ScoreThresholdJudge(j.model, list(j.thresholds), cache_dir() / "embeddings")
    if j.backend == "openai":
        return OpenAIJudge(j.base_url, j.model, j.api_key, j.temperature, j.max_tokens, j.timeout, j.max_retries,
                           cache=cache)
    if j.backend == "transformers":
        return TransformersJudge(j.model, j.get("gguf_file"), j.max_tokens, cache=cache)
    raise ValueError(f"judge.backend {j.backend!r}; allowed: openai, transformers, score_threshold")


def load_queries(folder: Path, queries_file: str | None, split: str | None, max_queries: int | None) -> dict:
    """{query id → text}: the folder's ``queries.jsonl`` or ``queries_file`` (.jsonl with ``_id``/``text``, or .tsv
    ``id<TAB>text``), restricted to the queries of ``qrels/<split>.tsv`` and to the first ``max_queries``. Raises
    DataFormatError naming file and line for a bad .tsv line."""
    path = Path(queries_file).expanduser() if queries_file else folder / "queries.jsonl"
    if path.suffix == ".tsv":
        queries = {}
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                parts = line.split("\t", 1)
                if len(parts) != 2 or not parts[1].strip():
                    raise DataFormatError(f"{path}:{n}: expected 'id<TAB>text'")
                queries[parts[0]] = parts[1].strip()
    else:
        queries = read_queries(path)
    if split:
        judged = read_qrels(folder / "qrels" / f"{split}.tsv")
        queries = {q: t for q, t in queries.items() if q in judged}
    if max_queries:
        queries = dict(list(queries.items())[: int(max_queries)])
    return queries


def annotate(cfg: DictConfig) -> dict:
    """Run the pipeline of ``cfg`` → its summary (also in ``<out>/summary.json``)."""
    folder = resolve_dataset(str(cfg.data.path))
    corpus = read_corpus(folder / "corpus.jsonl")
    queries = load_queries(folder, cfg.data.get("queries"), cfg.data.get("split"), cfg.data.get("max_queries"))
    cache = CallCache(cfg.cache)
    judge = build_judge(cfg.judge, cache)
    prompts = {}
    for stage, name in cfg.prompts.items():
        path = Path(str(name)).expanduser()
        prompts[stage] = Prompt.load(path if path.is_file() else PROMPTS / str(name))
    pools = pool_candidates(corpus, queries, OmegaConf.to_container(cfg.candidates.retrievers),
                            cache_dir() / "embeddings")
    settings = StageSettings(**OmegaConf.to_container(cfg.stages))
    out = Path(cfg.out)
    (out).mkdir(parents=True, exist_ok=True)
    (out / "pools.json").write_text(json.dumps(pools) + "\n")
    summary = Annotator(judge, prompts, settings, cfg.concurrency, cfg.max_format_retries).run(corpus, queries,
                                                                                                pools, out)
    log.info("annotated %d queries: %d with positives; calls %d, cache hits %d; summary in %s", summary["queries"],
             summary["training_queries"], summary["totals"]["calls"], summary["totals"]["cache_hits"],
             out / "summary.json")
    return summary
