"""Grade one submitted notebook: run it in a fresh kernel of its own and read each exercise's verdict from the
course's own check, never from what the notebook printed.

    result = grade_notebook(nb, lab, cell_timeout=300, timeout=1800)
    result.verdicts   # {"tinylm.COUNT_PARAMS": Verdict("PASS", "count_params matches ...")}

The notebook (a dict; the file is never written) runs cell by cell, in its own order, in a kernel process
started for it alone (labkit.course.sandbox: no network, every check recorded), in an empty temporary
folder, with a time limit per cell and per notebook. A cell that raises does not stop the run; a cell that
runs past its limit is interrupted and the run goes on. Each exercise's check cell is found by its code
(labkit.course.labs), wherever the student moved it. Verdicts:

    PASS / FAIL / TODO   what the course's check reported on the student's function
    ERROR                the check cell crashed, timed out, or was never reached (time limit, dead kernel)
    TAMPERED             the check cell is not the handed-out one, or the check was bypassed or fed an
                         exercise that is not the course's
After a check cell crashed, the student's name for the function is bound to the reference, as the check
itself does after a failure, so the cells after it still run. labkit.course.gradebook grades a class.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from .._checks import check_positive, check_type
from . import labs, sandbox
from .labs import Lab

STATUSES = ("PASS", "FAIL", "TODO", "ERROR", "TAMPERED", "MISSING")
TIMEOUT = "CellTimeoutError"
SETUP = "import labkit.course.sandbox as _labkit_sandbox; _labkit_sandbox.install(); del _labkit_sandbox"
NO_NETWORK = {**{k: "http://127.0.0.1:9" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                                                   "ALL_PROXY", "all_proxy")},
              "no_proxy": "localhost,127.0.0.1,::1", "NO_PROXY": "localhost,127.0.0.1,::1", "PIP_NO_INDEX": "1",
              "HF_HUB_OFFLINE": "1"}
EDITED = "its check cell is not the one handed out (edited or removed)"


@dataclass(frozen=True)
class Verdict:
    """One exercise's grade: a status from STATUSES and what it is about."""
    status: str
    message: str = ""

    def __str__(self) -> str:
        return f"{self.status}: {self.message}" if self.message else self.status


@dataclass
class Result:
    """A graded notebook: verdicts by exercise id, problems (what cut grading short: a timeout, a dead
    kernel), notes (cells that raised), and the wall time in seconds."""
    lab: str
    verdicts: dict[str, Verdict]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


@functools.lru_cache(maxsize=None)
def isolation() -> tuple[str, ...]:
    """The command prefix that starts a kernel in a network namespace of its own (`unshare --net`, as root or
    through a user namespace), or () where this machine does not allow it (then only the audit hook of
    labkit.course.sandbox keeps the network off)."""
    tool = shutil.which("unshare")
    if not sys.platform.startswith("linux") or not tool:
        return ()
    for flags in (("--net",), ("--net", "--map-root-user")):
        try:
            done = subprocess.run([tool, *flags, sys.executable, "-c", "pass"], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return (tool, *flags)
    return ()


def _kernel_manager(work: str):
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

    argv = [*isolation(), sys.executable, "-m", "labkit.course.sandbox", "-f", "{connection_file}",
            "--HistoryManager.hist_file=:memory:"]

    class OneKernel(KernelSpecManager):
        def get_kernel_spec(self, kernel_name, *args, **kwargs):
            return KernelSpec(argv=argv, display_name="labkit grader", language="python")

    where = {"transport": "ipc", "ip": os.path.join(work, "kernel")} if os.name == "posix" else {}
    return AsyncKernelManager(kernel_name="labkit-grader", kernel_spec_manager=OneKernel(), **where)


def _records(cell, nonce: str) -> list[dict]:
    return [o["data"][sandbox.MIME] for o in cell.get("outputs", [])
            if o.get("output_type") == "display_data" and sandbox.MIME in o.get("data", {})
            and isinstance(o["data"][sandbox.MIME], dict) and o["data"][sandbox.MIME].get("nonce") == nonce]


def _verdict(check: labs.Check, k: int, records: list[dict], reply: dict, limit: int) -> Verdict:
    """One check's verdict from the records of its cell and the cell's execute reply."""
    if check.module:
        mine = [r for r in records if r.get("exercise") in (check.exercise, "?")]
    else:
        mine = records[k:k + 1]
    if reply.get("ename") == TIMEOUT:
        return Verdict("ERROR", f"timed out after {limit} s: the check did not finish")
    if mine:
        record = mine[-1]
        if record.get("exercise") == "?":
            return Verdict("TAMPERED", "the check ran on an exercise that is not the course's "
                                       "(replaced or changed by an earlier cell)")
        status = record.get("verdict") if record.get("verdict") in STATUSES else "ERROR"
        return Verdict(status, str(record.get("message", "")))
    if reply.get("status") == "error":
        return Verdict("ERROR", f"the check cell raised {reply.get('ename')}: {reply.get('evalue')}")
    return Verdict("TAMPERED", "the check cell ran but never reached the course's check "
                               "(was check.exercise replaced by an earlier cell?)")


class _Kernel:
    """One notebook's kernel through nbclient: runs the notebook's cells, and the grader's own code between them
    as hidden cells; each run's execute reply is the result."""

    def __init__(self, nb, work: str):
        from nbclient import NotebookClient
        self.nb, self.replies = nb, []
        self.client = NotebookClient(
            nb, km=_kernel_manager(work), allow_errors=True, interrupt_on_timeout=True, shutdown_kernel="immediate",
            error_on_timeout={"ename": TIMEOUT, "evalue": "timed out", "traceback": []},
            resources={"metadata": {"path": work}},
            on_cell_executed=lambda cell, cell_index, execute_reply: self.replies.append(execute_reply["content"]))

    def run(self, cell, index: int, limit: int) -> dict:
        self.client.timeout = limit
        self.replies.clear()
        self.client.execute_cell(cell, index)
        return self.replies[-1] if self.replies else {"status": "ok"}

    def hidden(self, code: str, limit: float) -> dict:
        import nbformat
        self.nb.cells.append(nbformat.v4.new_code_cell(code))
        try:
            return self.run(self.nb.cells[-1], len(self.nb.cells) - 1, limit)
        finally:
            self.nb.cells.pop()


def _run_cells(kernel: _Kernel, plan: list, result: Result, pending: set[str], nonce: str, timeout: float,
               deadline: float, cell_timeout: float) -> str:
    """Run the notebook's code cells in order, grading the check cells among them into `result`; the reason the
    run stopped early ("" if it did not). The notebook's `timeout` (seconds) ends at `deadline`, a value of
    time.monotonic()."""
    from nbclient.exceptions import DeadKernelError

    for i, cell, lab_cell in plan:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"the notebook's time limit ({timeout:g} s) ran out before cell {i + 1}"
        limit = max(1, math.ceil(min(cell_timeout, left)))
        try:
            reply = kernel.run(cell, i, limit)
        except DeadKernelError:
            return f"the kernel died in cell {i + 1}"
        if reply.get("ename") == TIMEOUT:
            result.problems.append(f"cell {i + 1} timed out after {limit} s and was interrupted")
        elif reply.get("status") == "error":
            result.notes.append(f"cell {i + 1} raised {reply.get('ename')}: {reply.get('evalue')}")
        if lab_cell:
            records = _records(cell, nonce)
            for k, chk in enumerate(lab_cell.checks):
                result.verdicts[chk.exercise] = _verdict(chk, k, records, reply, limit)
                pending.discard(chk.exercise)
            fallback = "\n".join(c.fallback for c in lab_cell.checks if c.fallback)
            if reply.get("status") == "error" and fallback:
                kernel.hidden(fallback, max(1, math.ceil(min(cell_timeout, 60))))
        cell.outputs = []  # only the verdicts are kept: a chatty notebook does not fill memory
        kernel.client.clear_display_id_mapping(i)
    return ""


def grade_notebook(nb: dict, lab: Lab, cell_timeout: float = 300, timeout: float = 1800) -> Result:
    """Run notebook `nb` (nbformat 4 as a dict) in a fresh kernel and grade lab `lab`'s exercises.
    cell_timeout and timeout are seconds, per cell and for the whole notebook."""
    import nbformat

    check_type("nb", nb, dict)
    check_type("lab", lab, Lab)
    check_positive("cell_timeout", cell_timeout)
    check_positive("timeout", timeout)
    start = time.monotonic()
    deadline = start + timeout
    nb = nbformat.reads(json.dumps(nb), as_version=4)  # a copy, with every source as one string
    result = Result(lab.name, {ex: Verdict("TAMPERED", EDITED) for ex in lab.exercises})
    by_code = {cell.code: cell for cell in lab.cells}
    plan = [(i, cell, by_code.get(labs.cell_code(labs.source_of(cell))))
            for i, cell in enumerate(nb.cells) if cell.get("cell_type") == "code"]
    pending = {c.exercise for _, _, lab_cell in plan if lab_cell for c in lab_cell.checks}
    nonce = secrets.token_hex(16)
    env = {**os.environ, **NO_NETWORK, sandbox.ENV_NONCE: nonce, sandbox.ENV_EXERCISES: labs.dumps_exercises(lab),
           sandbox.ENV_NETNS: "1" if isolation() else "0"}
    stop = "the grader could not start the notebook's kernel"
    with tempfile.TemporaryDirectory(prefix="labkit-grade-") as work:
        kernel = _Kernel(nb, work)
        try:
            with kernel.client.setup_kernel(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
                left = deadline - time.monotonic()
                setup = kernel.hidden(SETUP, max(1, math.ceil(min(left, max(cell_timeout, 120)))))
                if setup.get("status") != "ok":
                    raise RuntimeError(f"{setup.get('ename')}: {setup.get('evalue')}")
                stop = ""
                stop = _run_cells(kernel, plan, result, pending, nonce, timeout, deadline, cell_timeout)
        except Exception as e:  # the kernel could not start, or the set-up cell failed
            stop = stop or "the grader lost the notebook's kernel"
            result.problems.append(f"{stop}: {type(e).__name__}: {e}")
        else:
            if stop:
                result.problems.append(stop)
    for ex in pending:
        result.verdicts[ex] = Verdict("ERROR", f"not graded: {stop}")
    result.seconds = time.monotonic() - start
    return result
