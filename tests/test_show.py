"""The table helper's headers: words stay whole; long identifiers may break after _ . / only."""

from __future__ import annotations

from kernelbook import show


def test_short_headers_and_words_stay_whole():
    assert show._header("issue %") == "issue %"
    assert show._header("instr. / TC instr.") == "instr. / TC instr."
    assert "<wbr>" not in show._header("instructions per tensor-core instruction")


def test_long_identifiers_break_after_separators_and_stay_escaped():
    assert show._header("spill_store_bytes") == "spill_<wbr>store_<wbr>bytes"
    metric = show._header("smsp__issue_active.avg.pct_of_peak_sustained_active")
    assert metric.replace("<wbr>", "") == "smsp__issue_active.avg.pct_of_peak_sustained_active"
    assert "active.<wbr>avg" in metric
    assert show._header("a<b & ccc_ddd_eee_fff") == "a&lt;b &amp; ccc_<wbr>ddd_<wbr>eee_<wbr>fff"


def test_table_html_uses_the_headers():
    html = show.table_html({"r": {"spill_store_bytes": 4, "issue %": 39.4}})
    assert "<th>spill_<wbr>store_<wbr>bytes</th>" in html and "<th>issue %</th>" in html


def test_long_identifiers_in_table_cells_may_break_after_an_underscore():
    from kernelbook.harness.show import table_html

    out = table_html({"compile_eval_max_autotune": {"what": "cudnn_folded_cl_tf32 alone", "ms": 0.5}})
    assert "compile_<wbr>eval_<wbr>max_<wbr>autotune" in out and "cudnn_<wbr>folded_<wbr>cl_<wbr>tf32 alone" in out
    assert "<wbr>" not in table_html({"short_name": {"what": "a_b"}})


def test_row_labels_are_shown_under_the_header_they_are_given():
    from kernelbook.harness.show import table_html

    out = table_html({"flat": {"ms": 0.5}, "tile": {"ms": 0.6}}, index="mapping")
    assert out.startswith('<div class="kb-table-wrap"><table class="kb-table"><thead><tr><th>mapping</th><th>ms</th>')
    assert '<th class="kb-row">flat</th>' in out
