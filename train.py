"""Hydra entry point of training.

    python train.py [overrides]                       # the main job, one seed (conf/train.yaml: experiment=default);
                                                      # an override changes only what it names (seed=43)
    python train.py experiment=<study> [overrides]    # one cell of a study (conf/experiment/<study>.yaml)
    python train.py -m experiment=<study>             # the study's sweep
    python train.py experiment=base loss=<objective> data=<data> ...  # the groups' defaults (conf/experiment/base.yaml)

Returns ``optimized_metric`` (e.g. dev nDCG@10) to sweepers.
"""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from multipos.config_resolvers import register_eval_sets, register_resolvers

register_resolvers()  # before Hydra composes the config
register_eval_sets(Path(__file__).parent / "conf")  # eval=<set>: one set of conf/benchmark


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from multipos.assets import stop_on_missing_asset
    from multipos.train import optimized_value, train

    with stop_on_missing_asset():  # a missing dataset or model: its message and exit status 1, no traceback
        return optimized_value(train(cfg), cfg.get("optimized_metric"))


if __name__ == "__main__":
    main()
