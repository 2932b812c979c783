# tiering: build, install, test, demo.  Each target installs what it needs.
PY ?= python3
PIP = $(PY) -m pip install -q --disable-pip-version-check
DEMO_DIR ?= $(or $(TMPDIR),/tmp)/tiering-demo

.PHONY: all build install test demo clean

all: build

# libtiershim.so into tiering/ (what `pip install .` does inside the wheel)
build:
	$(PY) setup.py -q build_ext --inplace

# Python dependencies, torch 2.13.0 (CPU) for the tests and the demo, and the
# package itself in editable mode (console scripts tier-run and tiering).
install:
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[test]"
	$(MAKE) build

test: install
	$(PY) -m pytest -q

# A generated ImageFolder data set of real JPEG files, a tiny CNN trained on
# it for 3 epochs under tier-run with the auto profile, then the summary.
demo: install
	$(PY) -m tiering.datagen "$(DEMO_DIR)/data" --classes 10 --per-class 100 --jpeg --seed 0
	tier-run --data "$(DEMO_DIR)/data" --stats-json "$(DEMO_DIR)/stats.json" -- \
		$(PY) examples/train_tiny_cnn.py --data "$(DEMO_DIR)/data" --epochs 3
	@echo "statistics: $(DEMO_DIR)/stats.json"

clean:
	rm -rf build *.egg-info tiering/libtiershim.so shim/libtiershim.so
