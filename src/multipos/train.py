"""The main job: train a dual encoder with a multi-positive objective, then evaluate it.

``python train.py loss=<objective> data=<regime config> model=<encoder>`` (Hydra entry point at the
repository root) calls :func:`train`. Outputs in the Hydra run directory:

* ``model/`` — final weights in HF format (best dev checkpoint), loadable by ``transformers``;
* ``metrics.json`` — ``{"<eval set>": {"ndcg@10": …, "mrr@10": …, "recall@100": …, "recall@1000": …}}``;
* ``references.json`` — the same metrics for BM25 and the zero-shot starting encoder;
* ``run.<eval set>.trec`` — TREC run files (top-1000); ``per_query.<eval set>.json`` — {metric: {qid: value}};
* ``checkpoints/``, ``csv/`` (Lightning logs), ``results.txt`` (the printed comparison table).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from multipos.assets import cache_dir
from multipos.callbacks import RetrievalValidation
from multipos.evaluation import EvalSet, add_average, bm25_run, dense_run, write_metrics
from multipos.losses import ContrastiveLoss
from multipos.readers import write_run

log = logging.getLogger(__name__)


def output_dir(cfg: DictConfig) -> Path:
    """The run directory ``cfg.paths.output_dir`` (Hydra's run dir under ``train.py``)."""
    return Path(cfg.paths.output_dir)


def stages(cfg: DictConfig, datamodule, loss: ContrastiveLoss) -> list[tuple[str, ContrastiveLoss, int]]:
    """(regime, objective, epochs) per training stage: one stage, or two for the curriculum regime
    (stage 1: silver positives with the chosen objective; stage 2: gold positives with SingleLH)."""
    if datamodule.regime == "curriculum":
        c = datamodule.curriculum
        return [("homogeneous", loss, int(c["silver_epochs"])), ("gold", ContrastiveLoss("singlelh"), int(c["gold_epochs"]))]
    return [(datamodule.regime, loss, int(cfg.trainer.max_epochs))]


def retrieval_options(cfg: DictConfig) -> dict:
    """Keyword arguments of :func:`multipos.evaluation.dense_run` from ``cfg.eval`` (encoding and FAISS settings)."""
    faiss = OmegaConf.to_container(cfg.eval.faiss) if cfg.eval.get("faiss") else {}
    return dict(k=cfg.eval.k, batch_size=cfg.eval.batch_size, bf16=cfg.eval.bf16,
                passage_max_length=cfg.eval.passage_max_length, index=cfg.eval.index, index_options=faiss)


def score_set(es: EvalSet, run, data, out: Path | None, tag: str) -> dict:
    """Score ``run`` on ``es`` → {result name: {metric: value}} (the set, plus ``<set>.<view>`` for qrels views).

    With ``out``, writes ``per_query.<result>.json`` (for paired significance tests) and ``run.<set>.trec``.
    """
    results = {}
    for name, (means, per_query) in es.score(run, data).items():
        results[name] = means
        if out is not None:
            write_metrics(out / f"per_query.{name}.json", per_query)
        log.info("%s: %s", name, json.dumps({k: round(v, 4) for k, v in means.items()}))
    if out is not None:
        write_run(run, out / f"run.{es.name}.trec", tag=tag)
    return results


def evaluate_sets(model, sets: list[EvalSet], cfg: DictConfig, out: Path | None, cache: Path | None) -> dict:
    """Dense retrieval + metrics on each set (:func:`score_set`) → {result name: {metric: value}}, plus the
    ``cfg.eval.average`` row when set. Writes runs and per-query values into ``out`` if given."""
    results = {}
    for es in sets:
        data = es.load()
        run = es.clean(dense_run(model, data, cache=cache, **retrieval_options(cfg)))
        results.update(score_set(es, run, data, out, tag=str(cfg.get("run_name", "multipos"))))
    return add_average(results, cfg.eval.average, [es.name for es in sets]) if cfg.eval.get("average") else results


def references(cfg: DictConfig, sets: list[EvalSet], zero_shot: bool = True, zero_shot_model: str | None = None) -> dict:
    """Floor rows on ``sets``: ``bm25`` and, with ``zero_shot``, ``zero-shot`` = ``cfg.model`` as configured
    (``zero_shot_model`` replaces its ``name_or_path``, e.g. the starting checkpoint of a fine-tuned model).
    Embeddings are cached across runs. Returns {row: {result name: {metric: value}}}."""
    refs = {"bm25": {}}
    for es in sets:
        data = es.load()
        for name, (means, _) in es.score(es.clean(bm25_run(data, cfg.eval.k)), data).items():
            refs["bm25"][name] = means
    if cfg.eval.get("average"):
        add_average(refs["bm25"], cfg.eval.average, [es.name for es in sets])
    if zero_shot:
        extra = {"name_or_path": zero_shot_model} if zero_shot_model else {}
        refs["zero-shot"] = evaluate_sets(instantiate(cfg.model, **extra), sets, cfg, None, cache_dir())
    return refs


def format_table(results: dict, refs: dict) -> str:
    """Plain-text table: one row per system (BM25, zero-shot, this run), one column per result/metric
    in ``results`` order."""
    cols = [(s, m) for s, ms in results.items() for m in ms]
    head = "system".ljust(12) + "".join(f"{s}:{m}".rjust(max(14, len(s) + len(m) + 2)) for s, m in cols)
    lines = [head]
    rows = [*((name, r) for name, r in refs.items()), ("this run", results)]
    for name, res in rows:
        cells = "".join(f"{res.get(s, {}).get(m, float('nan')):.4f}".rjust(max(14, len(s) + len(m) + 2)) for s, m in cols)
        lines.append(name.ljust(12) + cells)
    return "\n".join(lines)


def build_trainer(cfg: DictConfig, out: Path, max_epochs: int, callbacks: list, stage: str | None = None) -> L.Trainer:
    """Instantiate ``cfg.trainer`` for one stage with the logger, checkpointing and validation callbacks.

    ``stage`` (multi-stage runs) becomes the logger's ``version`` so stages log side by side
    (``csv/stage1/metrics.csv``, ``csv/stage2/…``) instead of overwriting each other.
    """
    logger = False
    if cfg.get("logger"):
        extra = {"version": stage} if stage is not None and "version" in cfg.logger else {}
        logger = instantiate(cfg.logger, **extra)
    return instantiate(cfg.trainer, default_root_dir=str(out), logger=logger, callbacks=callbacks, max_epochs=max_epochs)


def train(cfg: DictConfig) -> dict:
    """Run the main job described in the module docstring; returns the metrics dict written to ``metrics.json``.

    Raises: ValueError / DataFormatError for invalid configuration or data, before anything is written.
    """
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True)

    loss: ContrastiveLoss = instantiate(cfg.loss)
    datamodule = instantiate(cfg.data, seed=cfg.seed)
    test_sets: list[EvalSet] = [instantiate(s) for s in cfg.eval.test_sets.values()]
    val_set: EvalSet | None = instantiate(cfg.eval.validation) if cfg.eval.get("validation") else None
    datamodule.setup()  # data errors surface before any training or writing

    refs = {}
    if cfg.eval.references:
        refs = references(cfg, ([val_set] if val_set else []) + test_sets)
        write_metrics(out / "references.json", refs)

    model = instantiate(cfg.model)
    plan = stages(cfg, datamodule, loss)
    best_path = None
    for i, (regime, objective, epochs) in enumerate(plan):
        if epochs <= 0:
            continue
        log.info("stage %d/%d: regime=%s objective=%s epochs=%d", i + 1, len(plan), regime, objective.name, epochs)
        datamodule.set_stage(regime, objective.single_positive)
        callbacks = []
        if val_set is not None:
            opts = {**retrieval_options(cfg), "k": 100}
            callbacks.append(RetrievalValidation(val_set, cache=cache_dir(), **opts))
        ckpt = L.pytorch.callbacks.ModelCheckpoint(
            dirpath=str(out / "checkpoints" / f"stage{i + 1}"), filename="{epoch}-{step}",
            monitor="val/ndcg@10" if val_set is not None else None, mode="max", save_top_k=1, save_last=True,
            save_weights_only=cfg.get("save_weights_only", False))
        callbacks.append(ckpt)
        trainer = build_trainer(cfg, out, epochs, callbacks, stage=f"stage{i + 1}" if len(plan) > 1 else None)
        module = instantiate(cfg.optim, model=model, loss=objective)
        trainer.fit(module, datamodule=datamodule)
        best_path = ckpt.best_model_path or ckpt.last_model_path
        if best_path:
            state = torch.load(best_path, map_location="cpu", weights_only=False)["state_dict"]
            module.load_state_dict(state)
            log.info("stage %d: kept checkpoint %s (%s=%s)", i + 1, best_path, ckpt.monitor, ckpt.best_model_score)
    model.save_pretrained(out / "model")

    results = evaluate_sets(model, ([val_set] if val_set else []) + test_sets, cfg, out, cache_dir())
    write_metrics(out / "metrics.json", results)
    table = format_table(results, refs)
    (out / "results.txt").write_text(table + "\n")
    print("\n" + table + "\n")
    print(f"run directory: {out}")
    return results


def console_main() -> None:  # pragma: no cover - thin wrapper for the `multipos-train` script
    import hydra

    hydra.main(version_base="1.3", config_path=str(Path(__file__).resolve().parents[2] / "conf"),
               config_name="train")(lambda cfg: train(cfg))()
