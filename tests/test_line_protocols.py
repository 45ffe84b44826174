"""The line protocols between the platform and the trainer's helper processes (contracts/warm_protocol.py,
contracts/model_info.py) read back as written."""

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


def test_a_model_info_line_reads_back_as_written_and_a_batch_request_is_a_line_per_trial() -> None:
    """contracts/model_info.py: `trm.info`'s answer and the dry run's `--batch` requests."""
    from contracts.model_info import ModelInfo, read_request, request_lines

    info = ModelInfo({"hidden_size": 64}, 1000, 64, 5_000_000, 97, 64, 500, 16)
    assert ModelInfo.parse(info.line()) == info
    lines = request_lines([["arch.hidden_size=64", "note='a b'"], []]).splitlines()
    assert [read_request(line) for line in lines] == [["arch.hidden_size=64", "note='a b'"], []]
