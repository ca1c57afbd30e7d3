"""One notebook operated in JupyterLab in a browser page: run all cells, read what went wrong, move one control
of every interactive widget (tests/browser/lab.py starts the server and the browser)."""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.notebook_outputs import VERDICT

from .lab import TRACEBACK, Lab

PROMPTS = "() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')].map(e => e.textContent)"
STARTED = f"() => ({PROMPTS})().some(t => /[*0-9]/.test(t))"
FINISHED = (f"() => {{ const p = ({PROMPTS})(); return p.length > 0 && !p.some(t => t.includes('*')) && "
            "p.some(t => /[0-9]/.test(t)) && "
            "document.querySelector(\".jp-Notebook-ExecutionIndicator[data-status='idle']\") !== null; }")
OUTPUTS = """() => [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')].map(e => ({
    text: e.textContent, widget: e.querySelector('.jupyter-widgets') !== null,
    plain: e.getAttribute('data-mime-type') === 'text/plain'}))"""
# What an interactive widget's output shows: its text and its images (plots have no text).
SHOWN = "out => out.textContent + [...out.querySelectorAll('img')].map(i => i.src).join('|')"
READY = ("() => document.querySelector(\".jp-Notebook-ExecutionIndicator[data-status='idle']\") !== null && "
         "/[|] Idle/.test(document.querySelector('.jp-StatusBar-Widget')?.textContent ?? '') && "
         "!/No Kernel/.test(document.querySelector('.jp-StatusBar-Widget')?.textContent ?? '')")
DIALOG = "document.querySelector('.jp-Dialog') !== null"
RUN_ALL = ".lm-Menu-item[data-command='runmenu:run-all']"
CHANGED = f"([out, before]) => {{ const now = ({SHOWN})(out); return now !== before && now.trim().length > 0; }}"


@dataclass
class Findings:
    """What running a notebook in the browser showed."""
    cells: int = 0                                     # code cells
    unrun: list[int] = field(default_factory=list)     # code cells (1-based) left without an execution count
    errors: list[str] = field(default_factory=list)    # error outputs, tracebacks, widgets that failed to show
    widgets: int = 0                                   # widget views rendered
    interactive: int = 0                               # interactive widgets (controls + output) found
    unchanged: list[str] = field(default_factory=list)  # interactive widgets whose output a control did not change
    verdicts: list[str] = field(default_factory=list)  # the check cells' verdict lines ("[TODO] ...") in order
    saved: dict = field(default_factory=dict, repr=False)  # the notebook as JupyterLab saved it after Run All
    seconds: float = 0.0


def expected_interactive(nb: dict) -> int:
    """How many ipywidgets.interactive views a notebook's stored outputs hold (its top-to-bottom run)."""
    return sum("application/vnd.jupyter.widget-view+json" in o.get("data", {})
               and "".join(o["data"].get("text/plain", "")).startswith("interactive(")
               for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))


def _move_one_control(page, box) -> str:
    """Change the first control of an interactive widget; what was done, in words."""
    handle = box.query_selector(".noUi-handle")
    if handle:
        at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
        handle.focus()
        page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")
        return "slider moved one step"
    select = box.query_selector("select")
    if select:
        options = [o.get_attribute("value") for o in select.query_selector_all("option")]
        other = next(v for v in options if v != select.input_value())
        select.select_option(other)
        return f"dropdown set to {other}"
    toggle = box.query_selector(".widget-toggle-button:not(.mod-active)")
    if toggle:
        toggle.click()
        return "toggle button clicked"
    checkbox = box.query_selector("input[type=checkbox]")
    if checkbox:
        checkbox.click()
        return "checkbox clicked"
    raise AssertionError("an interactive widget without a slider, dropdown, toggle button or checkbox")


def _kernel_ready(page, lab: Lab, name: str, deadline: float) -> None:
    """Wait until the server has an idle kernel for the notebook and the page shows it: the toolbar's
    indicator reads idle before the page has connected to any kernel, so it alone is not enough."""
    while not any(s.get("path") == name and s.get("kernel", {}).get("execution_state") == "idle"
                  for s in lab.api("sessions")):
        assert time.monotonic() < deadline, f"no idle kernel for {name}"
        _accept_dialogs(page)
        page.wait_for_timeout(250)  # polling the server, not the page
    left_ms = max(1000, (deadline - time.monotonic()) * 1000)
    page.wait_for_function(READY, timeout=left_ms, polling=250)


def _accept_dialogs(page) -> None:
    """Accept what JupyterLab asks ("Select Kernel" when it opened the notebook before its kernel list)."""
    for button in page.query_selector_all(".jp-Dialog .jp-Dialog-button.jp-mod-accept"):
        button.click()


def _run_all(page, deadline: float) -> None:
    """Run > Run All Cells, again until the cells are queued: a page still settling ignores the first click."""
    item = f"{RUN_ALL}:not(.lm-mod-disabled)"
    while True:
        left_ms = max(1000, (deadline - time.monotonic()) * 1000)
        _accept_dialogs(page)
        page.click(".lm-MenuBar-itemLabel:text-is('Run')", timeout=left_ms)
        try:
            page.click(item, timeout=min(left_ms, 10_000))
            page.wait_for_function(STARTED, timeout=min(left_ms, 10_000), polling=250)
            return
        except Exception:  # playwright's TimeoutError: not enabled yet, or the click went nowhere
            if time.monotonic() > deadline:
                raise
            page.keyboard.press("Escape")


def _saved_notebook(page, lab: Lab, name: str, timeout_ms: float) -> dict:
    """Save the notebook from the page and read the file JupyterLab wrote. The server writes the file in place
    (truncate, then write), so a read between the two finds an empty or cut file: read again until it parses."""
    path = lab.root / name
    before = path.stat().st_mtime_ns
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + timeout_ms / 1000
    while True:  # polling the file: the save is JupyterLab's, not the page's
        if path.stat().st_mtime_ns != before:
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError as e:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{name} as JupyterLab saved it is not JSON after {timeout_ms / 1000:.0f} "
                                         f"s: {e}") from e
        elif time.monotonic() > deadline:
            raise AssertionError(f"JupyterLab did not save {name} within {timeout_ms / 1000:.0f} s")
        page.wait_for_timeout(200)


def _verdicts(nb: dict) -> list[str]:
    """The verdict lines that the notebook's check cells printed, in order."""
    return [line for c in nb["cells"] if "check.exercise(" in "".join(c.get("source", ""))
            for o in c.get("outputs", []) if o.get("output_type") == "stream"
            for line in "".join(o["text"]).splitlines() if VERDICT.match(line)]


def run_notebook(browser, lab: Lab, name: str, screenshot: Path, timeout_s: float = 600,
                 change_s: float | None = None) -> Findings:
    """Open `name` in JupyterLab, run all cells, check outputs, operate every interactive widget; each wait
    lasts at most timeout_s seconds (change_s for a widget's output to change, timeout_s by default)."""
    start, ms = time.monotonic(), timeout_s * 1000
    change_ms = ms if change_s is None else change_s * 1000
    found = Findings()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        # ?reset: a fresh workspace, or JupyterLab reopens (and reruns kernels for) the notebooks opened before
        page.goto(f"{lab.url}/lab/tree/{name}?reset&token={lab.token}", timeout=ms)
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=ms)
        _kernel_ready(page, lab, name, start + timeout_s)
        _run_all(page, start + timeout_s)
        while True:  # until every queued cell ran, accepting any dialog JupyterLab opens on the way
            left_ms = max(1000, (start + timeout_s - time.monotonic()) * 1000)
            page.wait_for_function(f"() => ({FINISHED})() || {DIALOG}", timeout=left_ms, polling=500)
            if not page.query_selector(".jp-Dialog"):
                break
            assert time.monotonic() < start + timeout_s, "a JupyterLab dialog stays open"
            _accept_dialogs(page)
        prompts = page.evaluate(PROMPTS)
        found.cells = len(prompts)
        found.unrun = [i + 1 for i, t in enumerate(prompts) if not re.search(r"\d", t)]
        outputs = page.evaluate(OUTPUTS)
        found.widgets = sum(o["widget"] for o in outputs)
        found.errors = [o["text"][-300:].strip() for o in outputs if re.search(TRACEBACK, o["text"])]
        found.errors += [f"a widget shown as text: {o['text'][:100]}" for o in outputs
                         if o["plain"] and re.match(r"\w+\(children=", o["text"])]
        saved = _saved_notebook(page, lab, name, ms)
        found.errors += [f"cell {i + 1}: {o['ename']}: {o['evalue']}" for i, c in enumerate(saved["cells"])
                         for o in c.get("outputs", []) if o.get("output_type") == "error"]
        found.verdicts, found.saved = _verdicts(saved), saved
        boxes = page.query_selector_all(".jp-Notebook .widget-interact")
        found.interactive = len(boxes)
        for n, box in enumerate(boxes, 1):
            out = box.query_selector(".widget-output")
            box.scroll_into_view_if_needed()
            before = out.evaluate(SHOWN)
            done = _move_one_control(page, box)
            try:
                page.wait_for_function(CHANGED, arg=[out, before], timeout=change_ms, polling=200)
            except Exception as e:  # playwright's TimeoutError; the finding is reported, not raised
                found.unchanged.append(f"widget {n}: {done}, output unchanged ({type(e).__name__})")
                continue
            if re.search(TRACEBACK, out.text_content()):
                found.errors.append(f"widget {n} after '{done}': {out.text_content()[-300:].strip()}")
        page.screenshot(path=str(screenshot))
    except Exception:  # a wait ran out: keep a picture of the page for the failure report
        page.screenshot(path=str(screenshot.with_suffix(".failed.png")))
        raise
    finally:
        page.close()
        lab.shutdown_kernels()
    found.seconds = time.monotonic() - start
    return found
