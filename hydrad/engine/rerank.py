"""A reranker's prompts: the tokens a (query, document) pair is scored from, made as llama-server's
``format_prompt_rerank`` makes them, so a document scores what it scores there.

- A GGUF with a rerank template (``tokenizer.chat_template.rerank``, a Qwen3 reranker's) has ``{query}``
  and ``{document}`` replaced in it, and the text tokenized with special tokens parsed and none added.
- Any other (BERT-style rerankers): BOS (when the vocabulary adds one), the query's tokens, EOS (when
  it adds one; SEP where it has no EOS), SEP (when it adds one), the document's tokens, EOS again; the
  texts tokenized without special tokens.

:class:`PromptFormat` is read from the model once, when its embedding context is built (engine thread
or loader); :meth:`PromptFormat.tokens` runs on a worker thread (the vocabulary is read-only, as for
``/tokenize``), the query tokenized once for all the documents where the form allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydrad.engine import llama


@dataclass(frozen=True)
class PromptFormat:
    template: str | None  # the rerank template, {query} and {document} in it; None: the token form
    bos: int | None  # added before the query (the vocabulary adds BOS)
    eos: int | None  # after the query and after the document (it adds EOS)
    sep: int | None  # between them (it adds SEP)

    @classmethod
    def of(cls, model: Any) -> PromptFormat:
        C = llama.lib()
        raw = C.llama_model_chat_template(model.ptr, b"rerank")
        template = raw.decode("utf-8", "replace") if raw else None
        vocab = model.vocab
        eos = C.llama_vocab_eos(vocab)
        if eos < 0:
            eos = C.llama_vocab_sep(vocab)
        return cls(template,
                   C.llama_vocab_bos(vocab) if C.llama_vocab_get_add_bos(vocab) else None,
                   eos if C.llama_vocab_get_add_eos(vocab) and eos >= 0 else None,
                   C.llama_vocab_sep(vocab) if C.llama_vocab_get_add_sep(vocab) else None)

    def tokens(self, model: Any, query: str, documents: list[str]) -> list[list[int]]:
        """Each document's prompt with the query, as token ids (a worker thread: ``model.tokenize``
        may raise ``ModelFreed`` when the model is replaced meanwhile)."""
        if self.template is not None:
            return [model.tokenize(self.template.replace("{query}", query).replace("{document}", doc), False, True)
                    for doc in documents]
        head = ([self.bos] if self.bos is not None else []) + model.tokenize(query, False, False)
        head += [t for t in (self.eos, self.sep) if t is not None]
        tail = [self.eos] if self.eos is not None else []
        return [head + model.tokenize(doc, False, False) + tail for doc in documents]
