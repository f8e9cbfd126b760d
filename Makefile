# Two commands from a fresh clone:  make test   and   make demo
# Both create .venv when it is missing and install ctuq into it, holding
# torch to the CPU build 2.13.0 through constraints.txt.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.ctuq-installed

# Debian packages that Xvfb and Qt's xcb platform plugin need (napari draws under X).
APT_PACKAGES := xvfb xauth libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 \
	libxcb-render-util0 libxcb-xinerama0 libxcb-xkb1 libxcb-shape0 libxcb-randr0 \
	libxkbcommon-x11-0 libegl1 libgl1 libfontconfig1 libdbus-1-3 libglib2.0-0

# Debian's packaged data sets, read offline at run time: Fashion-MNIST for the
# classification benchmark (ctuq bench-classify --dataset fmnist finds it in
# /usr/share/datasets without --data-dir).
DATA_PACKAGES := dataset-fashion-mnist

.PHONY: test demo install apt-deps data-deps bench bench-uq bench-calibration clean

$(STAMP): pyproject.toml constraints.txt requirements-laplace.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	$(PIP) install -q -c constraints.txt --no-deps -r requirements-laplace.txt
	touch $(STAMP)

install: $(STAMP) data-deps

# $(call apt-install,packages,what they are for): installs the missing ones as root
# (waiting up to 10 min for a dpkg lock another apt holds), otherwise names them
# and the command.
define apt-install
	@missing=""; for p in $(1); do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "installing:$$missing"; \
			apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive \
				apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing >/dev/null; \
		else \
			echo "warning: missing Debian packages for $(2); as root: apt-get install$$missing"; \
		fi; \
	fi
endef

apt-deps:
	$(call apt-install,$(APT_PACKAGES),napari under Xvfb)

data-deps:
	$(call apt-install,$(DATA_PACKAGES),the Fashion-MNIST benchmark)

# Two pytest workers (pytest-xdist), one test file each at a time and one torch thread
# each (tests/conftest.py): most tests keep one core busy, so a 2-core machine runs the
# suite in about half the time. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: $(STAMP) apt-deps data-deps
	$(VENV)/bin/lint-imports
	QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1280x1024x24" $(PY) -m pytest \
		-n $(TEST_WORKERS) --dist loadfile

demo: $(STAMP)
	$(VENV)/bin/ctuq demo --out demo_out

bench: $(STAMP)
	$(PY) scripts/bench_operators.py

# Uncertainty quality and speed (issue 10): docs/benchmarks.md, benchmarks/results/bench_uq*.png and
# benchmarks/results/bench_uq.json; about 1.5 h on 2 CPU cores (from its parts' times). Finished quality cases are cached in
# bench_uq_cases.jsonl, so an interrupted run resumes where it stopped.
bench-uq: $(STAMP)
	$(PY) scripts/bench_uq.py --partial bench_uq_cases.jsonl --docs docs > benchmarks/results/bench_uq.json

# Calibration benchmark on the test split (the README's figures): docs/calibration.md,
# benchmarks/results/bench_calibration*.{json,png}; hours on 2 CPU cores; finished cases
# are kept in bench_calibration_cases.jsonl, so an interrupted run resumes where it stopped.
bench-calibration: $(STAMP)
	$(PY) scripts/bench_calibration.py --split test --sizes 64,128 --jobs 2 \
		--partial bench_calibration_cases.jsonl --docs docs > benchmarks/results/bench_calibration.json

clean:
	rm -rf $(VENV) demo_out .pytest_cache .hypothesis
