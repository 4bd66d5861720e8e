"""What a served answer may be: a deadline that is a number of seconds, finite values, and a failure in words.

The `Scorer` and both scoring endpoints (`lvfl.serving.api`, `lvfl.serving.http_endpoint`) check a request's deadline
here, and no answer carries a NaN: a passive party's non-finite contributions are not used, and a model's non-finite
output is no answer but a reason (the HTTP answer is strict JSON).
"""

from __future__ import annotations

import math

import grpc
import torch

from lvfl.federation.expectations import printable

__all__ = ["check_deadline", "failure", "finite", "not_finite"]


def failure(peer: str, err: grpc.RpcError, deadline: float) -> str:
    """Why `peer`'s call failed, in words, for a row's reason and the log."""
    code = err.code() if hasattr(err, "code") else None
    details = printable((err.details() if hasattr(err, "details") else "") or "")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{peer} did not answer within the deadline ({deadline:g} s)"
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{peer} is unreachable ({details.split(':')[0] if details else 'no connection'})"
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return details  # the passive party's own words: another export
    return f"{peer} refused the request ({code.name if code else '?'}: {details})"


def check_deadline(deadline: float) -> float:
    """A request's `deadline_s`, refused in one line unless it is a finite positive number of seconds."""
    number = isinstance(deadline, int | float) and not isinstance(deadline, bool)
    if not (number and math.isfinite(deadline) and deadline > 0):
        raise ValueError(f"deadline_s must be a finite positive number of seconds, got {deadline!r}")
    return float(deadline)


def not_finite(peer: str) -> str:
    """The reason for the rows of a passive party whose contributions hold NaN or inf (they are not used)."""
    return f"{peer} sent contributions that are not finite (NaN or inf)"


def finite(out: torch.Tensor, path: str, reason: str) -> tuple[torch.Tensor | None, str, str]:
    """A row's answer, or no answer with the reason where the model's output is not finite (never a NaN served)."""
    if bool(torch.isfinite(out).all()):
        return out, path, reason
    return None, "", f"the {'VFL model' if path == 'vfl' else path}'s output is not finite"
