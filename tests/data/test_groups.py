"""Tests for ``multipos.data.groups``: positive regimes, group construction and batch masks."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from multipos.data.groups import Group, GroupBuilder, TrainQuery, group_masks

EPOCHS = range(40)


def make_query(qid: str = "q1", n_pos: int = 5, n_neg: int = 12, extra_judged=("j1",)) -> TrainQuery:
    """Positives p0..; mined negatives n0.. interleaved with judged passages that must be skipped."""
    positives = [f"{qid}-p{k}" for k in range(n_pos)]
    mined = []
    for k in range(n_neg):
        mined.append(f"{qid}-n{k}")
        if k == 1:
            mined += [positives[-1], *extra_judged]  # judged passages sneaked into the mined list
        if k == 3:
            mined.append(f"{qid}-n0")  # duplicate
    return TrainQuery(qid, f"text of {qid}", gold=positives[:1], silver=positives[1:], negatives=mined,
                      judged=set(extra_judged))


def corpus_ids(qid: str = "q1", n: int = 30) -> list[str]:
    return [f"{qid}-c{k}" for k in range(n)]


# --------------------------------------------------------------------------------------------
# TrainQuery
# --------------------------------------------------------------------------------------------

def test_train_query_regimes():
    q = TrainQuery("q", "text", gold=["g1", "g2"], silver=["s1", "s2", "s3"], negatives=["n1"], judged={"j"})
    assert q.positives("homogeneous") == ["s1", "s2", "s3"]
    assert q.positives("heterogeneous") == ["g1", "s1", "s2", "s3"]
    assert q.positives("gold") == ["g1", "g2"]
    assert q.positives("all") == ["g1", "g2", "s1", "s2", "s3"]
    assert q.judged == {"g1", "g2", "s1", "s2", "s3", "j"}


def test_train_query_heterogeneous_without_gold_is_empty():
    q = TrainQuery("q", "text", gold=[], silver=["s1", "s2"])
    assert q.positives("heterogeneous") == []
    assert q.positives("gold") == []
    assert q.positives("homogeneous") == ["s1", "s2"]
    assert q.positives("all") == ["s1", "s2"]


def test_train_query_unknown_regime():
    q = TrainQuery("q", "text", gold=["g"], silver=["s"])
    with pytest.raises(ValueError) as exc:
        q.positives("silver")
    msg = str(exc.value)
    assert "silver" in msg
    for regime in ("homogeneous", "heterogeneous", "gold", "all"):
        assert regime in msg


# --------------------------------------------------------------------------------------------
# GroupBuilder: arguments
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, word", [
    (dict(group_size=1, max_positives=1), "group_size"),
    (dict(group_size=0, max_positives=1), "group_size"),
    (dict(group_size=4, max_positives=0), "max_positives"),
    (dict(group_size=4, max_positives=5), "max_positives"),
    (dict(group_size=4, max_positives=4), "max_positives"),
    (dict(group_size=4, max_positives=2, positive_selection="top"), "positive_selection"),
    (dict(group_size=4, max_positives=2, negative_selection="hard"), "negative_selection"),
    (dict(group_size=4, max_positives=2, single_positive="last"), "single_positive"),
])
def test_builder_rejects_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        GroupBuilder(**kwargs)


def test_builder_rejects_m_equal_g():
    with pytest.raises(ValueError, match="at least one hard negative"):
        GroupBuilder(group_size=3, max_positives=3)


# --------------------------------------------------------------------------------------------
# GroupBuilder: positives
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("selection", ["first", "random"])
@pytest.mark.parametrize("neg_selection", ["first", "random"])
@pytest.mark.parametrize("G, M, n_pos", [(2, 1, 5), (4, 2, 5), (6, 3, 5), (8, 4, 2), (6, 5, 5), (6, 5, 3)])
def test_group_has_exactly_g_passages(selection, neg_selection, G, M, n_pos):
    q = make_query(n_pos=n_pos)
    positives = q.positives("all")
    b = GroupBuilder(G, M, positive_selection=selection, negative_selection=neg_selection, seed=1)
    for epoch in range(5):
        g = b.build(q, positives, epoch)
        assert isinstance(g, Group)
        assert len(g.passage_ids) == G
        assert len(set(g.passage_ids)) == G, g.passage_ids  # no duplicates (mined list has one)
        assert g.n_positives == min(M, n_pos)
        assert set(g.passage_ids[: g.n_positives]) <= set(positives)
        assert not set(g.passage_ids[g.n_positives:]) & q.judged
        assert g.query_id == q.query_id and g.query == q.query
        assert g.judged == q.judged


def test_first_m_takes_leading_positives():
    q = make_query(n_pos=5)
    positives = q.positives("all")
    b = GroupBuilder(group_size=6, max_positives=3, positive_selection="first", negative_selection="first")
    for epoch in range(5):
        g = b.build(q, positives, epoch)
        assert g.passage_ids[:3] == positives[:3]
        # top-ranked mined negatives, judged and duplicate ones skipped, in mined order
        assert g.passage_ids[3:] == ["q1-n0", "q1-n1", "q1-n2"]


def test_fewer_positives_than_m_uses_all_and_more_negatives():
    q = make_query(n_pos=2)
    positives = q.positives("all")
    b = GroupBuilder(group_size=6, max_positives=4, positive_selection="random")
    g = b.build(q, positives, 0)
    assert g.n_positives == 2
    assert sorted(g.passage_ids[:2]) == sorted(positives)
    assert len(g.passage_ids[2:]) == 4


def test_random_m_distinct_varies_and_is_reproducible():
    q = make_query(n_pos=6)
    positives = q.positives("all")
    b = GroupBuilder(group_size=5, max_positives=3, positive_selection="random", seed=7)
    chosen = {}
    for epoch in EPOCHS:
        g = b.build(q, positives, epoch)
        sel = g.passage_ids[:3]
        assert len(set(sel)) == 3 and set(sel) <= set(positives)
        chosen[epoch] = tuple(sel)
    assert len({frozenset(c) for c in chosen.values()}) > 1, "random-M never changed across epochs"
    assert set().union(*chosen.values()) == set(positives)  # every positive gets used at some point
    # same (seed, epoch, query id) → same group, even from a fresh builder
    b2 = GroupBuilder(group_size=5, max_positives=3, positive_selection="random", seed=7)
    for epoch in EPOCHS:
        assert b2.build(q, positives, epoch).passage_ids == b.build(q, positives, epoch).passage_ids
        assert tuple(b2.build(q, positives, epoch).passage_ids[:3]) == chosen[epoch]
    # a different seed gives a different sequence
    b3 = GroupBuilder(group_size=5, max_positives=3, positive_selection="random", seed=8)
    assert [tuple(b3.build(q, positives, e).passage_ids[:3]) for e in EPOCHS] != [chosen[e] for e in EPOCHS]


def test_random_draw_is_independent_of_build_order():
    qs = [make_query(f"q{k}", n_pos=5) for k in range(4)]
    b = GroupBuilder(group_size=6, max_positives=2, positive_selection="random", negative_selection="random")
    forward = {q.query_id: b.build(q, q.positives("all"), 3).passage_ids for q in qs}
    backward = {q.query_id: b.build(q, q.positives("all"), 3).passage_ids for q in reversed(qs)}
    assert forward == backward
    # different query ids in the same epoch do not all draw the same positions
    positions = {tuple(int(pid.split("-p")[1]) for pid in ids[:2]) for ids in forward.values()}
    assert len(positions) > 1


def test_pin_first_keeps_first_positive():
    q = make_query(n_pos=6)
    positives = q.positives("heterogeneous")
    assert positives[0] == "q1-p0"  # the gold one
    b = GroupBuilder(group_size=5, max_positives=3, positive_selection="random", pin_first=True, seed=3)
    others = set()
    for epoch in EPOCHS:
        sel = b.build(q, positives, epoch).passage_ids[:3]
        assert sel[0] == positives[0]
        assert len(set(sel)) == 3 and set(sel) <= set(positives)
        others.add(frozenset(sel[1:]))
    assert len(others) > 1
    # without pinning, the first positive is sometimes left out
    b = GroupBuilder(group_size=5, max_positives=3, positive_selection="random", pin_first=False, seed=3)
    assert any(positives[0] not in b.build(q, positives, e).passage_ids[:3] for e in EPOCHS)


def test_pin_first_with_m_one_is_always_the_first():
    q = make_query(n_pos=4)
    b = GroupBuilder(group_size=3, max_positives=1, positive_selection="random", pin_first=True)
    assert all(b.build(q, q.positives("all"), e).passage_ids[0] == "q1-p0" for e in EPOCHS)


def test_single_positive_first():
    q = make_query(n_pos=5)
    positives = q.positives("all")
    b = GroupBuilder(group_size=4, max_positives=3, positive_selection="random", single_positive="first")
    for epoch in range(10):
        g = b.build(q, positives, epoch)
        assert g.n_positives == 1
        assert g.passage_ids[0] == positives[0]
        assert len(g.passage_ids) == 4
        negatives = g.passage_ids[1:]
        assert len(negatives) == 3 and not set(negatives) & set(positives)


def test_single_positive_random_uniform_and_deterministic():
    q = make_query(n_pos=4)
    positives = q.positives("all")
    b = GroupBuilder(group_size=4, max_positives=3, single_positive="random", seed=11)
    n_epochs = 400
    counts = Counter()
    for epoch in range(n_epochs):
        g = b.build(q, positives, epoch)
        assert g.n_positives == 1 and len(g.passage_ids) == 4
        assert g.passage_ids[0] in positives
        assert not set(g.passage_ids[1:]) & q.judged
        counts[g.passage_ids[0]] += 1
    assert set(counts) == set(positives)
    for p in positives:  # expected 100 each; binomial sd ≈ 8.7
        assert 60 <= counts[p] <= 140, counts
    b2 = GroupBuilder(group_size=4, max_positives=3, single_positive="random", seed=11)
    assert all(b2.build(q, positives, e).passage_ids == b.build(q, positives, e).passage_ids for e in range(20))


def test_select_positives_without_positives_raises():
    b = GroupBuilder(group_size=4, max_positives=2)
    q = TrainQuery("q", "t", gold=[], silver=["s"], negatives=["n1", "n2", "n3"])
    with pytest.raises(ValueError, match="without positives"):
        b.build(q, q.positives("heterogeneous"), 0)


# --------------------------------------------------------------------------------------------
# GroupBuilder: negatives
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("regime", ["gold", "homogeneous", "heterogeneous", "all"])
@pytest.mark.parametrize("single", [None, "first", "random"])
@pytest.mark.parametrize("neg_selection", ["first", "random"])
def test_judged_passages_never_negatives(regime, single, neg_selection):
    """Under every regime (e.g. ``gold`` leaves the silver positives out of D+) no judged passage of
    the query — any positive of any grade or an extra judged id — is used as a negative, even when
    it appears in the mined list or in the fallback ids."""
    q = make_query(n_pos=5, n_neg=3, extra_judged=("j1", "j2"))
    positives = q.positives(regime)
    fallback = [*q.gold, *q.silver, "j1", "j2", *corpus_ids(n=10)]
    b = GroupBuilder(group_size=8, max_positives=2, positive_selection="random", single_positive=single,
                     negative_selection=neg_selection)
    for epoch in range(15):
        g = b.build(q, positives, epoch, fallback_ids=fallback)
        negatives = g.passage_ids[g.n_positives:]
        assert len(g.passage_ids) == 8
        assert not set(negatives) & q.judged, negatives
        assert not set(negatives) & {*q.gold, *q.silver, "j1", "j2"}


def test_fallback_tops_up_short_mined_list():
    q = TrainQuery("q", "t", gold=["g"], silver=["s1", "s2"], negatives=["m1", "s1", "m2"], judged={"j"})
    fallback = ["g", "s1", "s2", "j", "m1", *corpus_ids("q", 8)]
    for neg_selection in ("first", "random"):
        b = GroupBuilder(group_size=6, max_positives=2, negative_selection=neg_selection)
        for epoch in range(10):
            g = b.build(q, q.positives("all"), epoch, fallback_ids=fallback)
            negatives = g.passage_ids[2:]
            assert len(negatives) == 4 and len(set(negatives)) == 4
            assert negatives[:2] == ["m1", "m2"]  # the whole mined list first, in order
            assert set(negatives[2:]) <= set(corpus_ids("q", 8))
            assert not set(negatives) & q.judged


def test_fallback_unused_when_mined_list_suffices():
    q = make_query(n_neg=10)
    b = GroupBuilder(group_size=4, max_positives=1, negative_selection="random")
    for epoch in range(10):
        g = b.build(q, q.positives("all"), epoch, fallback_ids=corpus_ids())
        assert all("-n" in pid for pid in g.passage_ids[1:])


def test_random_negatives_vary_across_epochs_first_do_not():
    q = make_query(n_neg=12)
    rnd = GroupBuilder(group_size=4, max_positives=1, negative_selection="random", seed=2)
    first = GroupBuilder(group_size=4, max_positives=1, negative_selection="first", seed=2)
    assert len({frozenset(rnd.build(q, q.positives("all"), e).passage_ids[1:]) for e in EPOCHS}) > 1
    assert len({tuple(first.build(q, q.positives("all"), e).passage_ids[1:]) for e in EPOCHS}) == 1
    pool = {f"q1-n{k}" for k in range(12)}
    assert all(set(rnd.build(q, q.positives("all"), e).passage_ids[1:]) <= pool for e in EPOCHS)


def test_not_enough_negatives_raises():
    q = TrainQuery("qx", "t", silver=["s1", "s2"], negatives=["n1", "s2"], judged={"j"})
    b = GroupBuilder(group_size=5, max_positives=2)
    with pytest.raises(ValueError, match="qx"):
        b.build(q, q.positives("homogeneous"), 0)
    with pytest.raises(ValueError, match="qx"):  # fallback holds only judged or already-taken ids
        b.build(q, q.positives("homogeneous"), 0, fallback_ids=["s1", "s2", "j", "n1", "c1"])
    g = b.build(q, q.positives("homogeneous"), 0, fallback_ids=["s1", "s2", "j", "n1", "c1", "c2"])
    assert g.passage_ids[:2] == ["s1", "s2"] and set(g.passage_ids[2:]) == {"n1", "c1", "c2"}


# --------------------------------------------------------------------------------------------
# group_masks
# --------------------------------------------------------------------------------------------

def test_group_masks_hand_built_batch():
    groups = [
        # query 0: positives a0, a1; x is also judged relevant to query 0 (e.g. silver not selected)
        Group("q0", "t0", ["a0", "a1", "h0", "h1"], 2, {"a0", "a1", "x"}),
        # query 1: x is its positive → false negative for query 0
        Group("q1", "t1", ["b0", "x", "h2", "h3"], 2, {"b0", "x"}),
        # query 2: its hard negative a1 is query 0's own positive; h0 shared with query 0's group
        Group("q2", "t2", ["c0", "h4", "a1", "h0"], 1, {"c0"}),
    ]
    pm, nm = group_masks(groups)
    assert pm.shape == nm.shape == (3, 12)
    assert pm.dtype == nm.dtype == torch.bool
    T, F = True, False
    expected_pm = torch.tensor([
        [T, T, F, F, F, F, F, F, F, F, F, F],
        [F, F, F, F, T, T, F, F, F, F, F, F],
        [F, F, F, F, F, F, F, F, T, F, F, F],
    ])
    expected_nm = torch.tensor([
        # a0 a1 h0 h1 b0 x  h2 h3 c0 h4 a1 h0
        [F, F, T, T, T, F, T, T, T, T, F, T],  # x and the second a1 ignored for q0
        [T, T, T, T, F, F, T, T, T, T, T, T],
        [T, T, T, T, T, T, T, T, F, T, T, T],
    ])
    assert torch.equal(pm, expected_pm)
    assert torch.equal(nm, expected_nm)
    assert not (pm & nm).any()
    # the false negatives for row 0 are in neither mask
    assert not pm[0, 5] and not nm[0, 5]
    assert not pm[0, 10] and not nm[0, 10]


def test_group_masks_from_builder_exhaustive():
    """Row i: positives = first n_positives columns of its own block; negatives = every column whose
    passage is not judged for query i; the rest (judged passages elsewhere) in neither mask."""
    qa = TrainQuery("qa", "t", gold=["g"], silver=["s1", "s2", "s3"], negatives=["n1", "n2", "shared", "s_b"])
    qb = TrainQuery("qb", "t", silver=["s_b", "s3"], negatives=["m1", "m2", "shared", "s2"])
    qc = TrainQuery("qc", "t", silver=["c1", "c2"], negatives=["k1", "k2", "g", "shared"])
    b = GroupBuilder(group_size=4, max_positives=2, positive_selection="random", negative_selection="first")
    for epoch in range(5):
        groups = [b.build(q, q.positives("all"), epoch) for q in (qa, qb, qc)]
        pm, nm = group_masks(groups)
        assert pm.shape == nm.shape == (3, 12)
        columns = [pid for g in groups for pid in g.passage_ids]
        for i, (q, g) in enumerate(zip((qa, qb, qc), groups)):
            own = range(4 * i, 4 * i + g.n_positives)
            for j, pid in enumerate(columns):
                if j in own:
                    assert pm[i, j] and not nm[i, j]
                elif pid in q.judged:
                    assert not pm[i, j] and not nm[i, j], (i, j, pid)
                else:
                    assert nm[i, j] and not pm[i, j], (i, j, pid)
            assert pm[i].sum() == g.n_positives
        # query b's positive "s3" (judged for qa) is never a negative of qa wherever it appears
        for j, pid in enumerate(columns):
            if pid in qa.judged:
                assert not nm[0, j]


def test_group_masks_single_positive_groups():
    b = GroupBuilder(group_size=3, max_positives=1, single_positive="first", negative_selection="first")
    qs = [make_query(f"q{k}", n_pos=3) for k in range(2)]
    groups = [b.build(q, q.positives("all"), 0) for q in qs]
    pm, nm = group_masks(groups)
    assert pm.sum(1).tolist() == [1, 1]
    assert pm[0, 0] and pm[1, 3]
    # own hard negatives and every passage of the other group are negatives
    assert nm[0].tolist() == [False, True, True, True, True, True]
    assert nm[1].tolist() == [True, True, True, False, True, True]
