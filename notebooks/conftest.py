"""nbval on several workers (`make test-nbval`: `pytest -n 2 --dist loadfile --nbval notebooks`): each notebook
runs on one worker, its cells in order, and the longest notebooks start first so that the workers finish together
(the browser test, tests/browser, orders its notebooks by the same table).
SECONDS is each notebook's time under nbval on a 2-core machine (benchmarks/RESULTS.md, "The test suite and CI"): a stale
figure only changes the order, never a result."""

SECONDS = {"08_cluster": 160, "06_serving": 105, "09_finetune": 102, "03_int4_quantization": 79, "07_day0": 69,
           "02_unified_memory": 39, "04_parallelism": 30, "05_kv_cache": 21, "00_setup": 20, "01_memory_wall": 11}


def pytest_collection_modifyitems(items):
    """Longest notebook first (a notebook missing from SECONDS last); a notebook's cells keep their order."""
    items.sort(key=lambda item: -SECONDS.get(item.path.stem, 0))
