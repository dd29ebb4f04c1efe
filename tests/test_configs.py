"""Every file of every config group composes, and every experiment composes and instantiates for every
cell of its sweep (ashleve/lightning-hydra-template's test_configs idea)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import OmegaConf

from multipos.runs.spec import run_spec
from multipos.training.stages import plan
from tests.helpers import CONF, compose_cfg

GROUPS = sorted(p.name for p in Path(CONF).iterdir() if p.is_dir() and p.name not in ("hydra", "experiment"))
EXPERIMENTS = sorted(p.stem for p in (Path(CONF) / "experiment").glob("*.yaml"))
#: Evaluation-only studies (``job: evaluate``): run by evaluate.py, composed from ``conf/evaluate.yaml``.
EVAL_EXPERIMENTS = sorted(e for e in EXPERIMENTS
                          if OmegaConf.load(Path(CONF) / "experiment" / f"{e}.yaml").get("job") == "evaluate")
TRAIN_EXPERIMENTS = [e for e in EXPERIMENTS if e not in EVAL_EXPERIMENTS]
#: Groups whose files need other settings to compose (an eval set whose paths the user gives).
NEEDS = {("eval", "beir"): ["eval.paths=[nfcorpus]"]}
#: Experiments that need a setting to compose (the user's data).
EXPERIMENT_NEEDS = {"own_data": ["data_path=nfcorpus"]}
PAPER_TABLES = ("table2_homogeneous", "table3_ood", "table4_heterogeneous", "table5_curriculum",
                "figure_ratio_ablation", "table6_lsepair_variants", "table7_budget", "table8_first_vs_random_m",
                "table9_recontriever",
                "nfcorpus_recipe_search", "default")


def group_files():
    for group in GROUPS:
        for f in sorted((Path(CONF) / group).glob("*.yaml")):
            yield group, f.stem


def test_every_paper_result_has_an_experiment():
    assert set(PAPER_TABLES) <= set(EXPERIMENTS)


@pytest.mark.parametrize("group,name", list(group_files()))
def test_every_group_file_composes(group, name):
    if group == "benchmark":  # one eval set, added to the test sets
        cfg = compose_cfg("train", [f"+benchmark@eval.test_sets.extra={name}"])
        es = instantiate(cfg.eval.test_sets.extra)
        assert es.name and es.metrics
        return
    cfg = compose_cfg("train", [f"{group}={name}", "paths.output_dir=out", *NEEDS.get((group, name), [])])
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


def job_config(experiment: str) -> str:
    """The primary config a study composes from: ``evaluate`` for an evaluation-only study, else ``train``."""
    return "evaluate" if experiment in EVAL_EXPERIMENTS else "train"


def sweep_cells(experiment: str, seeds_once: bool = False) -> list[list[str]]:
    """Every override combination of an experiment's ``hydra.sweeper.params`` (choice lists expanded;
    an Optuna interval contributes its two ends); ``seeds_once``: the first seed of the seed axis only."""
    cfg = compose_cfg(job_config(experiment), [f"experiment={experiment}"], return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.get("params") else {}
    if seeds_once and "seed" in params:  # a seed changes no composition: one seed stands for all
        params["seed"] = str(params["seed"]).split(",")[0]
    parser = OverridesParser.create()
    axes = []
    for key, text in params.items():
        text = str(text)
        if text.startswith("tag("):  # tag(log, interval(a, b))
            text = text[text.index("interval(") : -1]
        if text.startswith("interval("):
            lo, hi = (float(x) for x in text[len("interval("):-1].split(","))
            values = [lo, hi]
        elif text.startswith("choice("):
            values = [v.strip() for v in text[len("choice("):-1].split(",")]
        else:
            override = parser.parse_override(f"{key}={text}")
            values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        axes.append([f"{key}={v}" for v in values])
    if cfg.hydra.sweeper.get("_target_", "").endswith("OptunaSweeper"):
        # a search space: every value of every axis once (a covering set), not the whole product
        width = max(len(a) for a in axes)
        return [[a[i % len(a)] for a in axes] for i in range(width)]
    return [list(cell) for cell in itertools.product(*axes)]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_every_experiment_cell_composes_and_plans(experiment, scale):
    cells = sweep_cells(experiment, seeds_once=True)
    assert cells, f"{experiment}: no sweep"
    evaluates = experiment in EVAL_EXPERIMENTS
    for cell in cells if scale == "cpu" else cells[:1]:  # the paper scale changes no sweep axis
        cfg = compose_cfg(job_config(experiment), [f"experiment={experiment}", f"scale={scale}", "paths.output_dir=out",
                                                   *cell, *EXPERIMENT_NEEDS.get(experiment, [])])
        resolved = OmegaConf.to_container(cfg, resolve=True)
        assert resolved["experiment_name"] == experiment
        assert resolved["report"]["name"] == experiment and resolved["report"]["columns"]
        assert resolved["scale"]["name"] == scale
        if evaluates:  # evaluates another study's models, trains nothing
            assert resolved["job"] == "evaluate" and resolved["init_from"].endswith("/model")
            assert run_spec(cfg).stages == [] and run_spec(cfg).seed is None
        else:
            assert resolved["job"] == "train"
            assert sum(s.epochs for s in plan(cfg.stages)) >= 1  # every stage valid, one trains
            assert "regime" not in resolved["data"]  # the regime is the stage plan's alone (conf/regime)


@pytest.mark.parametrize("experiment", EVAL_EXPERIMENTS)
def test_evaluation_only_study_instantiates(experiment, tiny_bert, tmp_path):
    """The first cell of each evaluation-only study builds its encoder and eval sets (tiny BERT: no download)."""
    cell = sweep_cells(experiment)[0]
    cfg = compose_cfg("evaluate", [f"experiment={experiment}", *cell, f"model.name_or_path={tiny_bert}",
                                   f"paths.output_dir={tmp_path}"])
    instantiate(cfg.model)
    for spec in [*(cfg.eval.get("test_sets") or {}).values(), *([cfg.eval.validation] if cfg.eval.validation else [])]:
        instantiate(spec)


@pytest.mark.parametrize("experiment", TRAIN_EXPERIMENTS)
def test_experiment_instantiates(experiment, tiny_bert, tmp_path):
    """The first cell of each experiment builds its data module, model, objective, module factory, callbacks
    and eval sets (the model path points at the tiny BERT: no download)."""
    cell = sweep_cells(experiment)[0]
    cfg = compose_cfg("train", [f"experiment={experiment}", *cell, f"model.name_or_path={tiny_bert}",
                                f"paths.output_dir={tmp_path}", *EXPERIMENT_NEEDS.get(experiment, [])])
    datamodule = instantiate(cfg.data, seed=cfg.seed)
    assert datamodule.regime in ("homogeneous", "heterogeneous", "gold", "all")
    model = instantiate(cfg.model)
    loss = instantiate(cfg.loss)
    module = instantiate(cfg.module)(model=model, loss=loss)
    assert module.optimizer_settings.factory.func.__name__ == "AdamW"
    for spec in (cfg.eval.get("test_sets") or {}).values():
        instantiate(spec)
    if cfg.eval.get("validation"):
        instantiate(cfg.eval.validation)
    for spec in cfg.callbacks.values():
        instantiate(spec)


def test_paper_scale_settings():
    cfg = compose_cfg("train", ["experiment=table2_homogeneous", "scale=paper"])
    assert cfg.model.name_or_path == "bert-base-uncased" and cfg.model.pooling == "cls"
    assert (cfg.data.group_size, cfg.data.max_positives, cfg.data.batch_size) == (8, 4, 128)
    assert cfg.module.optimizer.lr == 3e-5 and cfg.trainer.max_epochs == 3
    assert cfg.data.source._target_.endswith("TevatronSource")
    # the paper's fork (docs/paper-scale.md): 16 query tokens in training, 32 in encoding, 128 passage tokens in
    # both, raw dot product, 10 % warm-up, no weight decay
    assert (cfg.data.query_max_length, cfg.model.query_max_length) == (16, 32)
    assert cfg.data.passage_max_length == cfg.model.passage_max_length == cfg.eval.passage_max_length == 128
    assert (cfg.model.normalize, cfg.model.temperature, cfg.module.warmup_ratio) == (False, 1.0, 0.1)
    assert cfg.module.optimizer.weight_decay == 0.0
    assert compose_cfg("evaluate", ["experiment=table3_ood", "scale=paper"]).eval.passage_max_length == 128
    cur = compose_cfg("train", ["experiment=table5_curriculum", "scale=paper"])
    assert [s.epochs for s in plan(cur.stages)] == [3, 1]


def test_unknown_experiment_lists_the_allowed_ones():
    with pytest.raises(Exception, match="table2_homogeneous"):
        compose_cfg("train", ["experiment=table_42"])


def test_tokenization_runs_in_dataloader_workers_only_on_a_gpu(monkeypatch):
    """``data.num_workers: ${auto_workers:}``: collate (tokenization) in worker processes when CUDA trains, in the
    main process on a CPU (whose cores the model already uses)."""
    import os

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compose_cfg("train", []).data.num_workers == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert compose_cfg("train", []).data.num_workers == 4
    assert compose_cfg("train", ["scale=paper"]).data.num_workers == 4


def test_table3_evaluates_the_table2_model_of_the_same_cell():
    """Each Table 3 cell (evaluate.py) evaluates the Table 2 model of its objective and seed, at either scale and either
    side (scale=cpu_query_side: the query-side models), on out-of-domain sets only; the zero-shot row is the
    encoder Table 2 started from."""
    for scale, suffix in (("cpu", ""), ("cpu", "-query_side"), ("paper", "")):
        variant = ["scale=" + scale + ("_query_side" if suffix else "")]
        for cell in sweep_cells("table3_ood"):
            trained = [o.replace("objective=", "loss=") for o in cell]
            t2 = compose_cfg("train", ["experiment=table2_homogeneous", *variant, *trained], return_hydra_config=True)
            t3 = compose_cfg("evaluate", ["experiment=table3_ood", *variant, *cell],
                             return_hydra_config=True)
            assert t3.init_from == f"{t2.hydra.sweep.dir}/{t2.hydra.job.override_dirname}/model"
            assert t3.eval.validation is None and t3.eval.references
            assert t3.model.name_or_path == t2.model.name_or_path  # the zero-shot row: the starting encoder
            assert t3.hydra.sweep.dir == f"multirun/table3_ood-{scale}{suffix}"
            assert t3.hydra.job.override_dirname == t2.hydra.job.override_dirname.replace("loss=", "objective=")


@pytest.mark.parametrize("experiment", ["two_tower_wise_ft", "query_side_wise_ft"])
def test_wise_ft_studies_interpolate_each_seed_of_their_job_toward_its_start(experiment):
    """Each WiSE-FT cell (evaluate.py) evaluates the model of its seed of the job it names and interpolates toward
    the encoder that job started from (``wise_ft.start`` null: ``model.name_or_path``); alpha 0 to 1."""
    cells = sweep_cells(experiment)
    assert (sorted({float(dict(o.split("=", 1) for o in c)["wise_ft.alpha"]) for c in cells})
            == [0.0, 0.25, 0.5, 0.75, 1.0])
    trained = experiment.removesuffix("_wise_ft").replace("query_side", "default")
    for cell in cells:
        seed = [o for o in cell if o.startswith("seed=")]
        job = compose_cfg("train", [f"experiment={trained}", *seed], return_hydra_config=True)
        wise = compose_cfg("evaluate", [f"experiment={experiment}", "paths.output_dir=out", *cell])
        assert wise.init_from == f"{job.hydra.sweep.dir}/{job.hydra.job.override_dirname}/model"
        assert wise.wise_ft.start is None and wise.model.name_or_path == job.model.name_or_path


def test_each_job_refuses_the_other_jobs_studies(tmp_path):
    """train.py refuses an evaluation-only study and evaluate.py a training one, naming the command to use."""
    from multipos.evaluate import EvaluationJob
    from multipos.train import TrainingJob

    cfg = compose_cfg("train", ["experiment=table3_ood", f"paths.output_dir={tmp_path}"])
    with pytest.raises(ValueError, match="python evaluate.py -m experiment=table3_ood"):
        TrainingJob.setup(cfg)
    cfg = compose_cfg("evaluate", [f"paths.output_dir={tmp_path}", "job=train", "experiment_name=table2_homogeneous"])
    with pytest.raises(ValueError, match="python train.py -m experiment=table2_homogeneous"):
        EvaluationJob.setup(cfg)
    assert not any(tmp_path.iterdir())


def test_the_main_job_trains_the_recipe_the_search_chose():
    """``make train`` (``experiment=default``) trains what ``conf/recipe/top1.yaml`` (the recipe search's best trial)
    says, as one experiment with no recipe axis: its resolved config equals that of the recipe confirmation's
    ``recipe=top1`` cell (the search's shared settings + the recipe) with the main job's evaluation, so its numbers are
    the recipe's."""
    cfg = compose_cfg("train", ["experiment=default"], return_hydra_config=True)
    assert "recipe" not in cfg.hydra.sweeper.params and str(cfg.hydra.sweeper.params.seed) == "42,43,44"
    run = compose_cfg("train", ["experiment=default", "paths.output_dir=o"])
    recipe = OmegaConf.load(Path(CONF) / "recipe" / "top1.yaml")
    assert run.passages.candidates == recipe.passages.candidates
    assert run.data.max_positives == recipe.data.max_positives and run.data.batch_size == recipe.data.batch_size
    assert run.trainer.max_epochs == recipe.trainer.max_epochs
    assert run.module.optimizer.lr == recipe.module.optimizer.lr
    assert {"override /loss": run.loss.name} in OmegaConf.to_container(recipe.defaults)
    searched = compose_cfg("train", ["experiment=recipe_confirmation", "recipe=top1", "eval=main",
                                     "trainer.precision=${auto_precision:}", "experiment_name=default",
                                     "paths.output_dir=o"])
    drop = ("report", "hydra", "optimized_metric", "reuse_equivalent")
    assert ({k: v for k, v in OmegaConf.to_container(run, resolve=True).items() if k not in drop}
            == {k: v for k, v in OmegaConf.to_container(searched, resolve=True).items() if k not in drop})


def test_the_base_config_is_the_main_job_and_an_override_changes_only_what_it_names():
    def resolved(overrides):
        return OmegaConf.to_container(compose_cfg("train", [*overrides, "paths.output_dir=o"]), resolve=True)

    main = resolved(["experiment=default"])
    assert resolved([]) == main
    seed43 = resolved(["seed=43"])
    assert seed43["seed"] == 43 and {k: v for k, v in seed43.items() if k != "seed"} == \
        {k: v for k, v in main.items() if k != "seed"}
    lsepair = resolved(["loss=lsepair"])  # the objective, and what is named after it (the stage, the run name)
    derived = ("loss", "stages", "run_name")
    assert lsepair["loss"]["name"] == lsepair["stages"]["main"]["objective"] == "lsepair"
    assert {k: v for k, v in lsepair.items() if k not in derived} == {k: v for k, v in main.items() if k not in derived}
    base = resolved(["experiment=base"])  # the groups' defaults: the two-tower LSEPair heterogeneous run
    assert base["loss"]["name"] == "lsepair" and base["passages"]["frozen"] is False
    assert base["experiment_name"] == "base" and main["experiment_name"] == "default"


def test_the_query_side_gpu_variant_sweeps_beside_the_cpu_query_side_study():
    """``scale=cpu_query_side ++scale.suffix=-query_side-gpu`` (bench/gpu/call_studies.sh with FINE_TUNING=query_side):
    multirun/<study>-cpu-query_side-gpu, the CPU query-side run names, another config hash."""
    from multipos.runs.spec import run_key

    cell = ["loss=jointlh", "seed=45"]
    qs = ["scale=cpu_query_side"]
    gpu = ["trainer=gpu", "++scale.suffix=-query_side-gpu"]
    cpu_cfg = compose_cfg("train", ["experiment=table4_heterogeneous", *qs, *cell], return_hydra_config=True)
    gpu_cfg = compose_cfg("train", ["experiment=table4_heterogeneous", *qs, *gpu, *cell], return_hydra_config=True)
    assert cpu_cfg.hydra.sweep.dir.endswith("table4_heterogeneous-cpu-query_side")
    assert gpu_cfg.hydra.sweep.dir == f"{cpu_cfg.hydra.sweep.dir}-gpu"
    assert gpu_cfg.hydra.job.override_dirname == cpu_cfg.hydra.job.override_dirname
    assert gpu_cfg.passages.candidates == cpu_cfg.passages.candidates == "group"
    plain = [compose_cfg("train", ["experiment=table4_heterogeneous", *qs, *extra, *cell, "paths.output_dir=o"])
             for extra in ([], gpu)]
    assert run_key(plain[0]) != run_key(plain[1])


def test_make_studies_query_side_runs_each_study_after_the_ones_it_copies_from():
    """``make studies-query-side``: every listed study exists, and Table 3 (Table 2's models), the figure (Table 2's
    G=8, M=4 cells, Appendix B's first-M G=16 cells) and the candidate set (the figure's group cells) come after the
    studies whose runs they copy or evaluate."""
    makefile = (Path(CONF).parent / "Makefile").read_text()
    listed = makefile.split("QUERY_SIDE_STUDIES =", 1)[1].split("\nstudies-query-side:", 1)[0]
    studies = listed.replace("\\", " ").split() + ["candidate_set"]
    assert set(studies) <= set(EXPERIMENTS)
    assert set(PAPER_TABLES) - {"nfcorpus_recipe_search", "default"} <= set(studies)  # every paper table
    order = {name: i for i, name in enumerate(studies)}
    assert order["table2_homogeneous"] < order["table3_ood"]
    assert max(order["table2_homogeneous"], order["table8_first_vs_random_m"]) < order["figure_ratio_ablation"]
    assert order["figure_ratio_ablation"] < order["candidate_set"]
