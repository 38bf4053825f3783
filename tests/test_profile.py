from kernelbook import profile


def test_summarise_groups_by_kernel_name():
    rows = profile.summarise("b", [("copy_kernel", 4.0), ("my_kernel", 3.0), ("copy_kernel", 6.0)])
    assert rows == [
        {"variant": "b", "kernel": "copy_kernel", "launches": 2, "total_us": 10.0, "mean_us": 5.0},
        {"variant": "b", "kernel": "my_kernel", "launches": 1, "total_us": 3.0, "mean_us": 3.0},
    ]
    assert profile.summarise("a", []) == []


def test_ncu_command_selects_the_nested_range():
    cmd = profile.ncu_command("00_method", "scale_ours", ["dram__bytes_read.sum"], ["python", "t.py"])
    assert cmd[:3] == ["ncu", "--clock-control", "none"]
    assert cmd[cmd.index("--nvtx-include") + 1] == "00_method/scale_ours/"
    assert "--nvtx" in cmd and cmd[-2:] == ["python", "t.py"]
    whole = profile.ncu_command("04_coalescing", "", ["x.sum"], ["python", "t.py"])
    assert whole[whole.index("--nvtx-include") + 1] == "04_coalescing/"


def test_parse_ncu_csv_skips_noise_and_thousands_separators():
    text = """==PROF== Connected to process 123
==PROF== Profiling "scale_vec4_kernel": 0%....50%....100% - 3 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python","h","scale_vec4_kernel","1","7","(256, 1, 1)","(1056, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","268,437,504"
"0","123","python","h","scale_vec4_kernel","1","7","(256, 1, 1)","(1056, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","268,435,456"
==PROF== Disconnected from process 123
"""
    rows = profile.parse_ncu_csv(text)
    assert rows == [
        {"kernel": "scale_vec4_kernel", "metric": "dram__bytes_read.sum", "unit": "byte", "value": 268437504.0,
         "id": 0},
        {"kernel": "scale_vec4_kernel", "metric": "dram__bytes_write.sum", "unit": "byte", "value": 268435456.0,
         "id": 0},
    ]


def test_kernel_us_sums_matching_kernels_of_one_variant():
    import pandas as pd

    t = pd.DataFrame({"variant": ["a", "a", "b"], "kernel": ["conv_fprop", "elementwise_add", "conv_fprop"],
                      "total_us": [10.0, 4.0, 7.0]})
    assert profile.kernel_us(t, "a", "FPROP") == 10.0
    assert profile.kernel_us(t, "a", ".") == 14.0
    assert profile.kernel_us(t, "c", ".") == 0.0


def test_ncu_in_one_process_gives_the_nth_kernel_to_the_nth_variant(monkeypatch):
    import subprocess

    import pytest

    head = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
    csv = head + '"3","k_b","inst","inst","20"\n"1","k_a","inst","inst","10"\n"3","k_b","cyc","cycle","7"\n'
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=csv, stderr="")

    monkeypatch.setattr(profile.shutil, "which", lambda _: "/usr/bin/ncu")
    monkeypatch.setattr(profile.subprocess, "run", fake_run)
    t = profile.ncu("pass", "04_coalescing", ["first", "second"], ["inst", "cyc"], one_process=True)
    assert len(calls) == 1 and calls[0][calls[0].index("--nvtx-include") + 1] == "04_coalescing/"
    got = {(r.variant, r.metric): r.value for r in t.itertuples()}
    assert got == {("first", "inst"): 10.0, ("second", "inst"): 20.0, ("second", "cyc"): 7.0}
    with pytest.raises(RuntimeError, match="expected one for each of the 3 variants"):
        profile.ncu("pass", "04_coalescing", ["a", "b", "c"], ["inst"], one_process=True)
