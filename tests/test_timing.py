import pytest

from kernelbook import timing


def test_bandwidth_and_rate_units():
    assert timing.gbps(4e9, 1.0) == pytest.approx(4000.0)      # 4 GB in 1 ms = 4 TB/s
    assert timing.tflops(18.728e9, 1.0) == pytest.approx(18.728)
