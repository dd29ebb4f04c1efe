"""MultiPositiveDataCollator builds multipos's groups (GroupBuilder's draws), its masks (group_masks) and targets
(group_targets), tokenises as told, re-draws per epoch, and refuses bad rows naming the column."""

from __future__ import annotations

import pytest
import torch

from multipos.data.groups import Group, GroupBuilder, group_masks, group_targets
from multipos.sentence_transformers import GroupLayout, MultiPositiveDataCollator
from tests.sentence_transformers.conftest import GRADE_WEIGHTS


def _tokens(texts, **_):
    """A stand-in for ``model.preprocess``: one row of ones per text (the collator's grouping is under test)."""
    return {"input_ids": torch.ones(len(texts), 3, dtype=torch.long), "n": len(texts)}


def _layout(batch) -> GroupLayout:
    return GroupLayout.unpack(batch["label"], batch["query_input_ids"].shape[0], batch["passages_input_ids"].shape[0])


@pytest.mark.parametrize("positive_selection,negative_selection,objective", [
    ("first", "first", None), ("random", "random", None), ("first", "random", "singlelh"),
    ("random", "first", "rand1lh")])
def test_groups_are_multipos_groups(loaded, rows, positive_selection, negative_selection, objective):
    corpus, queries = loaded
    builder = GroupBuilder(3, 2, positive_selection, {"singlelh": "first", "rand1lh": "random"}.get(objective),
                           negative_selection, seed=7)
    collator = MultiPositiveDataCollator(_tokens, max_positives=2, group_size=3, positive_selection=positive_selection,
                                         negative_selection=negative_selection, objective=objective, seed=7)
    for epoch in (0, 1):
        collator.set_epoch(epoch)
        for q, row in zip(queries, rows):
            want = builder.build(q, q.positives("all"), epoch)
            texts, n_pos, _, _ = collator.group(row)
            assert texts == [corpus[p].full_text() for p in want.passage_ids] and n_pos == want.n_positives


def test_masks_and_targets_are_multipos_masks(loaded, rows):
    """Over the whole batch: the queries of one topic share positives, so copies of a query's positives sit in
    another query's group; the layout's masks are group_masks' and its targets group_targets' (on the pool)."""
    corpus, queries = loaded
    builder = GroupBuilder(4, 2, "random", negative_selection="random", seed=3)
    groups = [builder.build(q, q.positives("all"), 0) for q in queries]
    collator = MultiPositiveDataCollator(_tokens, max_positives=2, group_size=4, positive_selection="random",
                                         grade_weights=GRADE_WEIGHTS, seed=3, epoch=0)
    batch = collator(list(rows))
    layout = _layout(batch)
    assert batch["passages_n"] == sum(len(g.passage_ids) for g in groups) and batch["query_n"] == len(groups)
    positive, negative, target = layout.masks()
    want_pos, want_neg = group_masks(groups)
    assert torch.equal(positive, want_pos) and torch.equal(negative, want_neg)
    assert layout.ignored.shape[0] > 0  # the shared positives were found in the other groups
    want_target = group_targets(groups)
    pool = want_pos | want_neg
    assert torch.equal(target[pool], want_target[pool])
    for rows_slice in (slice(0, 3), slice(3, 8)):  # row chunks (the cached loss) are slices of the whole
        chunk = layout.masks(rows_slice)
        assert all(torch.equal(a, b[rows_slice]) for a, b in zip(chunk, (positive, negative, target)))


def test_an_in_batch_copy_of_a_positive_is_no_negative():
    rows = [{"query": "q0", "positives": ["a", "b"], "negatives": ["c", "a"]},
            {"query": "q1", "positives": ["c"], "negatives": ["b", "d", "e"]}]
    batch = MultiPositiveDataCollator(_tokens, negative_selection="first")(rows)
    layout = _layout(batch)
    assert layout.positives.tolist() == [2, 1] and layout.negatives.tolist() == [1, 3]
    positive, negative, _ = layout.masks()  # columns: a b c | c b d e  (q0's own "a" negative dropped)
    groups = [Group("q0", "q0", ["a", "b", "c"], 2, {"a", "b"}), Group("q1", "q1", ["c", "b", "d", "e"], 1, {"c"})]
    want_pos, want_neg = group_masks(groups)
    assert torch.equal(positive, want_pos) and torch.equal(negative, want_neg)
    assert negative.tolist() == [[False, False, True, True, False, True, True],
                                 [True, True, False, False, True, True, True]]
    assert torch.isnan(layout.weights[:2]).all()  # no grades


def test_limits_tokenisation_prompts_and_routes():
    calls = []

    def preprocess(texts, prompt=None, task=None, **kwargs):
        calls.append((list(texts), prompt, task, kwargs))
        return _tokens(texts)

    rows = [{"query": "q", "positives": ["p1", "p2", "p3"], "negatives": ["n1", "n2", "n3"], "grades": [2, 1, 1]}]
    collator = MultiPositiveDataCollator(preprocess, max_positives=2, group_size=3, negative_selection="first",
                                         prompts={"query": "query: ", "positives": "passage: "},
                                         router_mapping={"query": "query", "positives": "document"},
                                         query_max_length=8, passage_max_length=16)
    batch = collator(rows)
    assert calls == [(["q"], "query: ", "query", {"max_length": 8}),
                     (["p1", "p2", "n1"], "passage: ", "document", {"max_length": 16})]
    assert batch["query_task"] == "query" and batch["passages_task"] == "document"
    assert _layout(batch).weights.tolist() == [2.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="negatives"):
        MultiPositiveDataCollator(preprocess, prompts={"positives": "a: ", "negatives": "b: "})(rows)
    no_limit = MultiPositiveDataCollator(_tokens)(rows)
    assert no_limit["passages_n"] == 6
    assert _layout(MultiPositiveDataCollator(_tokens, group_size=3)(rows)).positives.tolist() == [2]  # M ≤ G − 1


def test_random_draws_follow_the_epoch():
    rows = [{"query": "q", "positives": [f"p{i}" for i in range(6)], "negatives": [f"n{i}" for i in range(9)]}]
    collator = MultiPositiveDataCollator(_tokens, max_positives=2, group_size=4, positive_selection="random", seed=1)
    counted = [collator.group(rows[0])[0] for _ in range(3)]  # no epoch set: the n-th draw is epoch n
    epochs = []
    for epoch in range(3):
        collator.set_epoch(epoch)
        epochs.append(collator.group(rows[0])[0])
    assert counted == epochs and len({tuple(e) for e in epochs}) > 1

    class State:
        epoch = 2.0

    collator.epoch_callback().on_epoch_begin(None, State(), None)
    assert collator.epoch == 2


@pytest.mark.parametrize("row,column", [
    ({"query": "q", "positives": []}, "'positives'"),
    ({"query": "q"}, "'positives'"),
    ({"query": "q", "positives": ["a"], "grades": ["high"]}, "'grades'"),
    ({"query": "q", "positives": ["a", "b"], "grades": [1]}, "'grades'"),
    ({"query": "", "positives": ["a"]}, "'query'"),
    ({"query": "q", "positives": ["a"], "grades": [3]}, "'grades'"),  # no weight for grade 3
])
def test_bad_rows_name_the_column(row, column):
    collator = MultiPositiveDataCollator(_tokens, grade_weights=GRADE_WEIGHTS)
    with pytest.raises(ValueError, match=f"row 1 of the batch.*column {column}"):
        collator([{"query": "fine", "positives": ["x"], "grades": [2]}, row])


def test_bad_settings():
    with pytest.raises(ValueError, match="group_size"):
        MultiPositiveDataCollator(_tokens, max_positives=4, group_size=4)
    with pytest.raises(ValueError, match="positive_selection"):
        MultiPositiveDataCollator(_tokens, positive_selection="best")
    with pytest.raises(ValueError, match="unknown objective"):
        MultiPositiveDataCollator(_tokens, objective="infonce")
