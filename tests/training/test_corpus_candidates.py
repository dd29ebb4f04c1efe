"""multipos.training.corpus_candidates: the chunked full-corpus objectives equal the unchunked [B, N] ones, loss
and gradient."""

from __future__ import annotations

import pytest
import torch

from multipos.losses import HARDEST_NEGATIVE, OBJECTIVES, SINGLE_POSITIVE, compute
from multipos.training.corpus_candidates import (
    DEFAULT_CHUNK_SIZE,
    FREE_MEMORY_SHARE,
    auto_chunk_size,
    chunk_bytes_per_row,
    corpus_scores,
    corpus_targets,
    full_corpus_scores,
    negative_summary,
    resolve_chunk_size,
    split_product,
)

N, H = 103, 16
IDS = [f"d{i}" for i in range(N)]
ROW = {p: i for i, p in enumerate(IDS)}
POSITIVES = [["d1", "d5", "d7"], ["d3"], ["d10", "d11"], ["d50", "d51", "d52", "d53"], ["d102"]]
JUDGED = [{"d8", "d9"}, {"d4", "d60"}, set(), {"d54"}, {"not-in-corpus"}]


def _corpus(dtype):
    g = torch.Generator().manual_seed(0)
    return torch.nn.functional.normalize(torch.randn(N, H, generator=g, dtype=dtype), dim=-1)


def _loss_and_grad(name, q0, passages, chunk_size=None, tau=0.05, product="cast"):
    positives = [p[:1] for p in POSITIVES] if name in SINGLE_POSITIVE else POSITIVES
    targets = corpus_targets(positives, JUDGED, ROW)
    q = q0.clone().requires_grad_()
    if chunk_size is None:
        scores, pos, neg = full_corpus_scores(q, passages, tau, targets)
    else:
        summary = "max" if name in HARDEST_NEGATIVE else "lse"
        scores, pos, neg = corpus_scores(q, passages, tau, targets, chunk_size, summary, product)
    loss = compute(name, scores, pos, neg).mean()
    (grad,) = torch.autograd.grad(loss, q)
    return loss.detach(), grad


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
@pytest.mark.parametrize("chunk_size", [1, 7, 64, N, 1000])  # N and above: the whole corpus in one chunk
def test_chunked_equals_unchunked_in_float64(name, chunk_size):
    passages = _corpus(torch.float64)
    q0 = torch.randn(len(POSITIVES), H, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref_loss, ref_grad = _loss_and_grad(name, q0, passages)
    loss, grad = _loss_and_grad(name, q0, passages, chunk_size)
    assert abs(float(loss - ref_loss)) < 1e-6
    assert float((grad - ref_grad).abs().max()) < 1e-6
    assert float(ref_grad.abs().max()) > 1e-3  # a gradient that means something


@pytest.mark.parametrize("name", ["jointlh", "lsepair", "lsepair_minp_maxn"])
def test_chunked_equals_unchunked_in_float32_and_bf16_index(name):
    q0 = torch.randn(len(POSITIVES), H, generator=torch.Generator().manual_seed(2))
    for passages in (_corpus(torch.float32), _corpus(torch.float32).to(torch.bfloat16)):
        ref_loss, ref_grad = _loss_and_grad(name, q0, passages)
        loss, grad = _loss_and_grad(name, q0, passages, 16)
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5, abs=1e-5)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["jointlh", "lsepair", "lsepair_maxn"])
def test_the_split_product_equals_the_cast_one_in_float64(name):
    """#68: queries split into two halves of the index's dtype (float32 halves of float64 queries here) give today's
    chunked loss and gradients; on a GPU the halves are bf16 and the index is never cast (tests/test_cuda.py)."""
    passages = _corpus(torch.float64).to(torch.float32)
    q0 = torch.randn(len(POSITIVES), H, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    ref_loss, ref_grad = _loss_and_grad(name, q0, passages, 16)
    loss, grad = _loss_and_grad(name, q0, passages, 16, product="split")
    assert abs(float(loss - ref_loss)) < 1e-6 and float((grad - ref_grad).abs().max()) < 1e-6
    with pytest.raises(ValueError, match="unknown index product 'tf32'"):
        _loss_and_grad(name, q0, passages, 16, product="tf32")


def test_a_split_into_bf16_halves_keeps_about_16_bits_where_one_rounding_keeps_8():
    g = torch.Generator().manual_seed(5)
    a = torch.randn(64, 384, generator=g)
    b = torch.nn.functional.normalize(torch.randn(3633, 384, generator=g), dim=-1).to(torch.bfloat16).T
    exact = a.double() @ b.double()
    split = (split_product(a, b).double() - exact).abs().max()
    rounded = (a.to(torch.bfloat16).double() @ b.double() - exact).abs().max()
    assert split < 0.01 * rounded and split < 2 ** -14 * exact.abs().max()  # 1.3e-5 against 7.8e-3
    assert torch.equal(split_product(a, a.T), a @ a.T)  # one dtype: a plain product


@pytest.mark.parametrize("name", ["jointlh", "lsepair_maxn"])
def test_corpus_scores_stay_float32_under_bf16_autocast(name):
    """bf16-mixed training runs the forward and the loss under autocast (the backward outside it, as Lightning
    does): the corpus scores, the loss and the query gradient are the float32 ones."""
    q0 = torch.nn.functional.normalize(torch.randn(len(POSITIVES), H, generator=torch.Generator().manual_seed(3)),
                                       dim=-1)
    passages = _corpus(torch.float32)
    targets = corpus_targets(POSITIVES, JUDGED, ROW)
    summary = "max" if name in HARDEST_NEGATIVE else "lse"
    results = []
    for bf16 in (False, True):
        q = q0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            scores, pos, neg = corpus_scores(q, passages, 0.05, targets, 16, summary)
            loss = compute(name, scores, pos, neg).mean()
        results.append((scores.dtype, loss.detach(), torch.autograd.grad(loss, q)[0]))
    (dtype, ref_loss, ref_grad), (bf16_dtype, loss, grad) = results
    assert dtype == bf16_dtype == torch.float32
    assert float(loss) == float(ref_loss) and torch.equal(grad, ref_grad)


def test_judged_passages_and_positives_are_never_negatives():
    """Making a judged passage score enormously changes nothing; making an unjudged one do so raises the loss."""
    passages = _corpus(torch.float64)
    targets = corpus_targets(POSITIVES, JUDGED, ROW)
    q = torch.randn(len(POSITIVES), H, dtype=torch.float64)
    base = negative_summary(q, passages, 0.05, targets.judged, 10)
    boosted = passages.clone()
    boosted[ROW["d8"]] = q[0] * 10  # judged for query 0
    boosted[ROW["d5"]] = q[0] * 10  # a positive of query 0
    assert float(negative_summary(q, boosted, 0.05, targets.judged, 10)[0]) == pytest.approx(float(base[0]))
    boosted[ROW["d20"]] = q[0] * 10  # not judged for query 0
    assert float(negative_summary(q, boosted, 0.05, targets.judged, 10)[0]) > float(base[0]) + 10


def test_a_query_without_negatives_gets_the_empty_summary():
    passages = _corpus(torch.float64)[:3]
    targets = corpus_targets([["d0"]], [{"d1", "d2"}], {p: i for i, p in enumerate(IDS[:3])})
    q = torch.randn(1, H, dtype=torch.float64, requires_grad=True)
    for summary in ("lse", "max"):
        value = negative_summary(q, passages, 0.05, targets.judged, 2, summary)
        assert float(value.detach()) < -1e29
        value.sum().backward()
        assert torch.isfinite(q.grad).all()


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="not in the corpus"):
        corpus_targets([["nope"]], [set()], ROW)
    with pytest.raises(ValueError, match="no positive"):
        corpus_targets([[]], [set()], ROW)
    q = torch.randn(1, H)
    with pytest.raises(ValueError, match="unknown negative summary"):
        negative_summary(q, _corpus(torch.float32), 0.05, torch.zeros(0, 2, dtype=torch.long), 8, "mean")
    with pytest.raises(ValueError, match="chunk_size"):
        negative_summary(q, _corpus(torch.float32), 0.05, torch.zeros(0, 2, dtype=torch.long), 0)


def test_auto_chunk_size_fits_the_free_device_memory_and_takes_the_whole_corpus_where_it_can():
    """``passages.chunk_size=auto``: on a CUDA device as many rows as fit in half its free memory (one chunk, the
    whole corpus, where it all fits; at least 1,024 rows); on a CPU the fixed default."""
    cuda = torch.device("cuda")
    B, H_, rows = 128, 768, 8_841_823
    per_row = chunk_bytes_per_row(B, H_)
    assert per_row == B * 17 + 4 * H_
    assert auto_chunk_size(B, rows, H_, cuda, free_bytes=140 * 10**9) == rows  # an H200: one chunk
    part = auto_chunk_size(B, rows, H_, cuda, free_bytes=20 * 10**9)
    assert part == int(FREE_MEMORY_SHARE * 20 * 10**9) // per_row < rows
    assert auto_chunk_size(B, rows, H_, cuda, free_bytes=10**6) == 1024
    assert auto_chunk_size(B, 500, H_, cuda, free_bytes=10**6) == 500
    cpu = torch.device("cpu")
    assert auto_chunk_size(B, rows, H_, cpu) == DEFAULT_CHUNK_SIZE and auto_chunk_size(B, 3633, H_, cpu) == 3633
    with pytest.raises(ValueError, match="must be >= 1"):
        auto_chunk_size(0, rows, H_, cpu)


def test_resolve_chunk_size_logs_auto_and_refuses_bad_settings(caplog):
    cpu = torch.device("cpu")
    with caplog.at_level("INFO", logger="multipos.training.corpus_candidates"):
        assert resolve_chunk_size("auto", 64, 3633, 384, cpu) == 3633
    assert ("passages.chunk_size=auto: 3633 corpus rows a chunk (one chunk of 3633 rows; B=64, dim 384, cpu)"
            in caplog.text)
    assert resolve_chunk_size(4096, 64, 3633, 384, cpu) == resolve_chunk_size("4096", 64, 3633, 384, cpu) == 4096
    for bad in (0, "lots"):
        with pytest.raises(ValueError, match="passages.chunk_size"):
            resolve_chunk_size(bad, 64, 3633, 384, cpu)
