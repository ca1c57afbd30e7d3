# Two commands do all the set-up (see README.md):
#   make lab    create .venv with the pinned dependencies, install labkit, write the student notebooks that are
#               missing into student/ (never overwriting one you changed), start JupyterLab there
#   make test   the same set-up, then the linter (ruff), unit and property tests, then every notebook run once: the
#               student versions in JupyterLab in headless Chromium (the browser test), each output compared with the
#               instructor notebook's stored one as nbval compares it; without Chromium or playwright, it says so and runs
#               nbval on the instructor notebooks instead
# Instructors: make student (hand out), make grade SUBMISSIONS=folder [LAB=00_setup] (collect, grade),
# make lab-instructor (JupyterLab on notebooks/, the solutions). make test-browser: the browser test alone.
# Maintainers: make test-nbval runs nbval on the instructor notebooks, make test-portable the same under other CPU
# kernels, make test-builds the kernel tests under every build of lab 03's C rungs this CPU runs (CI runs both after
# make test); make peers installs llama.cpp (compiled from source) for benchmarks/peers.py.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# JupyterLab refuses to run as root unless told it may (containers, CI machines).
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)
LAB_FLAGS ?= --no-browser --ip=127.0.0.1
PIP_ARGS ?=
NBVAL_FLAGS := --nbval --nbval-current-env --nbval-cell-timeout=300 \
	--nbval-sanitize-with notebooks/nbval_sanitize.cfg
STUDENT ?= student
SUBMISSIONS ?= submissions
GRADES ?= grades/gradebook.csv
LAB ?=
CHROMIUM ?= /usr/bin/chromium
# auto: run the browser test when Chromium and playwright are there, else say it was skipped; required: fail.
BROWSER_TEST ?= auto
CLASSROOM := $(BIN)/python -m labkit.course.classroom

# A learner's laptop without AVX-512 or AMX: torch's own kernels held to AVX2, oneDNN and MKL likewise, on this
# machine's own thread count. The browser test (make test) runs its kernels on a share of the cores (one thread on 2
# to 4), so the two runs differ in thread count on every machine, and in the CPU's kernels on one with AVX-512 or
# AMX: a stored output that depends on either fails one of them, on the maintainer's own machine.
PORTABLE_ENV ?= ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
# ... and lab 03's C rungs built for the lane count this CPU would not choose (16 on an AVX2 CPU, 8 on an AVX-512
# one), while the browser test runs this CPU's own: a stored output that depends on the lanes fails one of them.
OTHER_LANES = $(shell $(BIN)/python -m tests.quant.builds --other-lanes-flags 2>/dev/null)
# Worker processes (pytest-xdist), one per core: the unit suite keeps each test file on one worker (its module's
# servers and pools are started once), nbval each notebook (its cells in order; longest first, notebooks/conftest.py),
# the browser test one JupyterLab and Chromium per worker. WORKERS=0 runs each in this process, one after another.
WORKERS ?= $(shell $(PYTHON) -c 'import os; print(min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))')
NBVAL = $(BIN)/python -m pytest -n $(WORKERS) --dist loadfile $(NBVAL_FLAGS)
# The notebooks test-nbval and test-portable check (one: make test-portable NB=notebooks/03_int4_quantization.ipynb).
NB ?= notebooks

.PHONY: lab lab-instructor test test-nbval test-portable test-builds test-browser peers student grade clean

# The venv is rebuilt only when pyproject.toml changes: a second `make test` installs nothing.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10 or newer is needed, found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check $(PIP_ARGS) -e .
	touch $(STAMP)

# The learner's path: your notebooks live in student/, and nothing here ever overwrites or deletes them.
lab: student
	$(BIN)/jupyter lab --notebook-dir=$(STUDENT) $(LAB_FLAGS) $(ROOT_FLAG)

lab-instructor: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(LAB_FLAGS) $(ROOT_FLAG)

test: $(STAMP)
	$(BIN)/ruff check labkit tests benchmarks
	$(BIN)/python -m pytest tests --ignore=tests/browser -n $(WORKERS) --dist loadfile -rs
	@if [ -x "$(CHROMIUM)" ] && $(BIN)/python -c "import playwright.sync_api" 2>/dev/null; then \
		$(MAKE) --no-print-directory test-browser; \
	elif [ "$(BROWSER_TEST)" = required ]; then \
		echo "FAILED: the browser test needs $(CHROMIUM) (apt-get install chromium) and playwright"; exit 1; \
	else \
		echo "SKIPPED: the browser test (make test-browser): no $(CHROMIUM) or no playwright;" \
			"install Chromium (apt-get install chromium) to run it. nbval runs the instructor notebooks instead"; \
		$(MAKE) --no-print-directory test-nbval; \
	fi

# nbval on the instructor notebooks: each one executed top to bottom, its outputs compared with the stored ones.
test-nbval: $(STAMP)
	@# A fresh machine's first matplotlib import writes a font-cache notice to stderr; a compared cell would see it.
	@$(BIN)/python -c "import matplotlib.pyplot"
	$(NBVAL) $(NB)

# nbval on every notebook again, under PORTABLE_ENV: the stored outputs must not depend on this machine's CPU.
test-portable: $(STAMP)
	@$(BIN)/python -c "import matplotlib.pyplot"
	env $(PORTABLE_ENV) LABKIT_CFLAGS="$(OTHER_LANES)" $(NBVAL) $(NB)

# The kernel tests (tests/quant/test_kernels*.py) once per build of lab 03's C rungs that this CPU runs: plain C,
# AVX2, AVX-512 and VNNI where the CPU has them, both lane counts, clang, LABKIT_C=0 (tests/quant/builds.py).
test-builds: $(STAMP)
	$(BIN)/python -m tests.quant.builds

# Every student notebook opened in JupyterLab in headless Chromium: run all cells, no errors, every widget
# rendered and answering its controls, every output nbval compares equal to the instructor notebook's stored one
# (the solutions themselves run in tests/course/test_solutions.py). Fails (not skips) when Chromium or playwright
# is missing.
test-browser: $(STAMP)
	@$(BIN)/python -c "import matplotlib.pyplot"
	LABKIT_CHROMIUM=$(CHROMIUM) LABKIT_BROWSER_REQUIRED=1 $(BIN)/python -m pytest -n $(WORKERS) --dist load tests/browser

# Opt-in, never part of lab or test: llama.cpp beside labkit (llama-cpp-python and its OpenAI server, the "peers"
# extra) for benchmarks/peers.py and the peer cells of notebooks 03 and 06. It compiles llama.cpp from source:
# cmake and a C++ compiler, about 15 minutes on 2 cores.
# llama.cpp's multimodal library (mtmd, formerly llava) is not built: benchmarks/peers.py does not use it, and
# the build takes about half the time without it (7 minutes on 2 free cores).
peers: $(STAMP)
	CMAKE_ARGS="$${CMAKE_ARGS:+$$CMAKE_ARGS }-DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(BIN)/python -m pip install --disable-pip-version-check $(PIP_ARGS) -e ".[peers]"

# Writes only the student notebooks that are missing; a newer version of one you changed goes beside it.
student: $(STAMP)
	$(CLASSROOM) student $(STUDENT)

grade: $(STAMP)
	$(CLASSROOM) grade $(SUBMISSIONS) --out $(GRADES) $(if $(LAB),--lab $(LAB))

# Only what `make` rebuilds: never student/ (a learner's work), submissions/ or grades/.
clean:
	rm -rf $(VENV) build labkit.egg-info
