"""Hydra entry point: python evaluate.py model.name_or_path=<HF checkpoint dir> eval=<set>[,<set>...]."""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from multipos.config_resolvers import register_eval_sets, register_resolvers

register_resolvers()  # before Hydra composes the config
register_eval_sets(Path(__file__).parent / "conf")  # eval=<set>: one set of conf/benchmark


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from multipos.assets import stop_on_missing_asset
    from multipos.evaluate import evaluate

    with stop_on_missing_asset():  # a missing dataset or model: its message and exit status 1, no traceback
        evaluate(cfg)


if __name__ == "__main__":
    from multipos.evaluate import set_list_override

    sys.argv = set_list_override(sys.argv)
    main()
