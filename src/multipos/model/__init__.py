"""The dual encoder and what shapes its inputs and outputs: :mod:`~multipos.model.encoder` (``DualEncoder``: E_q and
E_d, pooling, temperature), :mod:`~multipos.model.settings` (the settings saved with a model),
:mod:`~multipos.model.lora`, :mod:`~multipos.model.export` (the sentence-transformers folder),
:mod:`~multipos.model.tokenization`, :mod:`~multipos.model.packing` (unpadded CPU batches),
:mod:`~multipos.model.interpolation` (WiSE-FT) and :mod:`~multipos.model.transfer` (batches to a device).

Import the module you need; this package imports nothing itself.
"""
