"""Query / passage prompts and last-token pooling (issue "Today's retrievers"): multipos and sentence-transformers
embed a saved model the same way; a decoder embedder built here (no hub) pools its EOS state on either padding side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from multipos.model.encoder import DualEncoder, pool
from multipos.model.export import read_settings
from multipos.model.tokenization import ensure_eos
from multipos.retrieval.encoding import encode

QUERIES = ["protein diet study", "heart risk"]
PASSAGES = ["a study of protein and diet in adults", "heart disease risk and exercise", "sleep"]


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory) -> Path:
    """A 2-layer, 32-dim randomly initialised Llama-style decoder (rotary positions, so left padding does not move
    a text's relative positions) with a word-level fast tokenizer that pads left and does not append EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaModel, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tiny_decoder")
    words = sorted({w for t in QUERIES + PASSAGES for w in t.split()} | {"query:", "passage:", "represent"})
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "</s>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="</s>",
                                  padding_side="left")
    tok.save_pretrained(root)
    torch.manual_seed(0)
    LlamaModel(LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                           pad_token_id=0, eos_token_id=2)).save_pretrained(root)
    return root


def _st_model(path):
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(path), device="cpu")


def test_prompts_go_before_every_text_and_are_saved_as_sentence_transformers_prompts(tiny_bert, tmp_path):
    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True, query_prompt="query: ",
                        passage_prompt="passage: ")
    tokens = model.tokenize(["heart"], kind="query")
    plain = model.tokenizer(["query: heart"], return_tensors="pt")
    assert torch.equal(tokens["input_ids"], plain["input_ids"])
    model.save_pretrained(tmp_path / "model")
    saved = json.loads((tmp_path / "model" / "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == {"query": "query: ", "document": "passage: "}
    assert read_settings(tmp_path / "model") == {"pooling": "mean", "normalize": True, "query_prompt": "query: ",
                                                 "passage_prompt": "passage: "}
    again = DualEncoder(str(tmp_path / "model"))
    assert (again.query_prompt, again.passage_prompt) == ("query: ", "passage: ")
    # sentence-transformers applies them in encode_query / encode_document: the same embeddings as multipos
    st = _st_model(tmp_path / "model")
    model.eval()
    q = torch.as_tensor(encode(model, QUERIES, "query", progress=False, bf16=False)).float()
    p = torch.as_tensor(encode(model, PASSAGES, "passage", progress=False, bf16=False)).float()
    torch.testing.assert_close(torch.as_tensor(st.encode_query(QUERIES)).float(), q, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.as_tensor(st.encode_document(PASSAGES)).float(), p, atol=1e-5, rtol=1e-4)
    # without prompts the embeddings differ (the prompt is really part of the input)
    bare = DualEncoder(str(tiny_bert), pooling="mean", normalize=True).eval()
    assert not torch.allclose(torch.as_tensor(encode(bare, QUERIES, "query", progress=False, bf16=False)).float(), q,
                              atol=1e-4)


def test_a_given_prompt_and_the_checkpoint_s_own(tiny_bert, tmp_path):
    """None = the checkpoint's prompts (a sentence-transformers folder's ``prompts``); a given prompt wins over a
    checkpoint without saved ones; no prompt anywhere = none."""
    assert (DualEncoder(str(tiny_bert)).query_prompt, DualEncoder(str(tiny_bert)).passage_prompt) == ("", "")
    DualEncoder(str(tiny_bert), query_prompt="query: ").save_pretrained(tmp_path / "m")
    cfg = tmp_path / "m" / "multipos_encoder.json"
    cfg.unlink()  # only the sentence-transformers files say it now
    assert DualEncoder(str(tmp_path / "m")).query_prompt == "query: "
    assert DualEncoder(str(tmp_path / "m"), query_prompt="search: ").query_prompt == "search: "


def test_training_batches_carry_the_model_s_prompts(tiny_beir, tiny_bert):
    from multipos.data import MultiPosDataModule, StageInputs
    from multipos.data.sources import BeirGradedSource

    model = DualEncoder(str(tiny_bert), query_prompt="query: ", passage_prompt="passage: ")
    dm = MultiPosDataModule(BeirGradedSource(str(tiny_beir), "qrels-graded/train.s-3.qrel", negative_depth=20),
                            str(tiny_bert), regime="heterogeneous", group_size=4, max_positives=2, batch_size=2)
    dm.set_inputs(StageInputs.of_encoder(model))
    dm.set_stage("heterogeneous", None)
    dm.setup()
    batch = dm.collate([dm.dataset[(0, 0)], dm.dataset[(1, 0)]])
    query = dm.dataset[(0, 0)].query
    expected = model.tokenize([query], kind="query")["input_ids"][0]  # "query: <text>"
    assert batch.query["input_ids"][0][: len(expected)].tolist() == expected.tolist()
    assert len(expected) > len(model.tokenizer([query])["input_ids"][0])  # the prompt's tokens are there


def test_last_token_pooling_takes_the_last_attended_position_on_either_padding_side():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    assert torch.equal(pool(hidden, right, "lasttoken"), hidden[[0, 1], [2, 3]])
    assert torch.equal(pool(hidden, left, "lasttoken"), hidden[[0, 1], [3, 3]])


def test_decoder_embedder_appends_eos_pools_it_and_exports_the_same_pooling(tiny_decoder, tmp_path):
    model = DualEncoder(str(tiny_decoder), pooling="lasttoken", normalize=True, query_prompt="query: ").eval()
    ids = model.tokenize(["heart risk"], kind="query")["input_ids"][0].tolist()
    assert ids[-1] == model.tokenizer.eos_token_id and not ensure_eos(model.tokenizer)  # appended once, idempotent
    # left padding: a query alone and the same query in a padded batch pool the same EOS state
    alone = torch.as_tensor(encode(model, ["heart"], "query", progress=False, bf16=False))
    batched = torch.as_tensor(encode(model, ["heart", "protein diet study"], "query", progress=False, bf16=False))
    assert model.tokenizer.padding_side == "left"
    torch.testing.assert_close(alone[0], batched[0], atol=1e-5, rtol=1e-4)
    model.save_pretrained(tmp_path / "model")
    assert read_settings(tmp_path / "model")["pooling"] == "lasttoken"
    st = _st_model(tmp_path / "model")
    q = torch.as_tensor(encode(model, QUERIES, "query", progress=False, bf16=False)).float()
    p = torch.as_tensor(encode(model, PASSAGES, "passage", progress=False, bf16=False)).float()
    torch.testing.assert_close(torch.as_tensor(st.encode_query(QUERIES)).float(), q, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.as_tensor(st.encode_document(PASSAGES)).float(), p, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("existing", ["bos_template", "byte_level"])
def test_eos_is_appended_after_what_the_tokenizer_already_does(tiny_decoder, tmp_path, existing):
    """A post-processor that adds BOS (Llama-style) keeps it, one that adds no token (byte-level offsets, GPT-2 /
    Qwen-style) keeps working; EOS comes last, once, and the rule survives save / load."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_decoder))
    if existing == "bos_template":
        tok.add_special_tokens({"bos_token": "<s>"})
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<s>:0 $A:0", pair="<s>:0 $A:0 $B:1", special_tokens=[("<s>", tok.bos_token_id)])
    else:
        tok.backend_tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    plain = tok("heart risk")["input_ids"]
    assert ensure_eos(tok)
    ids = tok("heart risk")["input_ids"]
    assert ids == [*plain, tok.eos_token_id]
    tok.save_pretrained(tmp_path / "tok")
    again = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert again("heart risk")["input_ids"] == ids and not ensure_eos(again)


def test_last_token_pooling_needs_an_eos_token(tiny_bert):
    with pytest.raises(ValueError, match="lasttoken needs a tokenizer with an EOS token"):
        DualEncoder(str(tiny_bert), pooling="lasttoken")
