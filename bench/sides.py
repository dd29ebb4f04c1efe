"""The contenders of the speed benchmark, each a ``step(batch)`` on the same :class:`multipos.data.collate.Batch`
objects:

* ``multipos``: :class:`multipos.training.module.RetrieverModule` (DualEncoder, mean pooling, L2, τ = 0.05, SingleLH)
  forward, loss, backward, gradient clipping at 1.0, AdamW step — what Lightning runs in each training step;
* ``bare``: the same computation written directly against ``transformers.AutoModel`` and
  ``F.cross_entropy`` (InfoNCE over the B·G in-batch passages, target column i·G);
* ``sentence-transformers``: ``MultipleNegativesRankingLoss`` (scale 20 = 1/τ, cosine) on (query, positive,
  G − 1 negatives) columns of the same texts, pre-tokenized by its own ``preprocess``.

All sides: AdamW(lr 2e-5, weight decay 0.01), clipping at 1.0, the same autocast (bf16 only where native),
and hidden dropout 0.1 (the checkpoint's). Attention dropout is a setting of each side (``model=minilm`` uses 0).
Also: the in-memory training source and data module that build the batches, and the Lightning loop timer.
"""

from __future__ import annotations

import random
import tempfile
import time

import lightning as L
import torch
import torch.nn.functional as F
from common import REPO, BenchData, sync

from multipos.retrieval.encoding import autocast_context

TAU = 0.05


class MemorySource:
    """Training source over :class:`common.BenchData`: each query with its one positive and 30 random negatives."""

    def __init__(self, data: BenchData, seed: int = 0):
        self.data, self.seed = data, seed

    def load(self):
        from multipos.data.groups import TrainQuery
        from multipos.formats.types import Corpus, Passage

        corpus = Corpus({p: Passage(p, "", t) for p, t in self.data.passages.items()})
        rng, ids = random.Random(self.seed), list(self.data.passages)
        queries = [TrainQuery(q, text, gold=[pos], negatives=[n for n in rng.sample(ids, 31) if n != pos][:30])
                   for q, text, pos in self.data.queries]
        return corpus, queries


def data_module(data: BenchData, batch_size: int, group_size: int, query_len: int, passage_len: int):
    """:class:`multipos.data.datamodule.MultiPosDataModule` over :class:`MemorySource`: 1 positive + G − 1 hard
    negatives per query, tokenised by the model's tokenizer, DataLoader workers as the training configs choose them."""
    from multipos.data.datamodule import MultiPosDataModule
    from multipos.hardware import auto_workers

    workers = auto_workers()
    dm = MultiPosDataModule(MemorySource(data), tokenizer=data.model, regime="gold", group_size=group_size,
                            max_positives=1, batch_size=batch_size, query_max_length=query_len,
                            passage_max_length=passage_len, num_workers=workers, seed=0)
    dm.setup("fit")
    return dm


def multipos_model(data: BenchData, attention_dropout: float = 0.0):
    """The dual encoder as ``model=minilm`` builds it (attention dropout 0 by default)."""
    from multipos.model.encoder import DualEncoder

    return DualEncoder(data.model, pooling="mean", normalize=True, temperature=TAU, query_max_length=32,
                       passage_max_length=512, attention_dropout=attention_dropout)


def _finish(loss, params, opt) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def multipos_step(data: BenchData, device, bf16: bool, attention_dropout: float = 0.0):
    from multipos.losses import ContrastiveLoss
    from multipos.training.module import RetrieverModule

    module = RetrieverModule(multipos_model(data, attention_dropout).to(device),  # a constant lr
                             ContrastiveLoss("singlelh")).train()
    opt = module.configure_optimizers()
    params = [p for p in module.parameters() if p.requires_grad]

    def step(batch):
        batch = batch.to(device)
        with autocast_context(device, bf16):
            if hasattr(module, "batch_loss"):  # the module's own loss path (masks over the global batch in DDP)
                q, p = module.model.encode_queries(batch.query), module.model.encode_passages(batch.passages)
                loss = module.batch_loss(q, p, batch)[0]
            else:
                loss = module.loss(module(batch), batch.positive_mask, batch.negative_mask)
        _finish(loss, params, opt)

    return step


def bare_step(data: BenchData, device, bf16: bool, group_size: int, attention_dropout: float = 0.0):
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(data.model, attention_probs_dropout_prob=attention_dropout).float()
    encoder.to(device).train()
    opt = torch.optim.AdamW(encoder.parameters(), lr=2e-5, weight_decay=0.01)

    def embed(tokens):
        hidden = encoder(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]).last_hidden_state
        mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return F.normalize(((hidden * mask).sum(1) / mask.sum(1)).float(), dim=-1)

    def step(batch):
        batch = batch.to(device)
        with autocast_context(device, bf16):
            scores = embed(batch.query) @ embed(batch.passages).T / TAU
        target = torch.arange(scores.shape[0], device=device) * group_size
        _finish(F.cross_entropy(scores.float(), target), list(encoder.parameters()), opt)

    return step


def st_columns(st, batch, texts: dict[str, str], queries: dict[str, str], group_size: int) -> list[dict]:
    """The batch as sentence-transformers columns: queries, then passage j of every group for j = 0..G−1
    (j = 0 the positive), each tokenised by ``st.preprocess`` (CPU tensors)."""
    cols = [[queries[q] for q in batch.query_ids]]
    pids = batch.passage_ids
    for j in range(group_size):
        cols.append([texts[pids[i * group_size + j]] for i in range(len(batch.query_ids))])
    return [st.preprocess(c) for c in cols]


def st_model(data: BenchData, device, max_length: int, attention_dropout: float | None):
    """SentenceTransformer on the same checkpoint; ``attention_dropout=None`` keeps the checkpoint's (0.1)."""
    from sentence_transformers import SentenceTransformer

    kwargs = {} if attention_dropout is None else {"config_kwargs": {"attention_probs_dropout_prob": attention_dropout}}
    st = SentenceTransformer(data.model, device=str(device), **kwargs)
    st.max_seq_length = max_length
    return st


def st_step(st, device, bf16: bool):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    st.train()
    loss_fn = MultipleNegativesRankingLoss(st, scale=1.0 / TAU)
    opt = torch.optim.AdamW(st.parameters(), lr=2e-5, weight_decay=0.01)
    params = list(st.parameters())

    def step(columns):
        columns = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in c.items()} for c in columns]
        with autocast_context(device, bf16):
            loss = loss_fn(columns, None)
        _finish(loss, params, opt)

    return step


class StepTimer(L.Callback):
    """Lightning callback: wall time between consecutive ``on_train_batch_end`` calls — data loading, collation
    (tokenisation), transfer, the step and logging — for every step after the first.

    ``sync_each=False``: the device is synchronised only at the end of the first and of the last step
    (``last_step``), so the loop runs as it would untimed, the host free to queue a step while the device runs the one
    before; :attr:`run_step` is then the mean step between those two points."""

    def __init__(self, device, sync_each: bool = True, last_step: int | None = None):
        self.device, self.starts, self.ends = device, [], []
        self.sync_each, self.last_step = sync_each, last_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.sync_each:
            sync(self.device)
        self.starts.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.sync_each or trainer.global_step in (1, self.last_step):
            sync(self.device)
        self.ends.append(time.perf_counter())

    @property
    def steps(self) -> list[float]:
        return [b - a for a, b in zip(self.ends, self.ends[1:])]

    @property
    def gaps(self) -> list[float]:
        """Seconds from each step's end to the next step's start: fetching the next batch (from a DataLoader worker,
        or the next collated one), moving it to the device and Lightning's bookkeeping between the two hooks."""
        return [b - a for a, b in zip(self.ends, self.starts[1:])]

    @property
    def run_step(self) -> float:
        """Mean seconds a step from the end of the first step to the end of the last (both synchronised)."""
        return (self.ends[-1] - self.ends[0]) / max(1, len(self.ends) - 1)

    @property
    def first_step(self) -> float:
        """Seconds from the first batch's start to its end (the step alone, warm-up included)."""
        return self.ends[0] - self.starts[0]


class _UnloggedModule:
    """Mixed into :class:`multipos.training.module.RetrieverModule` by :func:`lightning_loop` with ``log_steps=False``:
    its
    ``self.log`` calls (``train/lr`` and ``train/loss``, two on each step whose values a logger writes or the bar
    shows) do nothing."""

    def log(self, *args, **kwargs) -> None:
        pass


class _EveryStepLoggedModule:
    """Mixed into :class:`multipos.training.module.RetrieverModule` by :func:`lightning_loop` with
    ``log_every_step=True``: it
    calls ``self.log`` at every step, as it did before 2026-11-26, whichever steps a logger writes."""

    def _logs_this_step(self) -> bool:
        return True


def cycled(batches: list, steps: int) -> list:
    """``steps`` + 1 batches (a warm-up step, then the timed ones): ``batches`` repeated in order as needed."""
    return (batches * (steps // len(batches) + 2))[: steps + 1]


def lightning_loop(data: BenchData, dm, device, steps: int, log_steps: bool = True,
                   sync_each: bool = True, overrides: tuple[str, ...] = (), log_every_step: bool = False,
                   gaps: list | None = None, sharing: str | None = None, pin_memory: bool = False) -> list[float]:
    """``Trainer.fit`` of a RetrieverModule for ``steps`` + 1 steps with the trainer a user runs on ``device``
    (``trainer=gpu`` on CUDA: bf16, clipping 1.0, logging to a CSV logger and refreshing the progress bar
    (:func:`multipos.training.fit.progress_bar`) every 10 steps; ``trainer=default`` elsewhere: every step) → seconds
    of each
    step after the first.

    ``dm``: the data module (the whole loop: DataLoader workers, collation, transfer, the step, logging), or a list of
    already collated :class:`multipos.data.collate.Batch` objects, cycled as needed (the loop's own cost alone: hooks,
    the precision plugin, logging and transfer, on the batches a bare loop times). ``log_steps=False``: the module's
    ``self.log`` calls do nothing (what Lightning's logging costs; on the 2-core EPYC with a 2-layer test model about
    half of the loop's 2.2 ms a step over the bare loop while the module logged at every step, 2026-11-26; since
    2026-11-26 it logs only on the steps a logger writes, every 10th on CUDA). ``log_every_step=True``: the module calls
    ``self.log`` at every step, as before that change.

    ``sync_each=False`` → ``[mean seconds a step]`` (:attr:`StepTimer.run_step`: the device synchronised at the end of
    the first and the last step only). ``overrides``: Hydra overrides of the trainer config, e.g.
    ``("trainer.log_every_n_steps=10",)`` for a GPU's logging interval on a CPU. ``gaps``: a list that receives
    :attr:`StepTimer.gaps` of the timed steps. ``sharing``: how the DataLoader workers send their tensors
    (:class:`multipos.data.loader.WorkerInit`'s ``sharing``; None: as a run does). ``pin_memory``: the DataLoader's
    pin-memory thread receives and pins the batches (the data module's ``pin_memory`` attribute, for this fit)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from lightning.pytorch.loggers import CSVLogger

    from multipos.config_resolvers import register_resolvers
    from multipos.losses import ContrastiveLoss
    from multipos.training.fit import progress_bar
    from multipos.training.module import RetrieverModule

    register_resolvers()  # conf/trainer/default.yaml reads ${auto_precision:}
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", [f"trainer={'gpu' if torch.device(device).type == 'cuda' else 'default'}",
                                *overrides]).trainer
    bar = progress_bar(cfg)
    timer = StepTimer(device, sync_each, last_step=steps + 1)
    trainer = instantiate(cfg, max_steps=steps + 1, max_epochs=-1, enable_checkpointing=False,
                          enable_progress_bar=bool(bar), enable_model_summary=False, callbacks=[timer, *bar],
                          logger=CSVLogger(tempfile.mkdtemp(prefix="multipos-bench-csv-")))
    mixins = (() if log_steps else (_UnloggedModule,)) + ((_EveryStepLoggedModule,) if log_every_step else ())
    cls = type("BenchRetrieverModule", (*mixins, RetrieverModule), {}) if mixins else RetrieverModule
    module = cls(multipos_model(data), ContrastiveLoss("singlelh"))  # a constant lr
    if isinstance(dm, list):
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(cycled(dm, steps), batch_size=None,
                                                                          shuffle=False))
    else:
        import functools

        import multipos.data.datamodule as datamodule

        real, pinned = datamodule.WorkerInit, dm.pin_memory
        if sharing is not None:
            datamodule.WorkerInit = functools.partial(real, sharing=sharing)
        dm.pin_memory = pin_memory
        try:
            trainer.fit(module, datamodule=dm)
        finally:
            datamodule.WorkerInit, dm.pin_memory = real, pinned
    if gaps is not None:
        gaps.extend(timer.gaps)  # one per timed step: what precedes it
    return timer.steps if sync_each else [timer.run_step]
