"""LightningDataModule: training groups → tokenised batches with positive/negative masks."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from multipos.data.budget import AnnotationBudget
from multipos.data.collate import Batch, GroupCollator
from multipos.data.groups import REGIME_RULES, REGIMES, Group, GroupBuilder, TrainQuery, negative_shortfall
from multipos.data.loader import EpochSampler, ResumableLoader, WorkerInit, worker_start_method
from multipos.data.passage_tokens import PassageTokens
from multipos.data.preparation import PreparedData

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


@dataclass(frozen=True)
class StageInputs:
    """What a training stage's batches need from the model being trained, handed to the data module explicitly
    (:meth:`MultiPosDataModule.set_inputs`) rather than looked up in the trainer's module.

    Attributes:
        tokenizer: the Hugging Face tokenizer the model reads (with the EOS rule of last-token pooling); None: the
            data module's ``tokenizer`` checkpoint, loaded by name.
        query_prompt, passage_prompt: text put before every query / passage, as the model's encoders put it.
        batch_groups: whether each batch carries its groups (``Batch.groups``): the masks over the global batch of
            data-parallel training, every-passage candidates and soft targets read them
            (:meth:`multipos.training.module.RetrieverModule.needs_batch_groups`); False leaves them in the DataLoader
            workers (:class:`GroupCollator`).
        encoder: the :class:`multipos.model.encoder.DualEncoder` being trained, or None: the tokenizer is checked
            against its query encoder's embedding rows before the first batch, and it is the encoder a dense refresh of
            the hard negatives mines with.
    """

    tokenizer: Any = None
    query_prompt: str = ""
    passage_prompt: str = ""
    batch_groups: bool = True
    encoder: Any = None

    @classmethod
    def of_encoder(cls, encoder, batch_groups: bool = True) -> StageInputs:
        """The inputs of a :class:`~multipos.model.encoder.DualEncoder`: its tokenizer, its query / passage prompts
        and the encoder itself; ``batch_groups`` as the stage's module needs them."""
        return cls(encoder.tokenizer, encoder.query_prompt, encoder.passage_prompt, batch_groups, encoder)


class MultiPosDataModule(L.LightningDataModule):
    """Training data for multi-positive contrastive learning.

    Args:
        source: a :class:`multipos.data.sources.Source` (``prepare() -> PreparedData``: the data read and prepared,
            :mod:`multipos.data.preparation`).
        name: label used in run names.
        tokenizer: HF checkpoint name/path whose tokenizer is used unless the model's is handed over
            (:class:`StageInputs`; normally ``${model.name_or_path}``).
        regime: positive regime (``homogeneous`` | ``heterogeneous`` | ``gold`` | ``all``) until a stage sets its
            own with :meth:`set_stage` (training always does: the stage plan of ``regime=<name>``, ``conf/regime``).
        group_size: G; max_positives: M; positive_selection: ``first`` | ``random``;
        negative_selection: ``first`` | ``random`` (hard negatives per epoch).
        batch_size: queries per batch (B); query_max_length, passage_max_length: tokens.
        budget: annotation-budget allocation ``{positives_per_query, query_fraction, seed, pool_min_positives}``
            (:class:`multipos.data.budget.AnnotationBudget`), or None for every query with all its positives.
        seed: seed for group construction and shuffling; num_workers: DataLoader workers.
        tokenize_passages: False under query-side fine-tuning, whose batches carry the passages' ids alone
            (``Batch.passages`` None) because their embeddings come from the frozen passage index.

    What the batches need from the model (its tokenizer and prompts, whether batches carry their groups, the encoder)
    comes in a :class:`StageInputs` (:meth:`set_inputs`); until then the ``tokenizer`` checkpoint's, no prompts,
    groups kept and no encoder. The module knows data only: it never looks into the trainer's model.
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
                 budget: dict | None = None, seed: int = 0, num_workers: int = 0, tokenize_passages: bool = True):
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
        #: the source's data after the preparation steps (:meth:`training_queries` reads it on first use)
        self.prepared: PreparedData | None = None
        self.corpus = None
        self.queries: list[TrainQuery] = []
        self.inputs = StageInputs()
        self._named_tokenizer = None
        self.dataset: GroupDataset | None = None
        self.stats: dict = {}
        self.negative_pools: dict[str, list[str]] | None = None
        #: False under query-side fine-tuning: batches carry passage ids only (looked up in the frozen index)
        self.tokenize_passages = tokenize_passages
        #: the training passages tokenised once (:meth:`passage_tokens`), and (settings, answer) of its last call for
        #: the current groups and pools; set back to None whenever those, or the inputs, change
        self._passage_tokens: PassageTokens | None = None
        self._passage_tokens_answer: tuple | None = None

    def set_inputs(self, inputs: StageInputs) -> None:
        """Tokenise and batch as the model being trained needs (:class:`StageInputs`), from the next batch on: call
        it when a stage starts, before its first batch. When the tokenizer or a prompt changes after :meth:`setup`,
        the truncated shares of the stage record are measured again."""
        old, self.inputs = self.inputs, inputs
        if inputs.tokenizer is not old.tokenizer:
            self._passage_tokens = None  # tokenised by another tokenizer
        self._passage_tokens_answer = None
        changed = (inputs.tokenizer is not old.tokenizer or inputs.query_prompt != old.query_prompt
                   or inputs.passage_prompt != old.passage_prompt)
        if changed and self.dataset is not None:
            self.stats["truncated"] = self._measure_truncation()

    @property
    def query_prompt(self) -> str:
        """Text put before every query (:attr:`StageInputs.query_prompt`)."""
        return self.inputs.query_prompt

    @property
    def passage_prompt(self) -> str:
        """Text put before every passage (:attr:`StageInputs.passage_prompt`)."""
        return self.inputs.passage_prompt

    def set_stage(self, regime: str, single_positive: str | None) -> None:
        """Select the positive regime and the single-positive rule of the next stage (from its stage config); the
        stage starts from the source's hard negatives. Raises ValueError for an unknown regime."""
        if regime not in REGIMES:
            raise ValueError(f"unknown regime {regime!r}; allowed: {', '.join(REGIMES)}")
        self.stage_regime, self.single_positive = regime, single_positive
        self.dataset, self.negative_pools = None, None
        self._passage_tokens_answer = None

    def set_negatives(self, pools: dict[str, list[str]] | None) -> None:
        """Build groups from ``pools`` ({query id → hard negatives, best first}) instead of the source's mined
        negatives from the next group on (the dense refresh, :class:`multipos.training.callbacks.NegativeRefresh`);
        None goes back to the source's. Queries absent from ``pools`` keep theirs."""
        self.negative_pools = pools
        if self.dataset is not None:
            self.dataset.pools = pools
        self._passage_tokens_answer = None

    @property
    def tokenizer(self):
        """The tokenizer of :class:`StageInputs`, else the Hugging Face tokenizer named by the ``tokenizer``
        argument, loaded on first use (a DataLoader worker that receives this module pickled loads its own)."""
        if self.inputs.tokenizer is not None:
            return self.inputs.tokenizer
        if self._named_tokenizer is None:
            from transformers import AutoTokenizer

            from multipos.assets import resolve_model

            self._named_tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.tokenizer_name))
        return self._named_tokenizer

    def training_queries(self, regime: str | None = None) -> list[TrainQuery]:
        """The training queries of ``regime`` (default: the current stage's) after the budget, if any; the source
        is read and prepared on the first call."""
        regime = regime or self.stage_regime
        if self.prepared is None:
            self.prepared = self.source.prepare()
            self.corpus, self.queries = self.prepared.corpus, self.prepared.queries
        if self._budget is None:
            return self.queries
        return self._budget.apply(self.queries, regime)

    def run_files(self) -> dict[str, dict]:
        """{file name → JSON content} the preparation steps leave for the run folder (``label_noise.json``: which
        positives were replaced, per query), reading the source first if needed."""
        self.training_queries()
        return self.prepared.files()

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
        """Build the current stage's groups, once per stage (Lightning calls it again when fitting): the groups
        (:meth:`_build_groups`), what the regime and the hard negatives leave out (:meth:`_report_coverage`), the
        stage record (:meth:`_stage_record`) and what the lengths cut off (:meth:`_measure_truncation`). Raises as
        the class says."""
        if self.dataset is not None:
            return
        queries = self.training_queries()
        dataset, builder = self._build_groups(queries)
        skipped, short = self._report_coverage(dataset, builder, queries)
        self.dataset = dataset
        self._passage_tokens_answer = None
        self.stats = self._stage_record(skipped, short)
        self.stats["truncated"] = self._measure_truncation()

    def _build_groups(self, queries: list[TrainQuery]) -> tuple[GroupDataset, GroupBuilder]:
        """The stage's :class:`GroupDataset` over ``queries`` and its builder. Raises ValueError when no query keeps a
        positive under the stage's regime."""
        builder = GroupBuilder(**self.builder_args, single_positive=self.single_positive,
                               pin_first=self.stage_regime == "heterogeneous", seed=self.seed)
        dataset = GroupDataset(queries, self.stage_regime, builder, self.corpus.ids)
        dataset.pools = self.negative_pools
        if len(dataset) == 0:
            raise ValueError(self._empty_message(self.stage_regime, len(queries)))
        return dataset, builder

    def _report_coverage(self, dataset: GroupDataset, builder: GroupBuilder,
                         queries: list[TrainQuery]) -> tuple[list[str], dict[str, int]]:
        """Log what the regime keeps, the queries it skips and those whose hard negatives cannot fill their group →
        (skipped query ids, {query id → negatives missing}). Raises ValueError for a group the corpus cannot fill
        (:func:`negative_shortfall`)."""
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
        return skipped, short

    def _stage_record(self, skipped: list[str], short: dict[str, int]) -> dict:
        """The stage's data as its record in ``run_info.json`` says it (queries, labels, budget, what was skipped or
        topped up, the counts of the preparation steps that record theirs), logged in one line."""
        labels = sum(len(pos) for _, pos in self.dataset.items)
        stats = {"regime": self.stage_regime, "training_queries": len(self.dataset), "positive_labels": labels,
                 "all_queries": len(self.queries), "budget": self.budget, "skipped_no_positive": len(skipped),
                 "topped_up_negatives": len(short), **self.prepared.stats()}
        log.info("regime %s: %d of %d training queries, %d positive labels%s", self.stage_regime,
                 len(self.dataset), len(self.queries), labels, f" (budget {self.budget})" if self.budget else "")
        return stats

    def _measure_truncation(self) -> dict[str, float]:
        """:meth:`truncated_shares`, logged."""
        shares = self.truncated_shares()
        log.info("lengths: query_max_length %d truncates %.1f%% of the training queries, passage_max_length %d "
                 "%.1f%% of the corpus passages (a sample of at most 5,000)", self.query_max_length,
                 100 * shares["queries"], self.passage_max_length, 100 * shares["passages"])
        return shares

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
        settings = (self.passage_prompt, self.passage_max_length, world_size)
        answer = self._passage_tokens_answer  # for the current groups and pools (reset when they change)
        if answer is not None and answer[0] == settings:
            return answer[1]
        store = self._passage_tokens
        if store is None or not store.matches(self.tokenizer, self.passage_prompt, self.passage_max_length):
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
        self._passage_tokens_answer = (settings, store)
        return store

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        """A :class:`~multipos.data.collate.Batch` moves itself (:meth:`Batch.to`), the rest as Lightning moves it."""
        return (batch.to(device) if isinstance(batch, Batch)
                else super().transfer_batch_to_device(batch, device, dataloader_idx))

    def train_dataloader(self) -> DataLoader:
        """Loader over the current stage's groups; its batches carry their groups unless
        :attr:`StageInputs.batch_groups` says the stage does not need them. Raises ValueError when the tokenizer has
        more tokens than the embedding rows of :attr:`StageInputs.encoder`
        (:func:`multipos.model.tokenization.check_tokenizer`)."""
        encoder = self.inputs.encoder
        if encoder is not None:
            from multipos.model.tokenization import check_tokenizer

            check_tokenizer(self.tokenizer, encoder.query_encoder, f"data.tokenizer={self.tokenizer_name}")
        ranks = (self.trainer.world_size, self.trainer.global_rank) if self.trainer is not None else (1, 0)
        keep_groups = bool(self.inputs.batch_groups)
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
