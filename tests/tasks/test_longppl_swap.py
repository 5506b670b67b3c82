"""The swap test of `ropebench bench longppl-bias` (benchmarks/longppl_bias.py): values worked out by hand
from the paper's rule, and swapping the two settings swaps the result; the default selection (the rule on
the two settings' mean long loss, results/longppl.py) beside the two self-selections, symmetric exactly."""

import math

import pytest
import torch
from ropebench.benchmarks.longppl_bias import swap_test, t_interval

NAN = float("nan")
# alpha 1, beta -2: key where short - long > 1 and long < 2 (position 0 has no short window)
SHORT = torch.tensor([NAN, 3.0, 3.0, 3.0, 3.0])
LONG_A = torch.tensor([0.0, 0.5, 1.5, 2.5, 0.2])  # key: 1, 2, 4 (3: 2.5 is not below 2)
LONG_B = torch.tensor([0.0, 1.0, 2.5, 1.0, 0.2])  # key: 1, 3, 4 (2: 2.5 is not below 2)


def test_swap_test_by_hand():
    got = swap_test(SHORT, LONG_A, SHORT, LONG_B, 1.0, -2.0)
    d_a = (1.0 + 2.5 + 0.2) / 3 - (0.5 + 1.5 + 0.2) / 3  # b minus a over a's key tokens: 0.5
    d_b = (1.0 + 1.0 + 0.2) / 3 - (0.5 + 2.5 + 0.2) / 3  # over b's: -1/3
    assert (got["key_tokens_a"], got["key_tokens_b"], got["key_tokens_both"]) == (3, 3, 2)
    assert got["d_a"] == pytest.approx(d_a, abs=1e-6) and got["d_b"] == pytest.approx(d_b, abs=1e-6)
    assert got["symmetric"] == pytest.approx(1 / 12, abs=1e-6)
    assert got["bias_a"] == pytest.approx(5 / 12, abs=1e-6)  # a's own selection favours a
    # mean long loss [0, .75, 2, 1.75, .2]: key 1, 3, 4 (2: short - mean is 1 exactly, and 2 is not below 2)
    assert got["key_tokens_mean"] == 3
    assert got["d_mean"] == pytest.approx((1.0 + 1.0 + 0.2) / 3 - (0.5 + 2.5 + 0.2) / 3, abs=1e-6)


def test_swapping_the_settings_swaps_the_result():
    ab = swap_test(SHORT, LONG_A, SHORT, LONG_B, 1.0, -2.0)
    ba = swap_test(SHORT, LONG_B, SHORT, LONG_A, 1.0, -2.0)
    assert (ba["key_tokens_a"], ba["key_tokens_b"]) == (ab["key_tokens_b"], ab["key_tokens_a"])
    assert ba["d_a"] == pytest.approx(-ab["d_b"]) and ba["d_b"] == pytest.approx(-ab["d_a"])
    assert ba["symmetric"] == pytest.approx(-ab["symmetric"])  # the symmetric estimate changes sign only
    assert ba["bias_a"] == pytest.approx(ab["bias_a"])  # the evaluator's own favour: the same either way
    assert ba["key_tokens_mean"] == ab["key_tokens_mean"] and ba["d_mean"] == -ab["d_mean"]  # exactly


def test_no_key_tokens_gives_no_ratio():
    got = swap_test(SHORT, LONG_A, SHORT, torch.full((5,), 2.5), 1.0, -2.0)
    assert got["key_tokens_b"] == 0 and got["d_b"] is None and got["bias_a"] is None


def test_t_interval_by_hand():
    iv = t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, t(2) = 4.302652729911275
    half = 4.302652729911275 / math.sqrt(3)
    assert (iv["n"], iv["mean"]) == (3, 2.0)
    assert (iv["low"], iv["high"]) == pytest.approx((2 - half, 2 + half), rel=1e-6)
