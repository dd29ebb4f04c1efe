"""Fixtures of the annotation tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_lm(tiny_bert, tmp_path_factory):
    """A 1-layer GPT-2 with random weights over the tiny BERT's vocabulary, and a chat template."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("tiny_lm")
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    tok.eos_token = tok.sep_token
    tok.save_pretrained(folder)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_layer=1, n_embd=16, n_head=2, n_positions=512)).save_pretrained(
        folder)
    return folder
