"""The paper's multi-positive objectives as sentence-transformers losses (``SentenceTransformerTrainer``).

Both losses score each query of a batch against every passage of the batch (its own positives and hard negatives and
every other query's, i.e. in-batch negatives), build the masks multipos builds for its own training batches (the
query's positives out of its negatives, and other queries' copies of them too, by passage text:
:class:`multipos.sentence_transformers.layout.GroupLayout`), and hand score matrix and masks to
:func:`multipos.losses.compute` — the one implementation of every objective (paper Sec. 3, Eqs. 1–4, and the
soft-target extensions; each objective's docstring in :mod:`multipos.losses` gives its equation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import cos_sim
from torch import Tensor, nn

from multipos.losses import SINGLE_POSITIVE, SOFT_OBJECTIVES, check_name, compute
from multipos.sentence_transformers.layout import GroupLayout
from multipos.training.grad_cache import ChunkRNG

__all__ = ["MultiPositiveLoss", "CachedMultiPositiveLoss"]

#: Objectives these losses cannot train: ``margin_mse`` needs a teacher's score of every passage (use
#: sentence-transformers' ``MarginMSELoss``).
UNSUPPORTED = {"margin_mse": "it needs a teacher's score of every passage: use sentence_transformers' MarginMSELoss"}

_PAPER = """
@inproceedings{wang2026multipos,
    title={Training Dense Retrievers with Multiple Positive Passages},
    author={Wang and others},
    booktitle={Proceedings of the ACM SIGKDD Conference on Knowledge Discovery and Data Mining (KDD '26)},
    year={2026},
    eprint={2602.12727},
    archivePrefix={arXiv},
}
"""


def _similarity_name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


class MultiPositiveLoss(nn.Module):
    def __init__(self, model: SentenceTransformer, objective: str = "jointlh", temperature: float = 0.05,
                 similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim,
                 normalize_by_positives: bool = False) -> None:
        """
        A multi-positive contrastive objective of multipos (``conf/loss/<objective>.yaml``) for batches in which each
        query has any number of positive passages and hard negatives.

        For query i of the batch, the scores s_ij = similarity(q_i, d_j) / τ go to every passage j of the batch (the
        queries' positives and hard negatives, all flattened); D+_i are query i's positives, D−_i every other passage
        except copies of a positive of query i (the same text in another query's group, which would be a false
        negative); the objective of :func:`multipos.losses.compute` turns them into a loss per query, and the batch loss
        is the mean over queries (:class:`multipos.losses.ContrastiveLoss`). The objectives (paper Sec. 3):

        - ``singlelh`` / ``rand1lh``: InfoNCE on the first / a random positive, Eq. 1 (the collator keeps that one);
        - ``jointlh``: −1/|D+| Σ_p log P(p | q), Eq. 2; ``summarglh``: −log Σ_p P(p | q), Eq. 3;
        - ``lsepair``: log(1 + Σ_p Σ_n exp(s_n − s_p)), Eq. 4, and its variants ``lsepair_maxp``, ``lsepair_minp``,
          ``lsepair_maxn``, ``lsepair_minp_maxn`` (Sec. 5);
        - ``recontriever``: ReContriever's relevance-reweighted likelihood (Lei et al. 2023);
        - grade-weighted (soft-target, need a ``grades`` column): ``jointlh_weighted``, ``summarglh_weighted``, ``kl``.

        Args:
            model: SentenceTransformer model.
            objective: the objective's name (:data:`multipos.losses.OBJECTIVES` or the soft-target ones in
                :data:`multipos.losses.SOFT_OBJECTIVES`, but ``margin_mse``).
            temperature: τ > 0; the similarities are multiplied by ``scale`` = 1/τ (multipos's ``model.temperature``;
                MultipleNegativesRankingLoss's ``scale=20`` is τ = 0.05, the default).
            similarity_fct: similarity of query and passage embeddings, ``cos_sim`` (default: multipos's
                ``model.normalize=true``) or ``dot_score`` (``normalize=false``).
            normalize_by_positives: divide each query's loss by |D+| (paper Sec. 3; ``loss.normalize_by_positives``).

        References:
            - Training Dense Retrievers with Multiple Positive Passages (Wang et al., KDD '26), Sec. 3:
              https://arxiv.org/abs/2602.12727
            - The objectives' equations: the docstrings of :mod:`multipos.losses`.

        Requirements:
            1. Batches from :class:`multipos.sentence_transformers.MultiPositiveDataCollator` (the trainer's
               ``data_collator``; built with ``objective=...`` for ``singlelh`` / ``rand1lh``).
            2. Rows with a ``query``, a ``positives`` list and optionally ``negatives`` and ``grades`` lists
               (:mod:`multipos.sentence_transformers.data`); ``grades`` for the soft-target objectives.

        Inputs:
            +----------------------------------------------------------------+-----------------------------+
            | Inputs                                                         | Labels                      |
            +================================================================+=============================+
            | (query, [positive_1, ..., positive_P], [negative_1, ...]) rows | the collator's batch layout |
            +----------------------------------------------------------------+-----------------------------+

        Relations:
            - With one positive per query every objective but the ``maxn`` variants is InfoNCE, i.e.
              :class:`sentence_transformers.losses.MultipleNegativesRankingLoss` with ``scale = 1/temperature`` (the
              same value when the batch holds no duplicate texts, which MNRL would count as negatives).
            - :class:`CachedMultiPositiveLoss` computes the same loss and gradient with GradCache, for large batches.
            - multipos's own loop (:class:`multipos.training.module.RetrieverModule`) computes the same loss from the
              same masks (``tests/sentence_transformers/test_losses.py``).

        Raises:
            ValueError: an unknown or unsupported objective, τ ≤ 0; at the first batch, a batch not from the collator,
                a row without a positive, several positives in a row for ``singlelh`` / ``rand1lh``; for a soft-target
                objective, a batch without grades.

        Example:
            ::

                from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
                from datasets import Dataset
                from multipos.sentence_transformers import MultiPositiveDataCollator, MultiPositiveLoss

                model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
                train_dataset = Dataset.from_dict({
                    "query": ["what lowers cholesterol", "does sleep affect memory"],
                    "positives": [["Statins lower LDL.", "Fiber lowers cholesterol."], ["Sleep consolidates memory."]],
                    "negatives": [["Calcium builds bone."], ["Fruit is rich in fiber."]],
                })
                loss = MultiPositiveLoss(model, objective="jointlh", temperature=0.05)
                collator = MultiPositiveDataCollator(model.preprocess, max_positives=4, group_size=8)
                trainer = SentenceTransformerTrainer(model=model, train_dataset=train_dataset, loss=loss,
                                                     data_collator=collator)
                trainer.train()
        """
        super().__init__()
        check_name(objective)
        if objective in UNSUPPORTED:
            raise ValueError(f"objective {objective!r} is not available here: {UNSUPPORTED[objective]}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.model = model
        self.objective = objective
        self.temperature = float(temperature)
        self.similarity_fct = similarity_fct
        self.normalize_by_positives = normalize_by_positives
        self.checked = False

    @property
    def scale(self) -> float:
        """1/τ, the factor of the similarities (MultipleNegativesRankingLoss's ``scale``)."""
        return 1.0 / self.temperature

    @property
    def soft(self) -> bool:
        """Whether the objective reads target weights (:data:`multipos.losses.SOFT_OBJECTIVES`)."""
        return self.objective in SOFT_OBJECTIVES

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor) -> Tensor:
        """Embed the two inputs (queries [B, Lq], passages [N, Lp]) and return the batch's mean loss (a scalar)."""
        features = self._two(sentence_features)
        q = self.model(features[0])["sentence_embedding"]
        p = self.model(features[1])["sentence_embedding"]
        return self.compute_loss_from_embeddings([q, p], labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor) -> Tensor:
        """Mean loss over queries of query embeddings [B, H] and passage embeddings [N, H] (``embeddings``) under
        the batch layout ``labels`` (:class:`~multipos.sentence_transformers.layout.GroupLayout`). The loss is in
        the dtype rule of :func:`multipos.losses.compute` (float64 embeddings give a float64 loss)."""
        q, p = embeddings
        layout = self.layout(labels, q, p)
        return self.rows_loss(q, p, layout, slice(None))

    def layout(self, labels: Tensor, q: Tensor, p: Tensor) -> GroupLayout:
        """The batch's :class:`~multipos.sentence_transformers.layout.GroupLayout` on the embeddings' device, checked:
        its header, a positive in every row and, for ``singlelh`` / ``rand1lh``, only one, at the first batch (a host
        read);
        for a soft-target objective, the presence of grades at every batch. Raises ValueError as the class says."""
        layout = GroupLayout.unpack(labels, q.shape[0], p.shape[0], check=not self.checked).to(q.device)
        if not self.checked and bool((layout.positives < 1).any()):
            rows = (layout.positives < 1).nonzero().flatten().tolist()[:10]
            raise ValueError(f"objective {self.objective!r}: query rows {rows} of the batch have no positive")
        if not self.checked and self.objective in SINGLE_POSITIVE and bool((layout.positives > 1).any()):
            raise ValueError(f"objective {self.objective!r} trains on one positive per query, but the batch has "
                             f"rows with several: build the collator with MultiPositiveDataCollator(..., "
                             f"objective={self.objective!r}) (it keeps the {SINGLE_POSITIVE[self.objective]!r} one)")
        if self.soft and bool(torch.isnan(layout.weights[layout.positive_columns()]).any()):
            raise ValueError(f"objective {self.objective!r} weighs each positive by its grade: the dataset needs a "
                             "'grades' column (one number per positive) in every row")
        self.checked = True
        return layout

    def rows_loss(self, q: Tensor, p: Tensor, layout: GroupLayout, rows: slice) -> Tensor:
        """Σ over the queries in ``rows`` of their loss, divided by B: the share of those rows in the batch's mean loss
        (:func:`multipos.losses.compute` on the scores [R, N] = similarity(q[rows], p) · scale and the rows' masks)."""
        positive_mask, negative_mask, target = layout.masks(rows)
        scores = self.similarity_fct(q[rows], p) * self.scale
        per_query = compute(self.objective, scores, positive_mask, negative_mask, self.normalize_by_positives,
                            check_rows=False, target=target if self.soft else None)
        return per_query.sum() / layout.n_queries

    @staticmethod
    def _two(sentence_features: Iterable[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
        features = list(sentence_features)
        if len(features) != 2:
            raise ValueError(f"expected two inputs (queries, passages) from MultiPositiveDataCollator, got "
                             f"{len(features)}: pass data_collator=MultiPositiveDataCollator(model.preprocess, ...)")
        return features

    def get_config_dict(self) -> dict[str, Any]:
        """The settings, for the model card."""
        return {"objective": self.objective, "temperature": self.temperature,
                "similarity_fct": _similarity_name(self.similarity_fct),
                "normalize_by_positives": self.normalize_by_positives}

    @property
    def citation(self) -> str:
        """BibTeX of the paper whose objectives these are."""
        return _PAPER


def _row_chunks(features: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """Tokenizer features (tensors [n, …], other values as they are) → chunks of at most ``size`` rows (fresh dicts:
    a model's forward writes its outputs into the dict it is given)."""
    if size < 1:
        raise ValueError(f"mini_batch_size must be >= 1, got {size}")
    tensors = [v for v in features.values() if torch.is_tensor(v) and v.dim() > 0]
    n = features["input_ids"].shape[0] if "input_ids" in features else tensors[0].shape[0]
    return [{k: v[i: i + size] if torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == n else v
             for k, v in features.items()} for i in range(0, n, size)]


class CachedMultiPositiveLoss(MultiPositiveLoss):
    def __init__(self, model: SentenceTransformer, objective: str = "jointlh", temperature: float = 0.05,
                 similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim, normalize_by_positives: bool = False,
                 mini_batch_size: int = 32) -> None:
        """
        :class:`MultiPositiveLoss` with GradCache (Gao et al. 2021): the same loss and the same gradient, with the
        activation memory of ``mini_batch_size`` texts, so that batches far larger than the device holds train (as
        :class:`sentence_transformers.losses.CachedMultipleNegativesRankingLoss` does for MNRL).

        The loss depends on the parameters only through the embeddings, so (:mod:`multipos.training.grad_cache`):
        (1) every query and passage is embedded in chunks of ``mini_batch_size`` rows without an autograd graph, the
        random-number state recorded before each chunk; (2) the loss is computed on those embeddings, in chunks of
        ``mini_batch_size`` query rows against all N passages (each query's loss needs only its own row of scores), and
        its gradient g_j with respect to every embedding is kept; (3) during the trainer's backward each chunk is
        embedded again from its recorded random-number state (the same dropout masks) and ``Σ_j ⟨f(x_j), g_j⟩`` is
        back-propagated, whose parameter gradient is that chunk's share of the exact gradient. Cost: one extra
        forward pass without graph.

        Args:
            model, objective, temperature, similarity_fct, normalize_by_positives: as :class:`MultiPositiveLoss`.
            mini_batch_size: rows per embedding chunk and per loss chunk (memory, not the result).

        References:
            - Gao, Zhang, Han, Callan (2021), Scaling Deep Contrastive Learning Batch Size under Memory Limited
              Setup, Sec. 3.2: https://arxiv.org/abs/2101.06983
            - Training Dense Retrievers with Multiple Positive Passages (Wang et al., KDD '26), Sec. 3.

        Requirements:
            1. As :class:`MultiPositiveLoss`; use a large ``per_device_train_batch_size`` and a small
               ``mini_batch_size``.

        Inputs:
            +----------------------------------------------------------------+-----------------------------+
            | Inputs                                                         | Labels                      |
            +================================================================+=============================+
            | (query, [positive_1, ..., positive_P], [negative_1, ...]) rows | the collator's batch layout |
            +----------------------------------------------------------------+-----------------------------+

        Relations:
            - Equal to :class:`MultiPositiveLoss` in loss and gradient (``tests/sentence_transformers/test_losses.py``);
              multipos's own GradCache is ``module.grad_cache_chunk_size`` (:mod:`multipos.training.grad_cache`).

        Raises:
            ValueError: as :class:`MultiPositiveLoss`; ``mini_batch_size`` < 1.

        Example:
            ::

                loss = CachedMultiPositiveLoss(model, objective="lsepair", mini_batch_size=32)
                trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_dataset, loss=loss,
                                                     data_collator=MultiPositiveDataCollator(model.preprocess))
        """
        super().__init__(model, objective, temperature, similarity_fct, normalize_by_positives)
        if int(mini_batch_size) < 1:
            raise ValueError(f"mini_batch_size must be >= 1, got {mini_batch_size}")
        self.mini_batch_size = int(mini_batch_size)

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor) -> Tensor:
        """Passes (1) and (2) of the class docstring → the batch's mean loss (a scalar leaf whose backward runs pass
        (3)); without gradients (evaluation) the plain loss, embedded in chunks."""
        features = self._two(sentence_features)
        grad = torch.is_grad_enabled()
        embeddings, states = [], []
        with torch.no_grad():
            for feats in features:
                parts, side_states = [], []
                for chunk in _row_chunks(feats, self.mini_batch_size):
                    if grad:  # only a backward replays the forward
                        side_states.append(ChunkRNG.capture([v for v in chunk.values() if torch.is_tensor(v)]))
                    parts.append(self.model(chunk)["sentence_embedding"])
                embeddings.append(torch.cat(parts))
                states.append(side_states)
        if not grad:
            return self.compute_loss_from_embeddings(embeddings, labels)
        leaves = [e.detach().requires_grad_() for e in embeddings]
        q, p = leaves
        with torch.enable_grad():
            layout = self.layout(labels, q, p)
            total = torch.zeros((), dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
            for start in range(0, layout.n_queries, self.mini_batch_size):
                part = self.rows_loss(q, p, layout, slice(start, start + self.mini_batch_size))
                part.backward()
                total = total + part.detach()
        cache = [torch.zeros_like(leaf) if leaf.grad is None else leaf.grad for leaf in leaves]
        loss = total.requires_grad_()
        loss.register_hook(partial(self._replay, features, states, cache))
        return loss

    def _replay(self, features: list[dict[str, Tensor]], states: list[list[ChunkRNG]], cache: list[Tensor],
                grad_output: Tensor) -> None:
        """Pass (3): re-embed every chunk from its recorded random-number state and back-propagate ⟨f(x), g⟩ scaled by
        the gradient the trainer's backward hands the loss (gradient accumulation, fp16 loss scaling). A
        data-parallel model synchronises its gradients once, at the last chunk."""
        no_sync = getattr(self.model, "no_sync", None)
        jobs = []
        for feats, side_states, grads in zip(features, states, cache):
            start = 0
            for chunk, state in zip(_row_chunks(feats, self.mini_batch_size), side_states):
                n = next(v for v in chunk.values() if torch.is_tensor(v) and v.dim() > 0).shape[0]
                jobs.append((chunk, state, grads[start: start + n]))
                start += n
        with torch.enable_grad():
            for k, (chunk, state, grads) in enumerate(jobs):
                last = k == len(jobs) - 1
                with nullcontext() if last or no_sync is None else no_sync():
                    with state.restored():
                        emb = self.model(chunk)["sentence_embedding"]
                    dtype = torch.promote_types(emb.dtype, torch.float32)
                    surrogate = (emb.to(dtype) * grads.to(dtype)).sum() * grad_output.to(dtype)
                    surrogate.backward()

    def get_config_dict(self) -> dict[str, Any]:
        """The settings, for the model card."""
        return {**super().get_config_dict(), "mini_batch_size": self.mini_batch_size}

    @property
    def citation(self) -> str:
        """BibTeX of the paper and of GradCache."""
        return _PAPER + """
@misc{gao2021scaling,
    title={Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup},
    author={Luyu Gao and Yunyi Zhang and Jiawei Han and Jamie Callan},
    year={2021},
    eprint={2101.06983},
    archivePrefix={arXiv},
}
"""

