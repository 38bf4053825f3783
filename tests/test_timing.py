import pytest

from kernelbook import timing


def test_bandwidth_and_rate_units():
    assert timing.gbps(4e9, 1.0) == pytest.approx(4000.0)      # 4 GB in 1 ms = 4 TB/s
    assert timing.tflops(18.728e9, 1.0) == pytest.approx(18.728)


def test_scale_excerpts_exist_and_fit_a_screen():
    from kernelbook import show

    for name in ("vector-loop", "alignment-fallback"):
        first, lines = show.excerpt_lines("scale.cu", name)
        assert first > 1 and 5 <= len(lines) <= 40, (name, len(lines))
        assert all(len(line) <= 84 for line in lines), name  # + line numbers: the 88-column page


@pytest.mark.gpu
def test_scale_config_reports_the_kernels_tiling():
    import kernelbook as kb
    from kernelbook.harness.paths import KERNELS

    cfg = kb.build.load("scale").config()
    src = (KERNELS / "scale.cu").read_text()
    assert f"kThreads = {cfg['threads']};" in src and f"kUnroll = {cfg['unroll']};" in src
    assert cfg["vec_bytes"] == 16  # sizeof(float4)
