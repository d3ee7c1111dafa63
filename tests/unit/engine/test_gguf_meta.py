"""The GGUF header reader on the real default models: block counts, the vocabulary digest (the same for
sibling quants, cached per file), and clear errors for a header cut short inside the token list."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from hydrad.engine import gguf_meta


def test_block_counts_of_the_default_models(smollm_path: Path, gemma_path: Path) -> None:
    assert gguf_meta.block_count(smollm_path) == 30
    assert gguf_meta.block_count(gemma_path) == 18


def test_vocab_digest_tells_vocabularies_apart_and_sibling_quants_share_it(smollm_path: Path, gemma_path: Path,
                                                                        smollm_q8: Path) -> None:
    a, b = gguf_meta.vocab_digest(smollm_path), gguf_meta.vocab_digest(gemma_path)
    assert len(a) == len(b) == 32 and a != b
    assert gguf_meta.vocab_digest(smollm_q8) == a  # Q8_0 made from the Q4_1 file: other weights, one vocabulary


def test_vocab_digest_is_read_again_when_the_file_changes(smollm_path: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(smollm_path.read_bytes())
    first = gguf_meta.vocab_digest(copy)
    data = bytearray(copy.read_bytes())
    at = data.find(b"<|im_start|>")  # a token's text inside the token list
    assert at > 0
    data[at + 2] = ord("X")
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(1, 1))  # another modification time: the cached digest no longer answers
    assert gguf_meta.vocab_digest(copy) != first


@pytest.mark.parametrize("keep", [0.25, 0.5, 0.99])
def test_a_header_cut_inside_the_token_list_is_a_clear_error(smollm_path: Path, tmp_path: Path, keep: float) -> None:
    with smollm_path.open("rb") as f:
        head = f.read(4 << 20)
    start = head.find(b"tokenizer.ggml.tokens")
    end = head.find(b"tokenizer.ggml.token_type")
    assert 0 < start < end
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(head[:start + int((end - start) * keep)])
    with pytest.raises(gguf_meta.GgufError, match="truncated header"):
        gguf_meta.vocab_digest(cut)
    with pytest.raises(gguf_meta.GgufError, match="truncated header"):
        gguf_meta.block_count(cut)


def test_an_absurd_string_length_in_the_token_list_is_refused(smollm_path: Path, tmp_path: Path) -> None:
    with smollm_path.open("rb") as f:
        head = bytearray(f.read(4 << 20))
    key = head.find(b"tokenizer.ggml.tokens")
    first = key + len(b"tokenizer.ggml.tokens") + 4 + 4 + 8  # value type, element type, count: then the first string
    struct.pack_into("<Q", head, first, 1 << 40)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(head))
    with pytest.raises(gguf_meta.GgufError, match="string of"):
        gguf_meta.vocab_digest(bad)


def test_tensor_names_of_the_default_models(smollm_path: Path, gemma_path: Path) -> None:
    smollm = gguf_meta.tensor_names(smollm_path)
    assert len(smollm) == 272 and "token_embd.weight" in smollm and "blk.29.ffn_up.weight" in smollm
    assert len(gguf_meta.tensor_names(gemma_path)) == 236


def _gguf(path: Path, kv: list[tuple[str, int]], tensors: list[str]) -> Path:
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for key, value in kv:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IH", 2, value)  # a u16 value
    for name in tensors:
        out += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<IQQIQ", 2, 4, 4, 0, 0)
    path.write_bytes(bytes(out))
    return path


def test_a_part_of_a_split_model_lists_no_tensors(tmp_path: Path) -> None:
    whole = _gguf(tmp_path / "whole.gguf", [("general.alignment", 32)], ["t.weight", "u.weight"])
    assert gguf_meta.tensor_names(whole) == {"t.weight", "u.weight"}
    part = _gguf(tmp_path / "part.gguf", [("split.count", 2)], ["t.weight"])
    assert gguf_meta.tensor_names(part) == frozenset()
