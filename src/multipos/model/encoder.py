"""Dual encoder E_q, E_d over Hugging Face ``AutoModel`` (paper Sec. 3, "Dual encoder")."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoModel, AutoTokenizer

from multipos import atomic
from multipos.assets import ENCODER_SETTINGS_FILE, cache_dir, check_checkpoint_dir, resolve_model
from multipos.model.export import POOLING_MODES, write_side
from multipos.model.lora import LoraSettings, add_adapters, has_adapters, merged_copy, save_adapter
from multipos.model.packing import encode_packed, packing_applies
from multipos.model.settings import resolve_settings
from multipos.model.tokenization import check_tokenizer, ensure_eos

log = logging.getLogger(__name__)

POOLINGS = tuple(POOLING_MODES)  # cls, mean, lasttoken
_CONFIG_FILE = ENCODER_SETTINGS_FILE


def pool(hidden: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """Pool token states [B, L, H] with mask [B, L] into [B, H] by ``cls`` (first token), ``mean`` (over the
    attended tokens) or ``lasttoken`` (the last attended position, whichever side the padding is on: the EOS token
    of a decoder embedder, :func:`multipos.model.tokenization.ensure_eos`; as sentence-transformers' ``lasttoken``
    mode).

    Raises ValueError for an unknown pooling name.
    """
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    if pooling == "lasttoken":
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (attention_mask.to(torch.long) * positions).argmax(dim=1)  # [B]
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"unknown pooling {pooling!r} (model.pooling); allowed: {', '.join(POOLINGS)}")


def _dtype_kwarg() -> str:
    """Name of ``from_pretrained``'s dtype argument: ``dtype`` from transformers 4.56 on, ``torch_dtype`` before."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__).release >= (4, 56) else "torch_dtype"


#: The tokenizer outputs the encoders read from a batch (:meth:`DualEncoder.encode_queries`): a training batch
#: carries these only (:class:`multipos.data.collate.GroupCollator`), not ``token_type_ids``, which single-text inputs
#: hold as zeros and which the encoder then takes as its default.
ENCODER_INPUTS = ("input_ids", "attention_mask")


class DualEncoder(nn.Module):
    """Query and passage encoders with s(q, d) = ⟨E_q(q), E_d(d)⟩ / τ.

    Args:
        name_or_path: HF checkpoint folder, bare asset name or hub id (see :func:`resolve_model`).
        pooling: ``cls``, ``mean`` or ``lasttoken`` (decoder embedders: the tokenizer is made to append its EOS
            token where it does not, :func:`multipos.model.tokenization.ensure_eos`).
        normalize: L2-normalise embeddings (cosine similarity).
        temperature: τ > 0; scores are divided by it (1.0 = raw dot product).
        shared: one encoder for queries and passages (True) or untied copies (False).
        query_max_length, passage_max_length: truncation lengths in tokens.
        attention_dropout: override the checkpoint's attention-probability dropout (None = keep).
            ``model=minilm`` uses 0.0: in a profiler run, sampling the [B·G, heads, L, L] masks took
            about half of MiniLM's training forward pass on CPU (the full-step benchmark in
            ``bench/`` showed a smaller difference).
        hidden_dropout: override the checkpoint's hidden-state dropout (None = keep).
        query_prompt, passage_prompt: text put before every query / passage before tokenization (E5: ``"query: "``
            / ``"passage: "``; BGE: an instruction before queries only; ``conf/prompts``); None = the checkpoint's
            (saved ones, else its sentence-transformers ``prompts``), else none. Saved with the model and written as
            its sentence-transformers prompts, so ``encode_query`` / ``encode_document`` apply them.
        lora: LoRA adapters (:class:`multipos.model.lora.LoraSettings` fields: ``r``, ``alpha``, ``dropout``,
            ``target_modules``, ``sides``, ``save_adapter``); only the adapters train, and a saved model holds the
            merged weights. None = full fine-tuning.
        prefer_saved: when the checkpoint folder has ``multipos_encoder.json`` (written by
            :meth:`save_pretrained`), its pooling/normalize/temperature/shared/prompts win over the values given
            here (each difference is logged as a warning naming the field, both values and the file).
            False: the values given here win (None still means "the saved value").
        trust_remote_code: passed to ``AutoModel``/``AutoTokenizer``; off unless configured.
        pack_sequences: encode training batches on a CPU unpadded, texts end to end in rows of this many tokens
            (:mod:`multipos.model.packing`; the same loss and gradients up to rounding); 0 = padded batches.

    Where the settings come from, per field: the saved ``multipos_encoder.json`` (or the argument, with
    ``prefer_saved=False``), else the argument, else the checkpoint's sentence-transformers files
    (``modules.json`` + ``1_Pooling``/``Normalize``: mean + L2 for all-MiniLM-L6-v2), else cls / no
    normalisation / τ 1.0 / shared.

    Weights are always loaded in float32 (``dtype=torch.float32``; transformers ≥ 5 would otherwise keep the
    dtype a checkpoint was saved in, and an fp16/bf16 checkpoint then fails on CPU): mixed precision is
    autocast's job (``trainer.precision``, ``eval.bf16``).

    Saved folders (:meth:`save_pretrained`) are Hugging Face *and* sentence-transformers folders:

    * shared encoder: ``model/`` itself is the checkpoint. ``AutoModel.from_pretrained("model/")`` and
      ``AutoTokenizer.from_pretrained("model/")`` load the encoder; ``SentenceTransformer("model/")`` gives
      the same embeddings as :meth:`encode_passages` (pooling, L2 normalisation; ``max_seq_length`` =
      ``passage_max_length``: for queries set ``st.max_seq_length = query_max_length`` to match
      :meth:`encode_queries` on long queries). ``DualEncoder("model/")`` restores everything.
    * untied encoders (``shared=False``): ``model/`` holds only ``multipos_encoder.json`` and two complete
      folders, ``model/query_encoder/`` (``max_seq_length`` = ``query_max_length``) and
      ``model/passage_encoder/`` (``passage_max_length``); ``AutoModel.from_pretrained("model/")`` and
      ``SentenceTransformer("model/")`` do **not** work on the parent: load each side from its subfolder
      (``SentenceTransformer("model/query_encoder")`` for queries, ``SentenceTransformer("model/passage_encoder")``
      for passages, likewise ``AutoModel``/``AutoTokenizer``). ``DualEncoder("model/")`` loads both.

    τ is not part of sentence-transformers embeddings: its similarity (``similarity_fn_name``: ``dot``, or
    ``cosine`` with normalisation) is multipos's score times τ, so scores differ by the constant factor 1/τ
    but rankings are the same.

    Raises: FileNotFoundError for a folder that is not a checkpoint (:func:`~multipos.assets.check_checkpoint_dir`)
    or a path that does not exist; ValueError for an unknown pooling, τ ≤ 0, or a tokenizer with more tokens
    than the model's embedding rows (:func:`multipos.model.tokenization.check_tokenizer`).
    """

    def __init__(
        self,
        name_or_path: str,
        pooling: str | None = None,
        normalize: bool | None = None,
        temperature: float | None = None,
        shared: bool | None = None,
        query_max_length: int = 32,
        passage_max_length: int = 128,
        attention_dropout: float | None = None,
        hidden_dropout: float | None = None,
        prefer_saved: bool = True,
        trust_remote_code: bool = False,
        query_prompt: str | None = None,
        passage_prompt: str | None = None,
        lora: dict | None = None,
        pack_sequences: int = 0,
    ):
        super().__init__()
        path = resolve_model(name_or_path)
        if Path(path).is_dir():
            check_checkpoint_dir(path)
        given = {"pooling": pooling, "normalize": normalize, "temperature": temperature, "shared": shared,
                 "query_prompt": query_prompt, "passage_prompt": passage_prompt}
        settings = resolve_settings(path, given, prefer_saved)
        self.pooling = settings["pooling"]
        self.normalize = settings["normalize"]
        self.temperature = settings["temperature"]
        self.shared = settings["shared"]
        self.query_prompt, self.passage_prompt = settings["query_prompt"], settings["passage_prompt"]
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r} (model.pooling); allowed: {', '.join(POOLINGS)}")
        if self.temperature <= 0:
            raise ValueError(f"model.temperature must be > 0, got {self.temperature}")
        self.query_max_length = query_max_length
        #: training batches on a CPU encoded packed, rows of this many tokens (config ``pack_sequences``, given by the
        #: training job; :mod:`multipos.model.packing`): 0 = padded batches
        self.pack_sequences = int(pack_sequences or 0)
        self.passage_max_length = passage_max_length
        self.name_or_path = path
        self.prefer_saved = prefer_saved
        self.trust_remote_code = trust_remote_code
        untied_saved = Path(path, "query_encoder").is_dir()
        kwargs = {_dtype_kwarg(): torch.float32, "trust_remote_code": trust_remote_code}
        if attention_dropout is not None:
            kwargs["attention_probs_dropout_prob"] = attention_dropout
        if hidden_dropout is not None:
            kwargs["hidden_dropout_prob"] = hidden_dropout
        query_path = str(Path(path, "query_encoder")) if untied_saved else path
        self._passage_source = (str(Path(path, "passage_encoder")) if untied_saved else path, kwargs)
        self.query_encoder = AutoModel.from_pretrained(query_path, **kwargs)
        self.lora = LoraSettings.from_config(lora)
        if self.lora and self.lora.sides == "query":  # adapters on E_q only: E_d is its own (plain) encoder
            self.shared = False
        if self.shared:
            self.passage_encoder = self.query_encoder
        else:
            self.passage_encoder = AutoModel.from_pretrained(self._passage_source[0], **kwargs)
        if self.lora:
            self.query_encoder = add_adapters(self.query_encoder, self.lora)
            if self.shared:
                self.passage_encoder = self.query_encoder
            elif self.lora.sides == "both":
                self.passage_encoder = add_adapters(self.passage_encoder, self.lora)
        # from_pretrained returns eval mode; training must turn dropout back on (MACHINE-NOTES).
        self.train()
        self.tokenizer = AutoTokenizer.from_pretrained(query_path, trust_remote_code=trust_remote_code)
        if self.pooling == "lasttoken" and ensure_eos(self.tokenizer):
            log.info("model.pooling=lasttoken: the tokenizer now appends its EOS token %r", self.tokenizer.eos_token)
        check_tokenizer(self.tokenizer, self.query_encoder, query_path)
        if not self.shared:
            check_tokenizer(self.tokenizer, self.passage_encoder, query_path)

    def starting_point(self, start: str) -> DualEncoder:
        """The checkpoint ``start`` (folder, asset name or hub id) as a shared-encoder :class:`DualEncoder` with this
        model's pooling, normalisation and temperature (its saved settings ignored): θ0 of WiSE-FT
        (:func:`multipos.model.interpolation.interpolate_toward_start`)."""
        return DualEncoder(start, pooling=self.pooling, normalize=self.normalize, temperature=self.temperature,
                           shared=True, prefer_saved=False)

    def freeze_passage_encoder(self) -> None:
        """Query-side fine-tuning (DensePhrases, Lee et al. 2021): E_d stays the current (starting) weights and only
        E_q trains. A shared encoder is untied first: the passage side becomes a copy, so the saved model is the
        untied layout (``query_encoder/`` trained, ``passage_encoder/`` the starting checkpoint)."""
        if has_adapters(self.passage_encoder):
            # LoRA: the plain starting weights (no adapter layers: the same weight names, so the corpus embeddings
            # the zero-shot reference cached are found again)
            source, kwargs = self._passage_source
            self.passage_encoder = AutoModel.from_pretrained(source, **kwargs).to(
                next(self.query_encoder.parameters()).device)
        elif self.shared:
            import copy

            self.passage_encoder = copy.deepcopy(self.query_encoder)
        self.shared = False
        self.passage_encoder.requires_grad_(False)

    @property
    def passage_frozen(self) -> bool:
        """True when no passage-encoder weight trains (:meth:`freeze_passage_encoder`)."""
        return not self.shared and not any(p.requires_grad for p in self.passage_encoder.parameters())

    @property
    def hidden_size(self) -> int:
        """H: the width of the query encoder's hidden states, which pooling keeps (embeddings are [n, H])."""
        return self.query_encoder.config.hidden_size

    def _embed(self, encoder: nn.Module, tokens: dict[str, Tensor]) -> Tensor:
        if (self.pack_sequences and encoder.training
                and packing_applies(encoder, tokens, self.pooling, self._pooled_padded)):  # CPU training batches
            emb = encode_packed(encoder, tokens, self.pooling, self.pack_sequences)
        else:
            emb = self._pooled_padded(encoder, tokens)
        if self.normalize:
            emb = nn.functional.normalize(emb.float(), dim=-1)
        return emb

    def _pooled_padded(self, encoder: nn.Module, tokens: dict[str, Tensor]) -> Tensor:
        out = encoder(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
        return pool(out.last_hidden_state, tokens["attention_mask"], self.pooling)

    def encode_queries(self, tokens: dict[str, Tensor]) -> Tensor:
        """Query embeddings [B, H] from tokenizer output (``input_ids``, ``attention_mask`` [B, Lq])."""
        return self._embed(self.query_encoder, tokens)

    def encode_passages(self, tokens: dict[str, Tensor]) -> Tensor:
        """Passage embeddings [N, H] from tokenizer output ([N, Lp])."""
        return self._embed(self.passage_encoder, tokens)

    def score(self, q: Tensor, p: Tensor) -> Tensor:
        """Score matrix [B, N] = q [B, H] · p [N, H]ᵀ / τ, in float32."""
        return q.float() @ p.float().T / self.temperature

    def prompt(self, kind: str) -> str:
        """The prompt put before a ``query`` or ``passage`` text (``""`` for none)."""
        return self.query_prompt if kind == "query" else self.passage_prompt

    def tokenize(self, texts: list[str], kind: str = "passage", max_length: int | None = None) -> dict[str, Tensor]:
        """Tokenise ``texts`` (``kind``'s prompt first, :meth:`prompt`) with padding to the longest, truncated to
        the query/passage length in tokens (the prompt's tokens included, as sentence-transformers counts them)."""
        if max_length is None:
            max_length = self.query_max_length if kind == "query" else self.passage_max_length
        prompt = self.prompt(kind)
        texts = [prompt + t for t in texts] if prompt else list(texts)
        return self.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")

    def _save_side(self, folder: Path, encoder: nn.Module, max_length: int) -> None:
        """One encoder + tokenizer as a folder that is both a HF checkpoint and a sentence-transformers model
        (LoRA: the merged weights, and with ``lora.save_adapter`` the adapter alone in ``<folder>/adapter/``)."""
        if self.lora and self.lora.save_adapter and has_adapters(encoder):
            save_adapter(encoder, folder / "adapter")
        write_side(folder, merged_copy(encoder), self.tokenizer, self.pooling, self.normalize, max_length,
                   self.query_prompt, self.passage_prompt)

    def save_pretrained(self, path: str | Path) -> None:
        """Save as a Hugging Face + sentence-transformers folder (layout: see the class docstring).

        Shared encoder: ``path`` is loadable by ``AutoModel``/``AutoTokenizer``/``SentenceTransformer``.
        Untied encoders: ``path/query_encoder/`` and ``path/passage_encoder/`` are, each on its own; ``path``
        itself is not. Pooling, normalisation, τ, ``shared`` and the prompts go to ``multipos_encoder.json``; the
        prompts also to each side's sentence-transformers ``prompts`` (:func:`multipos.model.export.write_side`).

        A frozen passage encoder (query-side fine-tuning) writes the starting weights that every query-side run
        writes: its ``*.safetensors`` are hard links into ``<cache>/frozen_passage_encoders/`` where the file system
        allows (:func:`multipos.atomic.share_identical`; plain files to every reader, stored once on the disk).

        The folder is written to ``<path>.tmp-<pid>`` and renamed to ``path`` when complete (an existing
        ``path`` is moved aside first and removed afterwards; :func:`multipos.atomic.replace_dir`), so ``path``
        is never a half-written model.
        Raises FileExistsError when ``path`` is a file or a non-empty folder that is not a saved model.
        """
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"{path} exists and is not a folder; not replacing it with a model")
        if path.is_dir() and any(path.iterdir()) and not any(
                (path / f).exists() for f in (_CONFIG_FILE, "config.json", "modules.json")):
            raise FileExistsError(f"{path} is a non-empty folder that is not a saved model; not replacing it")
        with atomic.replace_dir(path) as tmp:  # <path>.tmp-<pid>, renamed over path once complete
            if self.shared:
                self._save_side(tmp, self.query_encoder, self.passage_max_length)
            else:
                self._save_side(tmp / "query_encoder", self.query_encoder, self.query_max_length)
                self._save_side(tmp / "passage_encoder", self.passage_encoder, self.passage_max_length)
                if self.passage_frozen:  # the starting weights, the same in every query-side run: stored once
                    for weights in (tmp / "passage_encoder").glob("*.safetensors"):
                        atomic.share_identical(weights, cache_dir() / "frozen_passage_encoders")
            meta = {"pooling": self.pooling, "normalize": self.normalize, "temperature": self.temperature,
                    "shared": self.shared, "query_prompt": self.query_prompt, "passage_prompt": self.passage_prompt}
            atomic.write_json(tmp / _CONFIG_FILE, meta)

    @torch.no_grad()
    def fingerprint(self, include_query: bool = False) -> str:
        """Cheap content hash of the passage encoder weights and pooling/normalisation (for embedding caches).

        ``include_query``: also hash the query encoder when it is untied (for caches of query-and-passage
        scores, e.g. teacher orderings); with a shared encoder the result is the same either way.
        """
        import hashlib

        h = hashlib.sha1()
        encoders = [self.passage_encoder]
        if include_query and self.query_encoder is not self.passage_encoder:
            encoders.append(self.query_encoder)
        for i, encoder in enumerate(encoders):
            prefix = "query." if i else ""
            for name, t in sorted(encoder.state_dict().items()):
                h.update((prefix + name).encode())
                flat = t.detach().float().flatten()
                h.update(flat[:: max(1, flat.numel() // 64)].cpu().numpy().tobytes())
        h.update(f"{self.pooling}{self.normalize}".encode())
        if self.query_prompt or self.passage_prompt:  # (no prompt: the key caches written before prompts existed)
            h.update(f"prompts:{self.query_prompt}\x00{self.passage_prompt}".encode())
        return h.hexdigest()[:16]
