"""SentenceTransformerTrainer with the cached multi-positive loss and the collator, on the tiny BERT: the held-out
loss falls, the saved model reloads (in sentence-transformers and in multipos), and a run resumed from a checkpoint
ends where the uninterrupted run ends."""

from __future__ import annotations

import pytest
import torch


def _trainer(model, out, train, dev, **args):
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from multipos.sentence_transformers import CachedMultiPositiveLoss, MultiPositiveDataCollator

    collator = MultiPositiveDataCollator(model.preprocess, max_positives=2, group_size=4, positive_selection="random",
                                         grade_weights={2: 1.0, 1: 0.5}, query_max_length=16, passage_max_length=32)
    settings = dict(per_device_train_batch_size=4, num_train_epochs=4, learning_rate=2e-3, warmup_steps=0,
                    save_strategy="steps", save_steps=4, eval_strategy="no", report_to=[], use_cpu=True, seed=0,
                    logging_steps=1, disable_tqdm=True, dataloader_num_workers=0)
    args = SentenceTransformerTrainingArguments(str(out), **{**settings, **args})
    loss = CachedMultiPositiveLoss(model, "jointlh_weighted", temperature=0.1, mini_batch_size=3)
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=train, eval_dataset=dev, loss=loss,
                                      data_collator=collator, callbacks=[collator.epoch_callback()])


@pytest.fixture(scope="module")
def dev(tiny_beir):
    from multipos.sentence_transformers import to_dataset

    return to_dataset(tiny_beir, "qrels-graded/dev.s-3.qrel", negative_depth=20)


def test_trains_saves_reloads_and_resumes(make_st, rows, dev, tmp_path):
    from sentence_transformers import SentenceTransformer

    from multipos.model.encoder import DualEncoder

    torch.manual_seed(0)
    model = make_st()
    trainer = _trainer(model, tmp_path / "run", rows, dev)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert trainer.state.global_step == 8 and after < before - 0.05, (before, after)

    model.save(str(tmp_path / "final"))
    texts = [*dev["query"], *dev["positives"][0]]
    reloaded = SentenceTransformer(str(tmp_path / "final"), device="cpu")
    torch.testing.assert_close(reloaded.encode(texts, convert_to_tensor=True),
                               model.encode(texts, convert_to_tensor=True), rtol=1e-5, atol=1e-6)
    multipos = DualEncoder(str(tmp_path / "final")).eval()  # a saved model is a multipos checkpoint too
    with torch.no_grad():
        emb = multipos.encode_passages(multipos.tokenize(texts))
    torch.testing.assert_close(emb, model.encode(texts, convert_to_tensor=True), rtol=1e-4, atol=1e-5)

    resumed = make_st()  # the same starting weights; the checkpoint's replace them
    second = _trainer(resumed, tmp_path / "resumed", rows, dev)
    second.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-4"))
    assert second.state.global_step == 8
    for name, p in resumed.named_parameters():
        torch.testing.assert_close(p, dict(model.named_parameters())[name], rtol=1e-5, atol=1e-6)
