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


def test_describe_always_says_something():
    assert describe()
