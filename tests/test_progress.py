from kernelbook.harness import progress


def test_outside_a_notebook_kernel_it_only_yields():
    assert list(progress.track([1, 2, 3], "timing x", "variants")) == [1, 2, 3]


def test_in_a_kernel_one_line_is_updated_in_place_and_ends_with_a_summary(monkeypatch):
    import IPython.display

    shown = []

    class Handle:
        def update(self, obj):
            shown.append(obj.data)

    def display(obj, display_id=False):
        assert display_id is True  # a handle to update in place, not a new line per step
        shown.append(obj.data)
        return Handle()

    monkeypatch.setattr(progress, "_in_kernel", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    got = list(progress.track(["a", "b"], "timing 04_coalescing", "variants"))
    assert got == ["a", "b"]
    assert shown[0] == "timing 04_coalescing: 0/2 variants"
    assert shown[1].startswith("timing 04_coalescing: 0/2 variants (") and shown[1].endswith("now a")
    assert shown[2].endswith("now b")
    assert shown[-1].startswith("timing 04_coalescing: 2 variants in ") and shown[-1].endswith(" s")
