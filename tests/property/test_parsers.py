"""Bounded runs of scripts/fuzz_parsers.py per parser, and regression inputs for what it found.

Each target must return a value or raise only its documented error on mutated and random inputs;
the long runs (``--long``, a million inputs per target) are recorded in docs/reliability.md."""

from __future__ import annotations

import pytest

from tests.support.scripts import load_script

fz = load_script("fuzz_parsers", "fuzz_parsers")

@pytest.mark.parametrize("target", list(fz.TARGETS))
def test_bounded_fuzz_run_has_no_violations(target: str) -> None:
    rep = fz.fuzz(fz.TARGETS[target], 3000, seed=20261201, bound_s=0.5, max_violations=1000, log=lambda s: None)
    assert rep.inputs == 3000
    assert not rep.violations, rep.violations[:3]


@pytest.mark.parametrize("target", list(fz.TARGETS))
def test_seed_inputs_are_accepted_or_refused_cleanly(target: str) -> None:
    t = fz.TARGETS[target]
    for data in t.seeds:
        out, bad, _ = fz.run_one(t, data, 1.0)
        assert bad is None, (data[:64], bad)


def test_a_stream_split_anywhere_decodes_the_same() -> None:
    data = b"".join(fz.frame_seeds()[:7])
    for cut in range(len(data) + 1):
        assert fz._decode_stream(data, fz.P.REQUEST_CODES, [data[:cut], data[cut:]]) == \
            fz._decode_stream(data, fz.P.REQUEST_CODES, [data])


def test_oversized_declared_lengths_are_refused_from_the_header() -> None:
    for code in (fz.P.Op.INFO, fz.P.Op.STATE_DATA):
        head = fz.P.HEADER.pack(code, fz.P.limit_for(code) + 1)
        assert fz._decode_stream(head, fz.P.REQUEST_CODES, [head])[1] == "ProtocolError:TOO_LARGE"
        head = fz.P.HEADER.pack(code, 2**64 - 1)
        assert fz._decode_stream(head, fz.P.REQUEST_CODES, [head])[1] == "ProtocolError:TOO_LARGE"


# ---- regressions for the bugs the fuzzer found (minimal inputs) ------------------------------------------------

SURROGATE_FRAME = fz.P.encode(fz.P.Status.OK, b'{"a":"\\ud800"}')


def test_a_state_stream_whose_meta_says_bytes_true_is_refused() -> None:
    """Found by this fuzzer (2026-12-02, seed 2): JSON ``true`` passed the ``meta.bytes`` check (a bool is
    an int in Python) and the receiver then failed with a TypeError; the engine's own check had the
    same hole. Now a refusal, like any other size that is not a positive integer."""
    P = fz.P
    data = (P.encode_json(P.Status.STATE_META, {"bytes": True, "n_tokens": 3, "req": [1, 2, 3]})
            + P.HEADER.pack(P.Status.STATE_DATA, 1) + b"x")
    out, bad, _ = fz.run_one(fz.TARGETS["kvstream"], data, 1.0)
    assert bad is None, bad
    assert out == "refused(meta.bytes)", out


def test_frame_json_refuses_lone_surrogates() -> None:
    """Found by this fuzzer: Frame.json() took a lone UTF-16 surrogate, which encode_json/error_frame
    then could not encode (UnicodeEncodeError). Now a BAD_REQUEST ProtocolError."""
    out, bad, _ = fz.run_one(fz.TARGETS["frame"], SURROGATE_FRAME, 1.0)
    assert bad is None, bad


NON_FINITE_BUS = [
    b'hydra-bus/2\n\x1eDONE\n\x1e{"req":"r1","finish_reason":"stop","usage":{"prompt_ms":Infinity}}',
    b'hydra-bus/2\n\x1eLOADED\n\x1e{"req":"r1","load_id":1,"phase":"done","seconds":1e999}',
    b'hydra-bus/2\n\x1eHEARTBEAT\n\x1e{"status":{"decode_tps":Infinity}}',
    b'hydra-bus/2\n\x1eCONFIGURE\n\x1e{"req":"r1","payload":{"model":1e999}}',
    b'hydra-bus/2\n\x1eCONFIGURED\n\x1e{"req":"r1","ok":true,"result":{"a":NaN}}',  # found 2026-12-02, seed 2
]


@pytest.mark.parametrize("data", NON_FINITE_BUS, ids=["done-prompt_ms", "loaded-seconds", "heartbeat-decode_tps",
                                                      "configure-payload", "configured-result"])
def test_bus_decode_refuses_non_finite_numbers(data: bytes) -> None:
    """Found by this fuzzer: decode() took Infinity/NaN/1e999 in float and free-form fields; encode()
    then wrote null (or Infinity) and the message no longer decoded. Now a BusDecodeError."""
    out, bad, _ = fz.run_one(fz.TARGETS["bus"], data, 1.0)
    assert bad is None, bad
