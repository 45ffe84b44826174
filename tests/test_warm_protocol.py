"""contracts/warm_protocol.py: the lines the warm launcher and the warm worker exchange read back as written."""

from __future__ import annotations

import pytest

from contracts.warm_protocol import Exited, JobRequest, Ready, Started, decode, encode


def test_every_answer_reads_back_as_written() -> None:
    for answer in (Ready(11), Started(12), Exited(12, -15)):
        assert decode(encode(answer)) == answer
        assert decode(encode(answer).encode()) == answer  # as the launcher reads the worker's stdout: bytes


def test_a_request_reads_back_as_written_and_is_one_line() -> None:
    request = JobRequest(["train.steps=3", "note='a b'"], "/tmp/w", {"A": "1\n2"}, "/tmp/w/log")
    line = request.line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # a newline inside a value is escaped
    assert JobRequest.parse(line) == request


def test_an_answer_of_no_known_kind_is_refused() -> None:
    with pytest.raises(ValueError, match=r"warm worker answered \{'gone': 0\}: not one of ready, started, exited"):
        decode('{"gone": 0}')
