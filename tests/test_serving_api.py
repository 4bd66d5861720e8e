"""The scoring API's input checks that need no fitted run: a request's deadline, and answers that are strict JSON."""

from __future__ import annotations

import math

import grpc
import pytest
import torch

from lvfl.serving import serving_pb2 as pb
from lvfl.serving.answer_checks import check_deadline, finite
from lvfl.serving.api import ScoringService
from lvfl.serving.http_endpoint import parse_json_request


@pytest.mark.parametrize("deadline", [math.inf, -math.inf, math.nan, -1, 0, -0.5, True, "1", None])
def test_a_deadline_that_is_not_a_finite_positive_number_is_refused_naming_the_field(deadline) -> None:
    with pytest.raises(ValueError, match=r"^deadline_s must be a finite positive number of seconds, got "):
        check_deadline(deadline)


@pytest.mark.parametrize("deadline", [math.inf, math.nan, -1, 0, False])
def test_the_http_request_names_a_bad_deadline(deadline) -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        parse_json_request({"ids": ["a"], "deadline_s": deadline}, "id")
    assert parse_json_request({"ids": ["a"], "deadline_s": 0.25}, "id")[3] == 0.25


class _Refused(Exception):
    pass


class _Context:
    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Refused(code, details)


@pytest.mark.parametrize("deadline", [math.inf, math.nan, -1.0])
def test_the_grpc_request_names_a_bad_deadline_before_anything_is_scored(deadline) -> None:
    class NoScorer:
        def score(self, *args: object) -> None:
            raise AssertionError("not reached")

    service = ScoringService.__new__(ScoringService)  # its handler alone: no server, no port
    service.scorer = NoScorer()
    with pytest.raises(_Refused) as refused:
        service._score(pb.ScoreRequest(ids=["a"], deadline_s=deadline), _Context())
    code, details = refused.value.args
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("deadline_s must be a finite positive number of seconds")


def test_a_non_finite_output_is_no_answer_but_a_reason() -> None:
    out = torch.tensor([0.25, 0.75])
    assert finite(out, "vfl", "") == (out, "vfl", "")
    assert finite(torch.tensor([math.nan, 1.0]), "vfl", "") == (None, "", "the VFL model's output is not finite")
    assert finite(torch.tensor([math.inf]), "student", "x") == (None, "", "the student's output is not finite")


def test_metrics_beyond_this_machine_are_allowed_but_never_silently() -> None:
    from lvfl.serving.metrics import metrics_reach

    assert metrics_reach("127.0.0.1:9100") == ""
    assert "readable from other hosts: counts only" in metrics_reach("0.0.0.0:9100")
    with pytest.raises(ValueError, match="^--metrics 'nonsense' is not 'host:port'"):
        metrics_reach("nonsense")


def test_lvfl_score_ends_with_a_line_per_fault_that_kept_rows_from_the_vfl_model() -> None:
    from lvfl.commands.score import fault_lines
    from lvfl.prediction_rows import BY_THE_STUDENT, NO_STUDENT, NO_STUDENT_IN_PLACE

    down = "party1 is unreachable (failed to connect)"
    rows = [{"path": "student", "reason": down + BY_THE_STUDENT}] * 3 + [
        {"path": "vfl", "reason": ""},
        {"path": "student", "reason": ""},  # an ID the passive party does not hold: no fault
        {"path": "", "reason": NO_STUDENT},
        {"path": "", "reason": "party2 did not answer within the deadline (1 s)" + NO_STUDENT_IN_PLACE},
    ]
    assert fault_lines(rows) == [
        "party1 is unreachable (failed to connect): 3 of 7 rows answered by the student",
        "party2 did not answer within the deadline (1 s): 1 of 7 rows unanswered (the export has no student)",
    ]
    assert fault_lines(rows[3:6]) == []


def test_a_file_of_ids_is_refused_in_one_line_when_it_is_not_text_too_long_or_too_large(tmp_path, monkeypatch) -> None:
    """`lvfl score --ids` and `lvfl predict`'s ids: bytes that are not UTF-8 once ended in a traceback."""
    from lvfl.commands import predict
    from lvfl.commands.predict import read_ids

    good = tmp_path / "ids.csv"
    good.write_bytes("\ufeffcustomer_id\r\nCUST-1\r\n\r\nCUST-2\r\n".encode())
    assert read_ids(str(good)) == ["CUST-1", "CUST-2"]
    binary = tmp_path / "ids.txt"
    binary.write_bytes(b"CUST-1\n\xff\xfe\x00\n")
    with pytest.raises(ValueError, match=r"^--ids: .*ids.txt is not UTF-8 text \(byte 7: invalid start byte\)$"):
        read_ids(str(binary))
    long = tmp_path / "long.txt"
    long.write_text("CUST-1\n" + "x" * 2000 + "\n")
    with pytest.raises(ValueError, match=r"long.txt, line 2: an ID of 2,000 characters; at most 1024$"):
        read_ids(str(long))
    monkeypatch.setattr(predict, "MAX_IDS_FILE_BYTES", 10)
    with pytest.raises(ValueError, match=r"ids.csv is \d+ bytes; at most 10 are read: split it$"):
        read_ids(str(good))
