"""The public sources of every asset the default configs read, and how each asset folder is built from them.

One entry per asset name, named as the assets folder names it (``data/<name>`` or ``models/<name>``). Each
source file carries its public URL, its hash (sha256, or md5 where only that is published) and its licence;
:mod:`multipos.assets.build` turns the downloaded files into the BEIR-layout folder (or model folder) that
``$MULTIPOS_ASSETS`` would hold, byte for byte.

Sources (checked against ``../shared/assets``: the folders built from them have the same sha256):

- ``nfcorpus``: BEIR's ``nfcorpus.zip`` (Thakur et al., NeurIPS 2021 Datasets) for corpus, queries and the BEIR
  qrels, plus the NFCorpus release's raw graded judgments (Boteva et al., ECIR 2016) as copied in
  WeberNick/vector-space-retrieval, for ``qrels-graded/{split}.s-{3,4}.qrel``.
- ``trec-dl-2019`` / ``trec-dl-2020``: the judged TREC Deep Learning passage topics and qrels of
  castorini/anserini-tools; the passages (MS MARCO v1 text) are the union of the hits of castorini/rank_llm's
  first-stage retrieval runs over those topics.
- ``all-MiniLM-L6-v2``, ``bert-base-uncased``: the Hugging Face hub.

Paper scale (Sec. 4.1 and Table 3 of the paper). URLs, sizes and md5s are read from the download list that
``ir_datasets`` ships (``ir_datasets/etc/downloads.json`` of the pinned version, :data:`IR_DATASETS_VERSION`), not
typed here; the files themselves are fetched by :mod:`multipos.assets.download` (pooch), which streams to disk,
resumes and honours ``MULTIPOS_MIRROR``, and built into the BEIR folders the configs read:

- ``msmarco-passage``: MS MARCO's ``collectionandqueries.tar.gz`` (8,841,823 passages; train and dev-small queries
  and qrels).
- ``trec-dl-2019-full`` / ``trec-dl-2020-full``: the judged TREC DL passage topics and NIST qrels over the whole
  collection (its ``corpus.jsonl`` is a link to ``msmarco-passage``'s).
- ``nq-dpr``: DPR's 21M-passage Wikipedia split and NQ test questions with answers (Karpukhin et al., 2020).
- the 14 BEIR sets of Table 3 (BEIR's zips), CQADupStack as one asset of 12 forum folders.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from multipos.assets.training_data import training_data_assets  # Zhang et al. + Tevatron (training_data.py)

__all__ = ["Source", "Asset", "REGISTRY", "RANK_LLM_RUNS", "BEIR_SETS", "CQADUPSTACK_FORUMS", "IR_DATASETS_VERSION",
           "get"]

#: The ir_datasets release whose download list (URLs, md5s, sizes) the paper-scale sources are read from
#: (pyproject.toml pins the same version, so the list cannot move under a build).
IR_DATASETS_VERSION = "0.6.3"


@dataclass(frozen=True)
class Source:
    """One public file an asset is built from.

    Attributes:
        url: public URL (``https://raw.githubusercontent.com/<owner>/<repo>/<commit>/<path>`` for GitHub files).
        hash: ``"sha256:<hex>"`` or ``"md5:<hex>"``; None where no hash is published or pinned (the download
            is then not verified; :func:`multipos.assets.download.fetch_source` logs the hash it saw).
        licence: the licence or terms of use of the file's content.
        name: where the file goes: its path inside the asset (model files) or a short key the builder reads.
        size: the file's size in bytes where the source of truth states it (for ``list`` and the docs), else None.
        headers: extra HTTP request headers the host needs, as (name, value) pairs (MS MARCO's Azure store wants
            ``X-Ms-Version``).
    """

    url: str
    hash: str | None
    licence: str
    name: str
    size: int | None = None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Asset:
    """One asset: its kind (``data`` or ``models``), the builder that lays it out, and the files it needs.

    ``options`` are keyword arguments of the builder (:data:`multipos.assets.build.BUILDERS`); ``requires`` names
    assets built (or found) first, whose folders the builder receives as ``files["asset:<name>"]``.
    """

    name: str
    kind: str
    builder: str
    sources: tuple[Source, ...]
    description: str
    options: dict = field(default_factory=dict)
    requires: tuple[str, ...] = ()


_GH = "https://raw.githubusercontent.com"
_ANSERINI = f"{_GH}/castorini/anserini-tools/5b819c1a45c8a0a3ec9426f476694f44a29dfaf3"
_RANK_LLM = f"{_GH}/castorini/rank_llm/8ad23b982320c54ecb6e0a19191b6eca19c804a6/retrieve_results"
_NFCORPUS_RAW = f"{_GH}/WeberNick/vector-space-retrieval/39c4b09ec59ab1974abc28309cd2c3c82f2f7a0c/data"
_MSMARCO_TERMS = "MS MARCO terms (non-commercial research); run files Apache-2.0 (castorini/rank_llm)"
_NFCORPUS_TERMS = "NFCorpus: research use (Boteva et al., ECIR 2016), redistributed by BEIR"

#: castorini/rank_llm's retrieval runs whose hits make the TREC DL sub-corpora (their DL20 REP_LLAMA file at the
#: pinned commit is the top-20 version and is left out, as in ../shared/assets).
RANK_LLM_RUNS = ("BM25", "BM25_RM3", "D_BERT_KD_TASB", "OPEN_AI_ADA2", "REP_LLAMA", "SPLADE_P_P_ENSEMBLE_DISTIL")

_RUN_SHA256 = {
    ("BM25", 19): "4f3e4aba8bb68c1b38405da010f44537f31d3b5fff7088ef97c03caed1076674",
    ("BM25", 20): "68b0ea4515ea022de921d54d5a53b4e93ed2f2993d350323c3173e47f3cea9f0",
    ("BM25_RM3", 19): "b5ab68b20a83b5f718bfa0d6f788b2f839100123e85c0b95768331d01c676631",
    ("BM25_RM3", 20): "22c8290ef0187082a68fde70f5bef0af8e14619d8110a6a92fde97d64e7c31ac",
    ("D_BERT_KD_TASB", 19): "6af564b78da890ded64787ca4c6d32de232bfe5b4030e1ca868a8fc75d79baec",
    ("D_BERT_KD_TASB", 20): "a9eb6abdc576d1f3fd17047fc437843c35d6f45ee61abc395986ce3ad932b33b",
    ("OPEN_AI_ADA2", 19): "9b6e71e0c3731acd4e49aeb9fd79852d0f5ac2641cd67f1984d40e47325eb51d",
    ("OPEN_AI_ADA2", 20): "2c56701e81cb8bdda9aeba9960fd4c646b243fd4ac8e6d9b6dfc810e00d58fde",
    ("REP_LLAMA", 19): "ae4cd2fb695446650241a894c8d1cf20bef3ca54bad792647b9474ec59986fdb",
    ("SPLADE_P_P_ENSEMBLE_DISTIL", 19): "2b4a11fe6877a4cb0138426add49b3b70bc2d46390ce5a9b0120cca26cec4099",
    ("SPLADE_P_P_ENSEMBLE_DISTIL", 20): "58fc0d071956898e40384b781217f5a945b2b9dc049045ad9c865521e52a3fbd",
}


def _trec_dl(year: int, topics: str, topics_sha: str, qrels_sha: str) -> Asset:
    runs = tuple(
        Source(f"{_RANK_LLM}/{run}/retrieve_results_dl{year}.json", f"sha256:{_RUN_SHA256[run, year]}", _MSMARCO_TERMS,
               f"run:{run}")
        for run in RANK_LLM_RUNS if (run, year) in _RUN_SHA256
    )
    return Asset(
        name=f"trec-dl-20{year}", kind="data", builder="trec_dl_subcorpus",
        description=f"TREC DL 20{year} passage track: judged queries over the passages of public top-100 runs",
        sources=(
            Source(f"{_ANSERINI}/topics/{topics}", f"sha256:{topics_sha}", "Apache-2.0 (anserini-tools); NIST TREC",
                   "topics"),
            Source(f"{_ANSERINI}/qrels/qrels.dl{year}-passage.txt", f"sha256:{qrels_sha}",
                   "Apache-2.0 (anserini-tools); NIST TREC", "qrels"),
            *runs,
        ),
    )


def _nfcorpus() -> Asset:
    graded = {
        ("train", 3): "9f35a72d56ed19c1df5165442b5cbeef3a29b7dc76f35f636654516c13039e89",
        ("train", 4): "c21e8efd26829a21e5e88e4d87bce738c24211a3de091a9c27a3bd330f8abaf7",
        ("dev", 3): "7828a511ee263e09cb4d9e01c8f7adb4101877f1bc84af2b370af9854d72ffe2",
        ("dev", 4): "bb7048b9c7b029da5fe3a6f537f8be6e9e291554997c6face817d99c993c6c75",
        ("test", 3): "854da1b7a95e32383e508a89bf62848dd12b7aed28d2e35796e0190dfb97c3ae",
        ("test", 4): "da94251f365be353ca30f15a46956b6e94dea5deac4d9174668cfa46f1b96b07",
    }
    return Asset(
        name="nfcorpus", kind="data", builder="beir_zip",
        description="NFCorpus (BEIR) with the release's graded qrels (2 = direct, 1 = indirect link)",
        sources=(
            _irds("beir", "nfcorpus", _NFCORPUS_TERMS, "zip"),  # md5 a89dba18a62ef92f7d323ec890a0d38d
            *(Source(f"{_NFCORPUS_RAW}/{split}/raw/s-{level}.qrel", f"sha256:{sha}", _NFCORPUS_TERMS,
                     f"qrels-graded/{split}.s-{level}.qrel")
              for (split, level), sha in graded.items()),
        ),
    )


def _hub(repo: str, revision: str, files: dict[str, str | None], description: str) -> Asset:
    base = f"https://huggingface.co/{repo}/resolve/{revision}"
    return Asset(
        name=repo.split("/")[-1], kind="models", builder="files", description=description,
        sources=tuple(Source(f"{base}/{path}", f"sha256:{sha}" if sha else None, "Apache-2.0", path)
                      for path, sha in files.items()),
    )


@cache
def ir_datasets_downloads() -> dict:
    """ir_datasets' download list (``etc/downloads.json``), read without importing the package.

    Raises:
        ImportError: ir_datasets is not installed (it is a dependency: ``pip install ir_datasets``).
    """
    spec = importlib.util.find_spec("ir_datasets")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the paper-scale asset sources are read from ir_datasets=={IR_DATASETS_VERSION}'s "
                          "download list: pip install ir_datasets")
    path = Path(next(iter(spec.submodule_search_locations))) / "etc" / "downloads.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _irds(group: str, key: str, licence: str, name: str) -> Source:
    """The source ir_datasets lists as ``downloads.json[group][key]`` (URL, md5, size, request headers)."""
    entry = ir_datasets_downloads()[group][key]
    headers = tuple(sorted((entry.get("download_args") or {}).get("headers", {}).items()))
    return Source(entry["url"], f"md5:{entry['expected_md5']}", licence, name, size=entry.get("size_hint"),
                  headers=headers)


_MSMARCO_ONLY = "MS MARCO terms: non-commercial research use (Microsoft)"
_NIST = "TREC DL qrels and topics: NIST, public; MS MARCO terms for the passages"
_DPR = "CC BY-NC 4.0 (DPR, facebookresearch); Wikipedia text CC BY-SA 3.0; NQ questions CC BY-SA 3.0"

#: Licence of each BEIR set's content as BEIR's dataset table gives it ("see the original" where it gives none).
BEIR_SETS: dict[str, str] = {
    "trec-covid": "CORD-19 dataset licence (Allen Institute for AI); TREC-COVID judgments: NIST, public",
    "nfcorpus": _NFCORPUS_TERMS,
    "nq": "CC BY-SA 3.0 (Natural Questions)",
    "hotpotqa": "CC BY-SA 4.0 (HotpotQA)",
    "fiqa": "FiQA 2018 challenge data: research use (see the original)",
    "arguana": "CC BY 4.0 (ArguAna counterargs corpus)",
    "webis-touche2020": "CC BY 4.0 (args.me corpus, Touché 2020)",
    "quora": "Quora question pairs: Quora's terms of service (non-commercial)",
    "dbpedia-entity": "CC BY-SA 3.0 (DBpedia-Entity v2)",
    "scidocs": "GNU GPL v3 (SCIDOCS)",
    "fever": "CC BY-SA 3.0 (FEVER; Wikipedia text)",
    "climate-fever": "CC BY-SA 4.0 (Climate-FEVER)",
    "scifact": "CC BY-NC 2.0 (SciFact)",
    "cqadupstack": "Apache-2.0 (CQADupStack; StackExchange content CC BY-SA)",
}
#: CQADupStack's 12 StackExchange forums: BEIR reports the set as the mean of their nDCG@10 (one column).
CQADUPSTACK_FORUMS = ("android", "english", "gaming", "gis", "mathematica", "physics", "programmers", "stats", "tex",
                      "unix", "webmasters", "wordpress")
_IRDS_BEIR_KEY = {"webis-touche2020": "webis-touche2020/v2"}  # v2 is the file on BEIR's own server (BEIR's v2)


def _beir(name: str) -> Asset:
    what = "12 forum folders (cqadupstack/<forum>), reported as their mean" if name == "cqadupstack" else "BEIR layout"
    return Asset(name=name, kind="data", builder="beir_zip", description=f"BEIR {name} ({what}; Table 3)",
                 sources=(_irds("beir", _IRDS_BEIR_KEY.get(name, name), BEIR_SETS[name], "zip"),))


def _paper_scale() -> tuple[Asset, ...]:
    """The evaluation and collection assets of the paper's own scale (sources from ir_datasets' list)."""
    marco = Asset(
        name="msmarco-passage", kind="data", builder="msmarco_passage",
        description="MS MARCO passage v1: 8,841,823 passages, train and dev-small (6,980) queries and qrels",
        sources=(_irds("msmarco-passage", "collectionandqueries", _MSMARCO_ONLY, "collectionandqueries"),))
    dl = tuple(Asset(
        name=f"trec-dl-{year}-full", kind="data", builder="trec_dl_full", requires=("msmarco-passage",),
        description=f"TREC DL {year} passage track: judged queries and NIST qrels over the full 8.8M collection",
        sources=(_irds("msmarco-passage", f"trec-dl-{year}/queries", _NIST, "queries"),
                 _irds("msmarco-passage", f"trec-dl-{year}/qrels", _NIST, "qrels")))
        for year in (2019, 2020))
    nq = Asset(
        name="nq-dpr", kind="data", builder="dpr_nq",
        description="NQ test (3,610 questions with answers) over DPR's 21M-passage Wikipedia split (psgs_w100)",
        sources=(_irds("dpr-w100", "docs", _DPR, "psgs_w100.tsv.gz"),
                 # Not in ir_datasets' list, and DPR publishes no checksum: the sha256 of the first download is
                 # recorded and every later download is checked against it (multipos.assets.download).
                 Source("https://dl.fbaipublicfiles.com/dpr/data/retriever/nq-test.qa.csv", None, _DPR,
                        "nq-test.qa.csv")))
    return (marco, *dl, nq, *(_beir(name) for name in BEIR_SETS if name != "nfcorpus"))


REGISTRY: dict[str, Asset] = {a.name: a for a in (
    _nfcorpus(),
    _trec_dl(19, "topics.dl19-passage.txt", "518992da259fb61f64e4790791df91a7b42ea5773f374aed59220ebb51d58d90",
             "8a1f10d550732e4cd91d7fc49846a3784de4040972f583e69285a88f3c5fee92"),
    _trec_dl(20, "topics.dl20.txt", "726cb4018b85a335fcbe09004df7f084ec1bf20531961d9af7b0c71dd609e69b",
             "60d4c34561f9687f8f73e0a752ba80ab80159b3e9c1bedd0a351f747ed6f5684"),
    _hub("sentence-transformers/all-MiniLM-L6-v2", "main", {
        "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
        "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
        "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
        "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
        "sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
        "config_sentence_transformers.json": "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
        "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
    }, "sentence-transformers/all-MiniLM-L6-v2 (6 layers, 384 dims, mean pooling): the CPU-scale starting model"),
    # Not pinned: no copy of these files has been available to hash here; the download logs the hash it saw.
    _hub("bert-base-uncased", "main", dict.fromkeys(
        ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt")),
        "bert-base-uncased: the paper-scale starting model (model=bert_base)"),
    *_paper_scale(),
    *training_data_assets(),  # msmarco-multipos, nq-multipos: the paper's training data (hub repositories)
)}


def get(name: str) -> Asset:
    """The registry entry for ``name``. Raises KeyError naming the known assets."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no public source is registered for asset {name!r}; known: {', '.join(REGISTRY)}") from None
