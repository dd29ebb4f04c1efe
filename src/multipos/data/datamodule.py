"""LightningDataModule: training groups → tokenised batches with positive/negative masks."""

from __future__ import annotations

import logging
from dataclasses import replace

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from multipos.data.budget import AnnotationBudget
from multipos.data.collate import Batch, GroupCollator
from multipos.data.groups import REGIME_RULES, REGIMES, Group, GroupBuilder, TrainQuery, negative_shortfall
from multipos.data.loader import EpochSampler, ResumableLoader, WorkerInit, worker_start_method
from multipos.data.passage_tokens import PassageTokens

log = logging.getLogger(__name__)


class GroupDataset(Dataset):
    """Map-style dataset of training groups, indexed by ``(i, epoch)`` pairs from :class:`EpochSampler`.

    The epoch travels with the index, so random choices (Rand1LH draws, random-M, sampled hard negatives)
    are re-drawn every epoch whatever the trainer's dataloader-reload setting, in worker processes too.
    ``pools``: {query id → hard negatives} that replace the queries' own (a dense refresh), or None.
    """

    def __init__(self, queries: list[TrainQuery], regime: str, builder: GroupBuilder, fallback_ids: list[str]):
        self.items = [(q, q.positives(regime)) for q in queries]
        self.items = [(q, pos) for q, pos in self.items if pos]
        self.builder, self.fallback_ids = builder, fallback_ids
        self.pools: dict[str, list[str]] | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key: tuple[int, int]) -> Group:
        i, epoch = key
        q, pos = self.items[i]
        if self.pools is not None and q.query_id in self.pools:
            q = replace(q, negatives=self.pools[q.query_id])
        return self.builder.build(q, pos, epoch, self.fallback_ids)


class MultiPosDataModule(L.LightningDataModule):
    """Training data for multi-positive contrastive learning.

    Args:
        source: object with ``load() -> (Corpus, list[TrainQuery])`` (see :mod:`multipos.data.sources`).
        name: label used in run names.
        tokenizer: HF checkpoint name/path whose tokenizer is used (normally ``${model.name_or_path}``).
        regime: positive regime (``homogeneous`` | ``heterogeneous`` | ``gold`` | ``all``) until a stage sets its
            own with :meth:`set_stage` (training always does: the stage plan of ``regime=<name>``, ``conf/regime``).
        group_size: G; max_positives: M; positive_selection: ``first`` | ``random``;
        negative_selection: ``first`` | ``random`` (hard negatives per epoch).
        batch_size: queries per batch (B); query_max_length, passage_max_length: tokens.
        budget: annotation-budget allocation ``{positives_per_query, query_fraction, seed, pool_min_positives}``
            (:class:`multipos.data.budget.AnnotationBudget`), or None for every query with all its positives.
        seed: seed for group construction and shuffling; num_workers: DataLoader workers.

    ``encoder``: the :class:`multipos.model.encoder.DualEncoder` being trained, whose tokenizer and prompts the
    batches use (:meth:`use_encoder_inputs`; None: ``tokenizer`` and no prompts). ``tokenize_passages`` (default
    True): False under query-side fine-tuning, whose batches carry the passages' ids alone (``Batch.passages`` None)
    because their embeddings come from the frozen passage index.
    ``pin_memory`` (attribute, default False): the training ``DataLoader``'s own pin-memory thread receives each batch
    from the workers and pins it (:meth:`Batch.pin_memory`), instead of the main process when it moves the batch;
    not a config setting yet: ``bench/bench_speed.py`` times it against the default on a GPU (docs/gpu.md).

    Every failure of the data is reported before training starts (:meth:`steps_per_epoch`, :meth:`setup`):
    training queries without a positive under the stage's regime are skipped with a warning giving their
    number and examples; queries whose mined hard negatives cannot fill G are topped up with random corpus
    passages, likewise counted and logged (``stats``: ``skipped_no_positive``, ``topped_up_negatives``).

    Raises:
        ValueError: unknown regime, impossible G/M (G < 2, M < 1, M ≥ G), a bad budget (m < 1, f outside (0, 1]),
            no training query left under the regime (an empty split), a group that the corpus cannot fill, or a
            tokenizer with more tokens than the model's embedding rows.
    """

    def __init__(self, source, tokenizer: str, name: str = "", regime: str = "heterogeneous", group_size: int = 8,
                 max_positives: int = 4, positive_selection: str = "first", negative_selection: str = "random",
                 batch_size: int = 16, query_max_length: int = 32, passage_max_length: int = 128,
                 budget: dict | None = None, seed: int = 0, num_workers: int = 0, encoder=None,
                 tokenize_passages: bool = True):
        super().__init__()
        if regime not in REGIMES:
            hint = " (the curriculum is a stage plan: regime=curriculum)" if regime == "curriculum" else ""
            raise ValueError(f"unknown regime {regime!r}; allowed: {', '.join(REGIMES)}{hint}")
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {batch_size}")
        self.source, self.tokenizer_name, self.regime, self.name = source, tokenizer, regime, name
        self.stage_regime = regime
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.pin_memory = False
        self.query_max_length, self.passage_max_length = query_max_length, passage_max_length
        self.single_positive: str | None = None
        self.budget = dict(budget) if budget else None
        self._budget = AnnotationBudget.from_config(self.budget) if self.budget else None  # checked now
        self.builder_args = dict(group_size=group_size, max_positives=max_positives,
                                 positive_selection=positive_selection, negative_selection=negative_selection)
        GroupBuilder(**self.builder_args)  # validate G/M and selection names now, not at the first batch
        self.corpus = None
        self.queries: list[TrainQuery] = []
        self._tokenizer = None
        self.dataset: GroupDataset | None = None
        self.stats: dict = {}
        self.negative_pools: dict[str, list[str]] | None = None
        #: False under query-side fine-tuning: batches carry passage ids only (looked up in the frozen index)
        self.tokenize_passages = tokenize_passages
        #: text put before every query / passage (the trained model's prompts: :meth:`use_encoder_inputs`)
        self.query_prompt, self.passage_prompt = "", ""
        #: the training passages tokenised once (:meth:`passage_tokens`), and what its last call answered for
        self._passage_tokens: PassageTokens | None = None
        self._passage_tokens_for: tuple | None = None
        if encoder is not None:
            self.use_encoder_inputs(encoder)

    def use_encoder_inputs(self, model) -> None:
        """Tokenise as ``model`` (a :class:`multipos.model.encoder.DualEncoder`) does: its tokenizer (with the EOS rule
        of
        last-token pooling) and its query / passage prompts, so training sees the inputs evaluation and
        sentence-transformers see (the constructor's ``encoder`` calls it)."""
        self._tokenizer = model.tokenizer
        self.query_prompt, self.passage_prompt = model.query_prompt, model.passage_prompt

    def set_stage(self, regime: str, single_positive: str | None) -> None:
        """Select the positive regime and the single-positive rule of the next stage (from its stage config); the
        stage starts from the source's hard negatives."""
        if regime not in REGIMES:
            raise ValueError(f"unknown regime {regime!r}; allowed: {', '.join(REGIMES)}")
        self.stage_regime, self.single_positive = regime, single_positive
        self.dataset, self.negative_pools = None, None

    def set_negatives(self, pools: dict[str, list[str]] | None) -> None:
        """Build groups from ``pools`` ({query id → hard negatives, best first}) instead of the source's mined
        negatives from the next group on (the dense refresh, :class:`multipos.training.callbacks.NegativeRefresh`);
        None goes back to the source's. Queries absent from ``pools`` keep theirs."""
        self.negative_pools = pools
        if self.dataset is not None:
            self.dataset.pools = pools

    @property
    def tokenizer(self):
        """The Hugging Face tokenizer named by the ``tokenizer`` argument, loaded on first use (a DataLoader worker
        that receives this module pickled loads its own)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            from multipos.assets import resolve_model

            self._tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.tokenizer_name))
        return self._tokenizer

    def training_queries(self, regime: str | None = None) -> list[TrainQuery]:
        """The training queries of ``regime`` (default: the current stage's) after the budget, if any."""
        regime = regime or self.stage_regime
        if self.corpus is None:
            self.corpus, self.queries = self.source.load()
        if self._budget is None:
            return self.queries
        return self._budget.apply(self.queries, regime)

    def steps_per_epoch(self, regime: str | None = None, world_size: int = 1) -> int:
        """Optimizer steps in one epoch of ``regime`` (batches, last partial batch dropped when full ones exist),
        on each of ``world_size`` data-parallel ranks (:class:`EpochSampler`).

        Raises ValueError when no training query has a positive under ``regime`` (an empty split)."""
        regime = regime or self.stage_regime
        queries = self.training_queries(regime)
        n = sum(1 for q in queries if q.positives(regime))
        if n == 0:
            raise ValueError(self._empty_message(regime, len(queries)))
        n = -(-n // world_size)  # queries per rank (EpochSampler)
        return n // self.batch_size if n >= self.batch_size else 1

    def _empty_message(self, regime: str, n_queries: int) -> str:
        budget = " after data.budget" if self.budget else ""
        queries = self.training_queries(regime)
        gold, silver = sum(len(q.gold) for q in queries), sum(len(q.silver) for q in queries)
        return (f"no training query has a positive under regime {regime!r} (regime=<name>, conf/regime): "
                f"none of the {n_queries} queries of data.source{budget} has one (an empty split); the data hold "
                f"{gold} gold and {silver} silver positive labels, and {REGIME_RULES.get(regime, regime)}")

    def regime_summary(self, regime: str, kept_queries: int, labels: int) -> str:
        """One line for the log: what ``regime`` keeps of the training data and what it drops, and why."""
        queries = self.training_queries(regime)
        gold, silver = sum(len(q.gold) for q in queries), sum(len(q.silver) for q in queries)
        dropped = gold + silver - labels
        rule = REGIME_RULES.get(regime, regime)
        why = f"{dropped} positive labels not used ({rule})" if dropped else "every label used"
        return (f"regime {regime}: {kept_queries} of {len(queries)} training queries, {labels} of {gold} gold + "
                f"{silver} silver positive labels; {why}")

    def setup(self, stage: str | None = None) -> None:
        if self.dataset is None:
            queries = self.training_queries()
            builder = GroupBuilder(**self.builder_args, single_positive=self.single_positive,
                                   pin_first=self.stage_regime == "heterogeneous", seed=self.seed)
            dataset = GroupDataset(queries, self.stage_regime, builder, self.corpus.ids)
            dataset.pools = self.negative_pools
            if len(dataset) == 0:
                raise ValueError(self._empty_message(self.stage_regime, len(queries)))
            kept = {q.query_id for q, _ in dataset.items}
            log.info(self.regime_summary(self.stage_regime, len(dataset), sum(len(pos) for _, pos in dataset.items)))
            skipped = [q.query_id for q in queries if q.query_id not in kept]
            if skipped:
                log.warning("regime %s: skipped %d of %d training queries with no positive under it, e.g. %s",
                            self.stage_regime, len(skipped), len(queries), skipped[:5])
            short = negative_shortfall(builder, dataset.items, self.corpus.ids)
            if short:
                example = next(iter(short.items()))
                log.warning("%d of %d training queries have fewer mined hard negatives than their group needs "
                            "(G=%d minus positives); random corpus passages fill the rest, e.g. %r lacks %d",
                            len(short), len(dataset), builder.group_size, *example)
            self.dataset = dataset
            labels = sum(len(pos) for _, pos in self.dataset.items)
            self.stats = {"regime": self.stage_regime, "training_queries": len(self.dataset),
                          "positive_labels": labels, "all_queries": len(self.queries), "budget": self.budget,
                          "skipped_no_positive": len(skipped), "topped_up_negatives": len(short)}
            if getattr(self.source, "filter_counts", None):  # positive-aware filtering of the mined negatives
                self.stats["negative_filter"] = dict(self.source.filter_counts)
            if getattr(self.source, "teacher_counts", None):  # teacher scores as soft targets
                self.stats["teacher_scores"] = dict(self.source.teacher_counts)
            if getattr(self.source, "noise_counts", None):  # controlled label noise (multipos.data.label_noise)
                self.stats["label_noise"] = dict(self.source.noise_counts)
            log.info("regime %s: %d of %d training queries, %d positive labels%s", self.stage_regime,
                     len(self.dataset), len(self.queries), labels, f" (budget {self.budget})" if self.budget else "")
            shares = self.truncated_shares()
            self.stats["truncated"] = shares
            log.info("lengths: query_max_length %d truncates %.1f%% of the training queries, passage_max_length %d "
                     "%.1f%% of the corpus passages (a sample of at most 5,000)", self.query_max_length,
                     100 * shares["queries"], self.passage_max_length, 100 * shares["passages"])

    def truncated_shares(self, sample: int = 5000) -> dict[str, float]:
        """Share (0-1) of the training queries longer than ``query_max_length`` tokens and of the corpus passages
        (a seeded sample of at most ``sample``) longer than ``passage_max_length``, prompts and special tokens
        included: what the lengths set by hand cut off."""
        import random

        queries = [f"{self.query_prompt or ''}{q.query}" for q, _ in self.dataset.items]
        ids = list(self.corpus.ids)
        if len(ids) > sample:
            ids = random.Random(0).sample(ids, sample)
        passages = [f"{self.passage_prompt or ''}{t}" for t in self.corpus.texts(ids)]
        out = {}
        for name, texts, limit in (("queries", queries, self.query_max_length),
                                   ("passages", passages, self.passage_max_length)):
            lengths = ([len(x) for x in self.tokenizer(texts, truncation=False, verbose=False)["input_ids"]]
                       if texts else [])
            out[name] = sum(n > limit for n in lengths) / len(lengths) if lengths else 0.0
        return out

    def collate(self, groups: list[Group]) -> Batch:
        """Tokenise a list of groups and build the [B, B·G] masks (:class:`GroupCollator` with today's settings)."""
        return self.collator()(groups)

    def collator(self, keep_groups: bool = True) -> "GroupCollator":
        """The collate function of the training loader: the tokenizer, corpus, prompts and lengths, without the
        data module (whose trainer does not pickle), so DataLoader workers started by ``spawn`` or ``forkserver``
        receive it. Two-tower batches take their passages' token ids from :meth:`passage_tokens`. ``keep_groups``:
        whether each batch carries its groups (:class:`GroupCollator`)."""
        return GroupCollator(self.tokenizer, self.corpus, self.query_prompt, self.passage_prompt,
                             self.query_max_length, self.passage_max_length, self.tokenize_passages,
                             self.passage_tokens() if self.tokenize_passages else None, keep_groups)

    def passage_tokens(self) -> PassageTokens | None:
        """The store of the passages the current stage's groups draw from (every kept query's positives and hard
        negatives: the source's, or a dense refresh's pools), tokenised in this process before any DataLoader worker
        starts; new ones are added when the stage or the pools change, and a new store is made when the tokenizer,
        passage prompt or length change. Random top-ups from the corpus are tokenised when collated.

        None (batches tokenise their texts, as without a store) when the store would tokenise more passages than one
        epoch collates on this rank (queries / ranks × G): large pools split over many data-parallel ranks (MS MARCO's
        ~30 mined negatives a query over 8 GPUs), where every rank building its own store up front would cost more
        than tokenising in the DataLoader workers while the GPU trains."""
        dataset = self.dataset
        if dataset is None:
            return None
        world_size = self.trainer.world_size if self.trainer is not None else 1
        settings = (self.tokenizer, self.passage_prompt, self.passage_max_length, world_size)
        done = self._passage_tokens_for  # (dataset, pools, settings, the answer) of the last call
        if done is not None and done[0] is dataset and done[1] is dataset.pools and done[2] == settings:
            return done[3]
        store = self._passage_tokens
        if store is None or not store.matches(*settings[:3]):
            store = PassageTokens(self.tokenizer, self.corpus, self.passage_prompt, self.passage_max_length)
        pools = dataset.pools or {}
        pooled = dict.fromkeys(p for q, pos in dataset.items for p in (*pos, *pools.get(q.query_id, q.negatives)))
        per_epoch = -(-len(dataset) // world_size) * self.builder_args["group_size"]
        new = [p for p in pooled if p not in store.rows]
        if len(new) > per_epoch:
            log.info("passage tokens: no store (%d passages to tokenise, more than the %d an epoch collates on this "
                     "rank): batches tokenise their texts", len(new), per_epoch)
            store = None
        else:
            store.add(new)
            self._passage_tokens = store
        self._passage_tokens_for = (dataset, dataset.pools, settings, store)
        return store

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        """A :class:`~multipos.data.collate.Batch` moves itself (:meth:`Batch.to`); anything else as Lightning
        moves it."""
        return (batch.to(device) if isinstance(batch, Batch)
                else super().transfer_batch_to_device(batch, device, dataloader_idx))

    def train_dataloader(self) -> DataLoader:
        """Loader over the current stage's groups; raises ValueError when ``data.tokenizer`` has more tokens than
        the trained model's embedding rows (:func:`multipos.model.tokenization.check_tokenizer`). Its batches carry
        their
        groups unless the trainer's module says it does not need them (``needs_batch_groups()`` False:
        :meth:`multipos.training.module.RetrieverModule.needs_batch_groups`)."""
        module = getattr(self.trainer, "lightning_module", None) if self.trainer else None
        model = getattr(module, "model", None)
        if model is not None and hasattr(model, "query_encoder"):
            from multipos.model.tokenization import check_tokenizer

            check_tokenizer(self.tokenizer, model.query_encoder, f"data.tokenizer={self.tokenizer_name}")
        ranks = (self.trainer.world_size, self.trainer.global_rank) if self.trainer is not None else (1, 0)
        keep_groups = bool(module.needs_batch_groups()) if hasattr(module, "needs_batch_groups") else True
        sampler = EpochSampler(len(self.dataset), self.seed, num_replicas=ranks[0], rank=ranks[1])
        if self.trainer is not None:
            sampler.set_epoch(self.trainer.current_epoch)
        trainer = self.trainer
        progress = ((lambda: trainer.fit_loop.epoch_loop.batch_progress.current.processed)
                    if trainer is not None else None)
        # its own generator: creating the iterator draws no number from the global RNG (dropout after a resume)
        return ResumableLoader(self.dataset, batch_size=self.batch_size, sampler=sampler,
                               drop_last=len(sampler) >= self.batch_size, collate_fn=self.collator(keep_groups),
                               num_workers=self.num_workers, persistent_workers=self.num_workers > 0, progress=progress,
                               pin_memory=self.pin_memory,
                               multiprocessing_context=worker_start_method(self.num_workers),
                               worker_init_fn=WorkerInit(ranks[1]) if self.num_workers > 0 else None,
                               generator=torch.Generator().manual_seed(self.seed))
