"""Hydra entry point of the main job: python train.py loss=<objective> data=<regime> model=<encoder>
or python train.py -m experiment=<study>. Returns ``optimized_metric`` (e.g. dev nDCG@10) to sweepers."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from multipos.config_resolvers import register_eval_sets, register_resolvers

register_resolvers()  # before Hydra composes the config
register_eval_sets(Path(__file__).parent / "conf")  # eval=<set>: one set of conf/benchmark


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from multipos.train import optimized_value, train

    return optimized_value(train(cfg), cfg.get("optimized_metric"))


if __name__ == "__main__":
    main()
