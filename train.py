"""Hydra entry point of the main job: python train.py loss=<objective> data=<regime> model=<encoder>."""

import hydra

import multipos  # noqa: F401  (registers OmegaConf resolvers)
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from multipos.train import train

    train(cfg)


if __name__ == "__main__":
    main()
