"""The laptop fact-check's rows and QLoRA's 65B-on-48-GB claim, against the calculator."""

from labkit.finetune.factcheck import LLAMA_65B, laptop_rows


def test_fact_check_rows_and_qlora_65b():
    rows = laptop_rows(("llama-2-7b",), tokens=1024)
    assert [r["method"] for r in rows] == ["full", "lora", "qlora"] and rows[2]["GB"] < rows[0]["GB"]
    assert abs(LLAMA_65B.n_params - 65.2e9) / 65.2e9 < 0.01
