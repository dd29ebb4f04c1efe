"""multipos's multi-positive objectives inside sentence-transformers' trainer (``docs/sentence-transformers.md``).

* :class:`MultiPositiveLoss`, :class:`CachedMultiPositiveLoss` (:mod:`.losses`): the paper's objectives as
  sentence-transformers losses, computed by :func:`multipos.losses.compute` on the masks multipos's own loop builds;
* :class:`MultiPositiveDataCollator` (:mod:`.collator`): rows with any number of positives → batches for them;
* :func:`to_dataset`, :func:`to_rows`, :func:`check_dataset`, :func:`mine_negatives` (:mod:`.data`): the rows' schema,
  multipos's data as such rows, and hard negatives that are never a positive of their query;
* :class:`GroupLayout` (:mod:`.layout`): how a batch tells the loss where each query's positives are.
"""

from multipos.sentence_transformers.collator import EpochCallback, MultiPositiveDataCollator
from multipos.sentence_transformers.data import check_dataset, mine_negatives, to_dataset, to_rows
from multipos.sentence_transformers.layout import GroupLayout
from multipos.sentence_transformers.losses import CachedMultiPositiveLoss, MultiPositiveLoss

__all__ = ["MultiPositiveLoss", "CachedMultiPositiveLoss", "MultiPositiveDataCollator", "EpochCallback", "to_dataset",
           "to_rows", "check_dataset", "mine_negatives", "GroupLayout"]
