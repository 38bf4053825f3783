import pytest

from kernelbook.device import describe, slug


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
