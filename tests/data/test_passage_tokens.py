"""Passages tokenised once (multipos.data.passage_tokens): batches equal tokenising the texts when collated."""

from __future__ import annotations

import pickle

import pytest
import torch
from transformers import AutoTokenizer

from multipos.data import MultiPosDataModule, StageInputs
from multipos.data.collate import GroupCollator
from multipos.data.passage_tokens import PassageTokens
from multipos.data.sources import BeirGradedSource
from multipos.formats.types import Passage


def _datamodule(tiny_beir, tiny_bert, **kw) -> MultiPosDataModule:
    dm = MultiPosDataModule(BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=3),
                            str(tiny_bert), regime="heterogeneous", group_size=8, max_positives=2, batch_size=4,
                            passage_max_length=12, **kw)
    dm.set_stage("heterogeneous", None)
    dm.setup()
    return dm


def _tokenised_texts(dm, batch_groups):
    """The collate function without a store: every passage text tokenised when collated."""
    return GroupCollator(dm.tokenizer, dm.corpus, dm.query_prompt, dm.passage_prompt, dm.query_max_length,
                         dm.passage_max_length)(batch_groups)


def _assert_same(a, b):
    assert a.passage_ids == b.passage_ids and a.query_ids == b.query_ids
    assert list(a.passages) == list(b.passages)
    for key in b.passages:
        assert a.passages[key].dtype == b.passages[key].dtype and torch.equal(a.passages[key], b.passages[key]), key
    for key in b.query:
        assert torch.equal(a.query[key], b.query[key]), key
    assert torch.equal(a.positive_mask, b.positive_mask) and torch.equal(a.negative_mask, b.negative_mask)


def test_batches_from_the_store_equal_tokenising_the_texts_top_ups_included(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    store = dm.passage_tokens()
    pooled = {p for q, pos in dm.dataset.items for p in (*pos, *q.negatives)}
    assert set(store.rows) == pooled and len(pooled) < len(dm.corpus.ids)  # only what the groups draw from
    collate = dm.collator()
    assert collate.passage_tokens is store
    missed = 0
    for epoch in range(3):
        groups = [dm.dataset[(i, epoch)] for i in range(len(dm.dataset))]
        for i in range(0, len(groups), 4):
            batch_groups = groups[i : i + 4]
            missed += sum(p not in store.rows for g in batch_groups for p in g.passage_ids)
            _assert_same(collate(batch_groups), _tokenised_texts(dm, batch_groups))
    assert missed > 0  # random top-ups (negative_depth=3 < G - M) were tokenised when collated, and equal too


def test_the_store_follows_the_prompt_the_length_and_refreshed_pools(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    first = dm.passage_tokens()
    assert dm.passage_tokens() is first
    dm.set_inputs(StageInputs(passage_prompt="passage: "))  # the model's prompt, handed over
    second = dm.passage_tokens()
    assert second is not first and second.prompt == "passage: "
    groups = [dm.dataset[(i, 0)] for i in range(4)]
    _assert_same(dm.collate(groups), _tokenised_texts(dm, groups))
    outside = [p for p in dm.corpus.ids if p not in second.rows]
    dm.set_negatives({dm.dataset.items[0][0].query_id: outside})  # a dense refresh's pool
    assert set(outside) <= set(dm.passage_tokens().rows)


def test_the_collate_function_with_its_store_pickles(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    collate = dm.collator()
    groups = [dm.dataset[(i, 1)] for i in range(4)]
    _assert_same(pickle.loads(pickle.dumps(collate))(groups), collate(groups))


def test_query_side_batches_build_no_store(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    dm.tokenize_passages = False
    assert dm.collator().passage_tokens is None and dm._passage_tokens is None
    assert dm.collate([dm.dataset[(0, 0)]]).passages is None


def test_a_tokenizer_whose_encoding_is_more_than_ids_is_not_stored(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    tok = AutoTokenizer.from_pretrained(str(tiny_bert))

    class TypedTokenizer:  # token type ids that are not all zero: the store cannot rebuild them from the ids
        model_input_names = tok.model_input_names

        def __len__(self):
            return len(tok)

        def __call__(self, texts, **kw):
            enc = tok(texts, **kw)
            ids = enc["input_ids"]
            enc["token_type_ids"] = torch.ones_like(ids) if torch.is_tensor(ids) else [[1] * len(x) for x in ids]
            return enc

    store = PassageTokens(TypedTokenizer(), dm.corpus, "", 12)
    assert store.add(dm.corpus.ids[:5]) == 0 and not store.exact and len(store) == 0
    batch = store.batch(dm.corpus.ids[:3])  # the texts tokenised by the tokenizer itself, type ids kept
    expected = tok([dm.corpus[p].full_text() for p in dm.corpus.ids[:3]], padding=True, truncation=True, max_length=12,
                   return_tensors="pt")
    assert torch.equal(batch["input_ids"], expected["input_ids"])
    assert torch.equal(batch["token_type_ids"], torch.ones_like(expected["input_ids"]))


def test_an_unknown_passage_id_is_a_key_error(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    with pytest.raises(KeyError, match="'no-such-passage' of a training group is not in the corpus"):
        PassageTokens(dm.tokenizer, dm.corpus, "", 12).add(["no-such-passage"])


def test_no_store_when_it_would_tokenise_more_than_an_epoch_collates_on_this_rank(tiny_beir, tiny_bert):
    from types import SimpleNamespace

    dm = _datamodule(tiny_beir, tiny_bert)
    pooled = {p for q, pos in dm.dataset.items for p in (*pos, *q.negatives)}
    dm.trainer = SimpleNamespace(world_size=len(dm.dataset))  # one query a rank: 8 passages an epoch, fewer than pooled
    assert len(pooled) > 8
    collate = dm.collator()
    assert collate.passage_tokens is None and dm.passage_tokens() is None
    groups = [dm.dataset[(i, 0)] for i in range(4)]
    _assert_same(collate(groups), _tokenised_texts(dm, groups))
    dm.trainer = None  # one process: the store is built
    assert set(dm.passage_tokens().rows) == pooled


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_on_the_tokenizers_side_and_an_appended_eos_as_decoder_embedders_tokenise(tiny_beir, tiny_bert, side):
    from multipos.model.tokenization import ensure_eos

    dm = _datamodule(tiny_beir, tiny_bert)
    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    tok.eos_token = "[SEP]"
    ensure_eos(tok)
    tok.padding_side = side
    dm.set_inputs(StageInputs(tokenizer=tok))  # as a stage hands the model's tokenizer over
    for k, pid in enumerate(dm.corpus.ids):  # passages of 1 to 4 words: batches that need padding
        passage = dm.corpus[pid]
        dm.corpus.passages[pid] = Passage(pid, "", " ".join(passage.text.split()[: 1 + k % 4]))
    collate = dm.collator()
    assert collate.passage_tokens.tokenizer is tok
    groups = [dm.dataset[(i, 0)] for i in range(4)]
    batch = collate(groups)
    _assert_same(batch, _tokenised_texts(dm, groups))
    mask = batch.passages["attention_mask"]
    first, last = (0, -1) if side == "left" else (-1, 0)
    assert (mask[:, last] == 1).all() and (mask[:, first] == 0).any()  # padded, on the tokenizer's side


def test_a_tokenizer_without_a_pad_token_is_a_value_error(tiny_beir, tiny_bert):
    dm = _datamodule(tiny_beir, tiny_bert)
    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    store = PassageTokens(tok, dm.corpus, "", 12)
    ids = dm.corpus.ids[:3]
    store.add(ids)
    tok.pad_token = None
    with pytest.raises(ValueError, match="has no pad token"):
        store.batch(ids)


def test_a_two_tower_run_with_the_store_trains_the_weights_of_one_without(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    from transformers import AutoModel

    from multipos.train import train
    from tests.helpers import compose_cfg, tiny_overrides

    calls = []
    real_batch = PassageTokens.batch

    def counted(self, passage_ids):
        calls.append(len(passage_ids))
        return real_batch(self, passage_ids)

    monkeypatch.setattr(PassageTokens, "batch", counted)

    def run(out):
        train(compose_cfg("train", tiny_overrides(tiny_beir, tiny_bert, out, "loss=lsepair", "trainer.max_epochs=2",
                                                  "data.source.negative_depth=3", "data.group_size=8",
                                                  "module.optimizer.lr=1e-3",
                                                  # collate in this process, where the counter is: on a GPU
                                                  # ${auto_workers:} gives 4 DataLoader workers, which count in theirs
                                                  "data.num_workers=0")))
        return AutoModel.from_pretrained(out / "model").state_dict()

    with_store = run(tmp_path / "store")
    assert calls, "the run did not collate from the store"
    monkeypatch.setattr(MultiPosDataModule, "passage_tokens", lambda self: None)
    calls.clear()
    without = run(tmp_path / "texts")
    assert not calls
    assert with_store.keys() == without.keys()
    for name, weight in without.items():
        assert torch.equal(with_store[name], weight), name


def test_a_batch_carries_only_the_inputs_the_encoders_read(tiny_beir, tiny_bert):
    """The tokenizer also returns ``token_type_ids``; a batch leaves them out, from the store or from the texts (each
    tensor costs a transfer from the DataLoader worker and a copy to the GPU: multipos.model.encoder.ENCODER_INPUTS)."""
    from multipos.model.encoder import ENCODER_INPUTS

    dm = _datamodule(tiny_beir, tiny_bert)
    groups = [dm.dataset[(0, 0)], dm.dataset[(1, 0)]]
    assert "token_type_ids" in dm.tokenizer(["heart"])
    for batch in (dm.collate(groups), _tokenised_texts(dm, groups)):
        assert list(batch.query) == list(ENCODER_INPUTS) and list(batch.passages) == list(ENCODER_INPUTS)
