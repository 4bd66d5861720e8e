"""lvfl.checks: the shared option checks refuse bools, wrong types, non-finite numbers and out-of-range values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lvfl.checks import OptionError, check_int, check_positive, check_real


def test_check_int_accepts_python_and_numpy_integers_in_range():
    assert check_int(3, "epochs", 1) == 3
    assert type(check_int(np.int64(5), "epochs", 1, 10)) is int
    assert check_int(0, "workers") == 0  # no bound given, none applied


@pytest.mark.parametrize("value", [True, 2.0, "3", None, 0, 11])
def test_check_int_refuses_and_names_the_option_and_value(value):
    with pytest.raises(OptionError, match=rf"^Foo\(epochs=\.\.\.\) must be an int in \[1, 10\], got {value!r}$"):
        check_int(value, "Foo(epochs=...)", 1, 10)


def test_option_error_is_both_a_value_and_a_type_error():
    with pytest.raises(ValueError, match="n must be an int, got 'x'"):
        check_int("x", "n")
    with pytest.raises(TypeError, match="n must be an int >= 1, got 0"):
        check_int(0, "n", 1)


def test_check_real_bounds_open_and_closed():
    assert check_real(0.0, "lam", 0.0, 1.0) == 0.0
    assert check_real(np.float32(0.5), "lam", 0.0, 1.0) == 0.5
    with pytest.raises(OptionError, match=r"lam must be a finite number in \(0, 1\], got 0.0"):
        check_real(0.0, "lam", 0.0, 1.0, open_low=True)
    with pytest.raises(OptionError, match=r"in \[0, 1\), got 1"):
        check_real(1, "lam", 0.0, 1.0, open_high=True)
    with pytest.raises(OptionError, match=r"must be a finite number <= 2"):
        check_real(3.0, "x", high=2.0)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, False, "1.0"])
def test_check_real_refuses_non_finite_bools_and_strings(value):
    with pytest.raises(OptionError, match="x must be a finite number"):
        check_real(value, "x")


def test_check_positive():
    assert check_positive(1e-3, "lr") == 1e-3
    for bad in (0, -1.0, math.inf):
        with pytest.raises(OptionError, match=r"lr must be a finite number > 0"):
            check_positive(bad, "lr")


def test_why_explains_the_option_in_the_message():
    with pytest.raises(OptionError, match=r"^local_epochs must be an int >= 1 \(T_k, pre-training epochs\), got 0$"):
        check_int(0, "local_epochs", 1, why="T_k, pre-training epochs")
    with pytest.raises(OptionError, match=r"^lr must be a finite number > 0 \(the step size\), got -1$"):
        check_positive(-1, "lr", why="the step size")
