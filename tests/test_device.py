import pytest

from kernelbook.harness.device import describe, slug


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H200", "h200"),
    ("Tesla T4", "tesla-t4"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"),
    ("NVIDIA L4", "l4"),
])
def test_slug(name, expected):
    assert slug(name) == expected


def test_describe_says_live_or_recorded(monkeypatch):
    from kernelbook import device

    monkeypatch.setattr(device, "gpu", lambda: None)
    assert "recorded results" in describe()
    fake = {"gpu": "NVIDIA H200", "arch": "90", "sm_count": 132, "memory_gib": 139.8, "driver": "580",
            "cuda": "13.0", "torch": "2.11.0"}
    monkeypatch.setattr(device, "gpu", lambda: fake)
    assert describe().startswith("Live on NVIDIA H200 (sm_90, 132 SMs")


def test_resident_blocks_matches_the_occupancy_limits():
    from kernelbook.harness.device import resident_blocks

    # conv2d_folded v1 on the H200: 256 threads at 127 registers; Nsight Compute reported 2 blocks by registers
    assert resident_blocks("9.0", 256, 127, 35328) == 2
    assert resident_blocks("9.0", 256, 80, 31104) == 3                 # 80 registers: 3 blocks, 24 warps
    assert resident_blocks("9.0", 128, 16, 100 * 1024) == 2            # shared memory limits: 2 × (100 + 1) KiB
    assert resident_blocks("9.0", 1024, 16, 0) == 2                    # threads limit: 2048 per SM
    assert resident_blocks("7.5", 1024, 16, 0) == 1                    # a T4 SM holds 1024 threads
