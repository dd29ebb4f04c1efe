"""Hydra entry point of training.

    python train.py                                   # the main job, one seed (experiment=default)
    python train.py experiment=<study> [overrides]    # one cell of a study (conf/experiment/<study>.yaml)
    python train.py -m experiment=<study>             # the study's sweep
    python train.py loss=<objective> data=<data> ...  # an ad-hoc run from the base config

Returns ``optimized_metric`` (e.g. dev nDCG@10) to sweepers.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from multipos.config_resolvers import register_eval_sets, register_resolvers

register_resolvers()  # before Hydra composes the config
register_eval_sets(Path(__file__).parent / "conf")  # eval=<set>: one set of conf/benchmark


def with_default_experiment(argv: list[str]) -> list[str]:
    """``argv`` with ``experiment=default`` added when it holds no argument at all (the main job)."""
    return [*argv, "experiment=default"] if len(argv) == 1 else argv


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from multipos.assets import stop_on_missing_asset
    from multipos.train import optimized_value, train

    with stop_on_missing_asset():  # a missing dataset or model: its message and exit status 1, no traceback
        return optimized_value(train(cfg), cfg.get("optimized_metric"))


if __name__ == "__main__":
    sys.argv = with_default_experiment(sys.argv)
    main()
