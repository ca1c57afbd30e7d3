import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from labkit.quant import explore as qw  # noqa: E402
from labkit.quant import quantize  # noqa: E402


def test_grid_levels_are_what_dequantize_can_produce():
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) + 0.3
    for scheme in ("sym", "asym"):
        levels = qw.grid_levels(w, 3, scheme, 32, row=1, group=1)
        assert levels.numel() == 8 and (levels.diff() > 0).all()
        got = quantize(w, 3, scheme, 32).dequantize()[1, 32:64]
        assert all(bool((levels - v).abs().min() < 1e-6) for v in got)
    assert qw.group_values(w, "channel", row=2).tolist() == w[2].tolist()
    assert qw.group_values(w, "tensor").numel() == 256


def test_error_table_skips_groups_that_do_not_divide_and_orders_by_bits():
    w = torch.randn(8, 96, generator=torch.Generator().manual_seed(1))
    rows = qw.error_table(w, bits_list=(4, 8))
    assert {r["group_size"] for r in rows} == {32, "channel", "tensor"}
    by = {(r["bits"], r["scheme"], r["group_size"]): r["sqnr_db"] for r in rows}
    assert all(by[(8, s, g)] > by[(4, s, g)] + 20 for s in ("sym", "asym") for g in (32, "channel", "tensor"))


def test_explorer_widget_and_static_fallback(capsys):
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    assert qw.explorer(w, static=True) is None
    assert "INT4 asym group 32" in capsys.readouterr().out
    pytest.importorskip("ipywidgets")
    widget = qw.explorer(w)
    assert [c.description for c in widget.children[:3]] == ["bits", "scheme", "group_size"]
