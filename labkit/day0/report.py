"""The Day-0 report (notebook 07, section 7): one table that says how the adaptation went and where each
earlier lab's lesson was used. The notebook fills a `Day0Report` from its own measurements; `day0_report`
renders it, rounded to 3 significant digits (stable across runs for the planned numbers; the measured ones
are marked as measurements in the notebook). Each line's "against" is what "this run" is compared with, and
"against what" names it, since that differs from line to line:

    line                  this run   against     against what                    from
    layout                TP=2       DP=2 ...    planner's first choice   lab 04 planner, then our choice
    memory rank 0 (MB)    measured   planned     planned                  lab 01 footprint, lab 02 arena
    load, threaded (s)    threaded   serial      serial (1 thread)        lab 04 TP slices, lab 03 precision
    TTFT text (ms)        ...                                             lab 06 serving
    accuracy colour (%)   served     FP32 run    FP32 reference           lab 03 accuracy retention
    ...

Units: bytes in the report, MB (1e6 bytes) in the table; seconds in the report, ms or s in the table (the
unit is in each line's name); accuracy as a fraction in [0, 1], a percentage in the table.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from .._checks import check_bool, check_fraction, check_positive, check_positive_int, check_type, fail
from ..course import display, evidence

LABS: dict[str, str] = {
    "operators": "lab 00 TinyLM runtime + lab 07 operator table",
    "layout": "lab 04 planner, then our choice",
    "memory": "lab 01 footprint, lab 02 arena (allocator)",
    "load": "lab 04 TP slices, lab 03 precision",
    "ttft_text": "lab 06 serving (continuous batching)",
    "ttft_image": "lab 05 prefix cache + encoder cache",
    "accuracy": "lab 03 accuracy vs FP32 reference",
}
"""Which earlier lab each line of the report comes from (the rows' "from" column)."""


@dataclass(frozen=True)
class Day0Report:
    """What the notebook measured. operators: the operators the runtime covers for this model (names);
    planned_bytes / measured_bytes: memory per TP rank (bytes; rank r at index r), planned by the footprint
    and measured after loading; load_serial_s / load_threaded_s: seconds to load every rank's weights with one
    reader thread and with several; ttft_text_s / ttft_image_s: time to first token (seconds) of a text and of
    an image request through the service (ttft_image_repeat_s: the same image again, encoder cache warm, or
    None); accuracy / reference_accuracy: exact-match fraction per question kind and text task, served and
    in the FP32 single-process reference run (the same keys); layout and precision in words ("TP=2",
    "bf16"); planned_layout: the planner's first choice (str(Plan)), or None. load_reliable /
    ttft_image_repeat_reliable: whether the repeats behind the threaded-vs-serial load and the repeated-vs-new
    image separate by the course's rule (labkit.course.evidence); when not, the
    line that compares them says "unreliable on this run" instead of a figure. Validates itself: a missing or
    bad field is refused by name."""
    operators: list[str]
    planned_bytes: list[int]
    measured_bytes: list[int]
    load_serial_s: float
    load_threaded_s: float
    ttft_text_s: float
    ttft_image_s: float
    accuracy: dict[str, float]
    reference_accuracy: dict[str, float]
    layout: str = "TP=1"
    planned_layout: str | None = None
    precision: str = "bf16"
    model: str = "TinyVLM"
    ttft_image_repeat_s: float | None = None
    load_reliable: bool = True
    ttft_image_repeat_reliable: bool = True
    labs: dict[str, str] = field(default_factory=lambda: dict(LABS))

    def __post_init__(self):
        ops = check_type("operators", self.operators, (list, tuple), "a list of operator names")
        if not ops or not all(isinstance(o, str) and o for o in ops):
            fail("operators", self.operators, "a non-empty list of operator names (str)")
        for name in ("planned_bytes", "measured_bytes"):
            values = check_type(name, getattr(self, name), (list, tuple), "a list of bytes per rank")
            if not values:
                fail(name, values, "a list of bytes per rank (one entry per rank)")
            for r, v in enumerate(values):
                check_positive_int(f"{name}[{r}]", v, unit="bytes")
        if len(self.planned_bytes) != len(self.measured_bytes):
            fail("measured_bytes", self.measured_bytes, f"one entry per rank, as planned_bytes "
                 f"({len(self.planned_bytes)} ranks)")
        for name in ("load_serial_s", "load_threaded_s", "ttft_text_s", "ttft_image_s"):
            check_positive(name, getattr(self, name), unit="seconds")
        for name in ("load_reliable", "ttft_image_repeat_reliable"):
            check_bool(name, getattr(self, name))
        if self.ttft_image_repeat_s is not None:
            check_positive("ttft_image_repeat_s", self.ttft_image_repeat_s, unit="seconds")
        for name in ("accuracy", "reference_accuracy"):
            acc = check_type(name, getattr(self, name), dict, "a dict of task -> exact-match fraction")
            if not acc:
                fail(name, acc, "a non-empty dict of task -> exact-match fraction")
            for k, v in acc.items():
                check_type(f"{name} key", k, str)
                check_fraction(f"{name}[{k!r}]", v, allow_zero=True)
        if set(self.accuracy) != set(self.reference_accuracy):
            fail("reference_accuracy", sorted(self.reference_accuracy), f"the same tasks as accuracy "
                 f"({sorted(self.accuracy)})")
        if self.planned_layout is not None and (not isinstance(self.planned_layout, str) or not self.planned_layout):
            fail("planned_layout", self.planned_layout, "None or a non-empty str (the planner's first layout)",
                 TypeError)
        for name in ("layout", "precision", "model"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                fail(name, getattr(self, name), "a non-empty str", TypeError)
        labs = check_type("labs", self.labs, dict, "a dict of line -> earlier lab")
        missing = [k for k in LABS if not isinstance(labs.get(k), str)]
        if missing:
            fail("labs", labs, f"a dict naming the lab of every line (missing or not a str: {missing})")

    @classmethod
    def from_dict(cls, d: dict) -> "Day0Report":
        """A report from a dict of its fields; a missing required field or an unknown one is named."""
        check_type("d", d, dict, "a dict of Day0Report fields")
        known = {f.name: f for f in fields(cls)}
        for k in d:
            if k not in known:
                fail("d", k, f"Day0Report fields only (one of {sorted(known)})")
        required = [n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING]
        missing = [n for n in required if n not in d]
        if missing:
            fail(missing[0], None, f"given: the report needs {required} (missing {missing})")
        return cls(**d)


def _mb(n: int) -> float:
    return n / 1e6


def _row(line: str, this_run, against, against_what: str, source: str) -> dict:
    return {"line": line, "this run": this_run, "against": against, "against what": against_what, "from": source}


def report_rows(report: Day0Report) -> list[dict]:
    """The report's table as rows {line, this run, against, against what, from} (numbers as floats, units in the
    line; "-" where a line has nothing to compare with)."""
    check_type("report", report, Day0Report)
    labs = report.labs
    rows = [_row("layout", report.layout, report.planned_layout or "-",
                 "planner's first choice" if report.planned_layout else "-", labs["layout"])]
    for r, (planned, measured) in enumerate(zip(report.planned_bytes, report.measured_bytes)):
        rows.append(_row(f"memory rank {r} (MB)", _mb(measured), _mb(planned), "planned", labs["memory"]))
    speedup = report.load_serial_s / report.load_threaded_s if report.load_reliable else evidence.UNRELIABLE
    rows += [_row(f"load {report.precision}, threaded (s)", float(report.load_threaded_s),
                  float(report.load_serial_s), "serial (1 thread)", labs["load"]),
             _row("load speed-up, serial/threaded (x)", speedup, "-", "-", labs["load"]),
             _row("TTFT text (ms)", 1e3 * report.ttft_text_s, "-", "-", labs["ttft_text"]),
             _row("TTFT image (ms)", 1e3 * report.ttft_image_s, "-", "-", labs["ttft_image"])]
    if report.ttft_image_repeat_s is not None:
        again = 1e3 * report.ttft_image_repeat_s if report.ttft_image_repeat_reliable else evidence.UNRELIABLE
        rows.append(_row("TTFT same image again (ms)", again, 1e3 * report.ttft_image_s, "first request",
                         labs["ttft_image"]))
    for task in sorted(report.accuracy):
        rows.append(_row(f"accuracy {task} (%)", 100.0 * report.accuracy[task],
                         100.0 * report.reference_accuracy[task], "FP32 reference", labs["accuracy"]))
    return rows


def day0_report(report: Day0Report) -> str:
    """The Day-0 report as text: a title, the operators covered, and the table of report_rows ("this run"
    is what the service measured; "against" what it is compared with, named in "against what": the planner's
    first choice, the plan, the serial load, the first image request or the FP32 single-process run).
    Deterministic: the same report gives the same text."""
    check_type("report", report, Day0Report)
    ops = ", ".join(report.operators)
    head = [f"Day-0 report: {report.model}, {report.layout}, {report.precision}",
            f"operators covered ({len(report.operators)}): {ops}   [{report.labs['operators']}]"]
    return "\n".join(head) + "\n" + display.table(report_rows(report), digits=3)
