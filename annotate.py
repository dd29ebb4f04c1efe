"""Hydra entry point of the annotation pipeline: ``python annotate.py data.path=<BEIR folder> judge.model=<name>``
(``conf/annotate.yaml``, docs/annotation.md)."""

import hydra
from omegaconf import DictConfig

from multipos.config_resolvers import register_resolvers

register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="annotate")
def main(cfg: DictConfig) -> None:
    from multipos.annotate.job import annotate

    annotate(cfg)


if __name__ == "__main__":
    main()
