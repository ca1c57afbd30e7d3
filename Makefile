# Two commands do all the set-up (see README.md):
#   make lab    create .venv with the pinned dependencies, install labkit, start JupyterLab on notebooks/
#   make test   the same set-up, then unit and property tests, then nbval on every notebook
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

.PHONY: lab test student clean

# The venv is rebuilt only when pyproject.toml changes: a second `make test` installs nothing.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10 or newer is needed, found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check $(PIP_ARGS) -e .
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(LAB_FLAGS) $(ROOT_FLAG)

test: $(STAMP)
	$(BIN)/python -m pytest tests
	@# A fresh machine's first matplotlib import writes a font-cache notice to stderr; nbval would see it.
	@$(BIN)/python -c "import matplotlib.pyplot"
	$(BIN)/python -m pytest $(NBVAL_FLAGS) notebooks

student: $(STAMP)
	$(BIN)/python -m labkit.course.classroom student student

clean:
	rm -rf $(VENV) student
