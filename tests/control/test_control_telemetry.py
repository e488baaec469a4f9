"""Telemetry refuses values of the wrong type as input errors naming the field."""

import pytest

from nereus.control.telemetry import Telemetry
from nereus.errors import InputError

OK = {"step": 0, "response_len_mean": 500, "response_len_max": 700, "pool": (0, 1)}


@pytest.mark.parametrize("kwargs,field", [
    ({"latency_s": {"actor_train": "x"}}, "telemetry.latency_s.actor_train"),
    ({"latency_s": {"a": None}}, "telemetry.latency_s.a"),
    ({"latency_s": [1.0]}, "telemetry.latency_s"),
    ({"response_len_mean": "500"}, "telemetry.response_len_mean"),
    ({"response_len_max": "700"}, "telemetry.response_len_max"),
    ({"response_len_max": True}, "telemetry.response_len_max"),
    ({"peak_mem_bytes": {"a": "1"}}, "telemetry.peak_mem_bytes.a"),
    ({"peak_mem_bytes": {"a": True}}, "telemetry.peak_mem_bytes.a"),
    ({"op_time_s": {"a": {"gemm": "0.5"}}}, "telemetry.op_time_s.a.gemm"),
    ({"op_time_s": {"a": [0.5]}}, "telemetry.op_time_s.a"),
    ({"step": True}, "telemetry.step"),     # a bool is not step 1
    ({"step": 1.0}, "telemetry.step"),
])
def test_a_value_of_the_wrong_type_is_an_input_error_not_a_type_error(kwargs, field):
    """math.isfinite("x") raised TypeError ("must be real number"); step=True ran as 1."""
    with pytest.raises(InputError) as e:
        Telemetry(**{**OK, **kwargs})
    assert e.value.field == field


def test_numpy_numbers_are_numbers():
    import numpy as np

    t = Telemetry(np.int64(3), np.float64(500.0), np.int64(700), (0,),
                  {"a": np.float32(1.5)}, {"a": np.int64(10)}, {"a": {"gemm": np.float64(0.5)}})
    assert t.step == 3 and t.op_times("a")
