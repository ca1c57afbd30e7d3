import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

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


def test_pooled_sqnr_sums_noise_and_signal_over_the_matrices():
    g = torch.Generator().manual_seed(3)
    ws = [torch.randn(4, 64, generator=g), 3 * torch.randn(8, 32, generator=g)]
    noise = sum(float((quantize(w, 4, "sym", 32).dequantize().double() - w.double()).pow(2).sum()) for w in ws)
    signal = sum(float(w.double().pow(2).sum()) for w in ws)
    assert qw.pooled_sqnr_db(ws, 4, "sym", 32) == pytest.approx(10 * math.log10(signal / noise))
    assert qw.pooled_sqnr_db([torch.zeros(2, 32)], 4, "asym", 32) == math.inf  # exact round trip
    with pytest.raises(TypeError, match="ws must be a non-empty list of 2-D weight tensors"):
        qw.pooled_sqnr_db(ws[0], 4, "sym", 32)
    with pytest.raises(ValueError, match="each of ws must be a non-empty 2-D tensor"):
        qw.pooled_sqnr_db([torch.zeros(3)], 4, "sym", 32)


def test_bad_input_is_refused_before_any_figure():
    w = torch.randn(4, 64)
    with pytest.raises(ValueError, match=r"group must be an int in \[0, 1\], got 2"):
        qw.grid_levels(w, 4, "asym", 32, group=2)
    with pytest.raises(ValueError, match=r"row must be an int in \[0, 3\], got 4"):
        qw.group_values(w, "channel", row=4)
    assert qw.group_values(w, "tensor", row=7).numel() == 256  # one group for the whole matrix: any row
    with pytest.raises(ValueError, match="group_size must be a divisor of w's input dimension 64, got 48"):
        qw.group_values(w, 48)
    with pytest.raises(TypeError, match="bits must be one of"):
        qw.error_table(w, bits_list=(4.0,))
    with pytest.raises(TypeError, match="static must be True or False"):
        qw.explorer(w, static="yes")
