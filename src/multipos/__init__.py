"""multipos: training dense retrievers with multiple positive passages per query.

Modules: ``losses`` (objectives), ``groups`` (group construction and masks), ``readers`` (file
formats), ``sources`` (training data), ``data`` (LightningDataModule), ``model`` (dual encoder),
``module`` (LightningModule), ``retrieval`` (encoding + FAISS), ``evaluation`` (ranx metrics),
``train`` / ``evaluate`` (the jobs behind ``train.py`` / ``evaluate.py``).
"""

from omegaconf import OmegaConf

__version__ = "0.1.0"

# ${basename:<path>} → last path component (used in run names of evaluate.py).
OmegaConf.register_new_resolver("basename", lambda path: str(path).rstrip("/").split("/")[-1], replace=True)
