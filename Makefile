# tiering: build, install, check, test, demo.  Each target installs what it needs.
#
# Everything goes into a virtual environment of the checkout's own, .venv
# (VENV=DIR for another), made with $(BASE_PY) -m venv when it is missing;
# its bin/ comes first on PATH for what the targets run.  PY=python names an
# interpreter to install into instead (its environment, as it is).
BASE_PY ?= python3
VENV ?= .venv
ifeq ($(origin PY),undefined)
PY = $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
DEPS = $(VENV)/.tiering-deps
else
DEPS = deps-always
endif
PIP = $(PY) -m pip install -q --disable-pip-version-check
# DEMO_DIR=DIR: where make demo works (default: $TMPDIR/tiering-demo-$USER, examples/demo.py)
DEMO_DIR ?=

# pytest unbuffered (-u), naming each test as it runs (-v): progress shows as
# the tests go, also through a pipe (CI), never minutes of nothing
PYTEST = $(PY) -u -m pytest -v

.PHONY: all build deps deps-always install check lint test test-deps reliability sanitize sanitizer-deps demo clean bench bench-quick bench-micro bench-deps bench-multinode

all: build

# libtiershim.so and libtierplan.so into tiering/ (what `pip install .` does inside the wheel)
build: deps
	$(PY) setup.py -q build_ext --inplace

# Python dependencies, torch 2.13.0 (CPU) for the tests and the demo, ruff
# and mypy, and the package itself in editable mode (console scripts tier-run
# and tiering); into .venv again only when pyproject.toml or setup.py changed.
define PIP_INSTALL
	$(PIP) "torch==2.13.0" "setuptools>=61"
	$(PIP) -e ".[test]"
endef
deps: $(DEPS)

# the venv; where $(BASE_PY) lacks the venv module (Debian's python3 without
# python3-venv), as root installs it with apt-get, otherwise says what to install
$(VENV)/.tiering-deps: pyproject.toml setup.py
	@test -x "$(PY)" || { echo "making the virtual environment $(VENV) ($(BASE_PY) -m venv)"; \
	  $(BASE_PY) -m venv "$(VENV)" || { rm -rf "$(VENV)"; \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv && \
	      $(BASE_PY) -m venv "$(VENV)" || exit 1; \
	    else \
	      echo "venv: $(BASE_PY) -m venv failed; run: sudo apt-get install -y python3-venv" >&2; exit 1; \
	    fi; }; }
	$(PIP_INSTALL)
	@touch "$@"

deps-always:
	$(PIP_INSTALL)

install: deps build

# ruff on the Python sources, mypy on the package (both configured in pyproject.toml)
lint: install
	$(PY) -m ruff check tiering tests bench
	$(PY) -m mypy tiering

# The quick loop, what to run while working: lint, then the tests not marked
# slow (@pytest.mark.slow in the test modules; the tools they run installed as
# for make test, the sanitizers' runtimes aside: those runs are slow).  Under 2 minutes on 2 cores
# (README, "The commands").
check: lint test-deps bench-deps
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# The whole suite, the slow tests too (the wheel installed in a fresh venv,
# the benchmarks' smoke runs, the emulated nodes, the C tests under the
# sanitizers), after lint; its time is in the README.
test: install lint bench-deps test-deps sanitizer-deps
	$(PYTEST) $(PYTEST_ARGS)

# The C tests of the shim's lock-free parts under AddressSanitizer with UBSan
# and under ThreadSanitizer only (docs/design.md, NOTE [sanitizers]).
sanitize: install sanitizer-deps
	$(PYTEST) -m "asan or tsan" $(PYTEST_ARGS)

# The sanitizers' runtimes for the C compiler (libasan, libubsan, libtsan): as
# root, installs libgcc-N-dev (N: gcc's major version, whose package ships
# them) with apt-get when a test program cannot be built and run with them;
# otherwise says what to install.
SANITIZE_CHECK = t=$$(mktemp -d) && echo 'int main(void){return 0;}' > $$t/t.c && \
	cc -fsanitize=address,undefined -o $$t/a $$t/t.c && $$t/a && cc -fsanitize=thread -o $$t/t $$t/t.c && $$t/t; \
	r=$$?; rm -rf $$t; exit $$r
sanitizer-deps:
	@if ! ( $(SANITIZE_CHECK) ) >/dev/null 2>&1; then \
	  pkg="libgcc-$$(cc -dumpversion | cut -d. -f1)-dev"; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "sanitizer-deps: installing $$pkg with apt-get"; \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y gcc "$$pkg" || exit 1; \
	  else \
	    echo "sanitizer-deps: cc cannot build with -fsanitize=address,undefined and -fsanitize=thread; run: sudo apt-get install -y $$pkg" >&2; \
	    exit 1; \
	  fi; \
	  ( $(SANITIZE_CHECK) ) || { echo "sanitizer-deps: cc still cannot build with the sanitizers" >&2; exit 1; }; \
	fi

# Tools the tests run under tier-run as users do (rsync -a; tar, cp and
# setpriv come with the base system): installed with apt-get when missing.
test-deps:
	@if ! command -v rsync >/dev/null 2>&1 || ! command -v setpriv >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "test-deps: installing rsync and util-linux with apt-get"; \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y rsync util-linux || exit 1; \
	  else \
	    echo "test-deps: rsync or setpriv is missing; run: sudo apt-get install -y rsync util-linux" >&2; \
	    exit 1; \
	  fi; \
	fi

# The fault and hostile-input tests (marker reliability) and, at the end,
# the figures each recorded: faults survived, reads and bytes checked.
reliability: install
	$(PYTEST) -m reliability $(PYTEST_ARGS)

# make print-VAR: the value of a variable (the tests run $(PYTEST) as make does)
print-%:
	@echo '$($*)'

# The same training script run twice on an emulated slow PFS (bench/slowfs,
# FUSE): once reading it directly, once under tier-run; the epoch times side
# by side, tier-run's summary and `tiering report`'s picture.  About a minute
# on 2 cores.  Where FUSE cannot be mounted it says so and runs both on the
# local copy (no benefit to see then).
demo: install
	$(PY) examples/demo.py $(if $(DEMO_DIR),--dir "$(DEMO_DIR)")

# the build's outputs (not the virtual environment: make distclean removes it too)
clean:
	rm -rf build *.egg-info tiering/libtiershim.so tiering/clairvoyant/libtierplan.so shim/libtiershim.so

.PHONY: distclean
distclean: clean
	rm -rf "$(VENV)"

# The benchmark suite: the emulated PFS (slowfs), three scenarios, every
# policy against the PFS directly and the /dev/shm lower bound; writes
# bench/results/{<scenario>.json,summary.md,epochs.png}.  About 10 minutes;
# bench-quick is the under-a-minute smoke run (results in bench/results/quick).
bench: install bench-deps
	$(PY) -m bench.run $(BENCH_ARGS)

bench-quick: install bench-deps
	$(PY) -m bench.run --quick --out bench/results/quick $(BENCH_ARGS)

# PFS-bound benchmark (the reader held back by the PFS, not by compute): an
# 8-thread C reader (bench/workloads/preader.c) of a seeded random order per
# epoch, no compute, 100 k files of about 20 KiB (2 GB) on slowfs; the PFS
# directly, every file once at the PFS's parallel rate (16 threads), stage,
# clairvoyant with the order given, first-touch and the /dev/shm lower bound,
# with the data fitting the RAM tier and with tiers of half the data; writes
# bench/results/pfsbound.{json,md}.  About 25 minutes on 2 cores.
# bench-pfs-quick is the same on 2,000 files in about 35 s
# (bench/results/quick/pfsbound.*).
.PHONY: bench-pfs bench-pfs-quick
bench-pfs: build bench-deps
	$(PY) -m bench.pfsbound $(PFS_ARGS)

bench-pfs-quick: build bench-deps
	$(PY) -m bench.pfsbound --quick $(PFS_ARGS)

# Scale benchmark on ImageNet-1k's shape (1.28 M files of 1 KiB in 1,000 class
# directories, generated once under $TMPDIR/tiering-scale, about 1.3 GB):
# tier-run start-up, peak RSS and CPU, `tiering plan`, events at full speed and
# copies against find, cp -r and tar | tar, side by side; writes
# bench/results/scale.{json,md}.  About an hour on 2 cores.  bench-scale-quick
# is the same on 100 k files (bench/results/quick/scale.{json,md}).
.PHONY: bench-scale bench-scale-quick
bench-scale: build
	$(PY) -m bench.scale $(SCALE_ARGS)

bench-scale-quick: build
	$(PY) -m bench.scale --files 100000 --paced-seconds 10 --large 8x64 --out bench/results/quick $(SCALE_ARGS)

# Shim microbenchmark: ns per open+close with and without the shim (outside the
# roots, catalogued miss, redirected, relative path; indexes of 1k and 1M
# entries) and read throughput; writes bench/results/micro.{json,md}.
bench-micro: build
	$(PY) -m bench.micro $(MICRO_ARGS)

# What publishing a small copy costs each file system: the final name made
# directly (cp -r), a staging directory and a rename (tiering), a temporary name
# beside the final one, O_TMPFILE and linkat; on the temporary directory's disk,
# /dev/shm and (as root) ext4 in memory; writes bench/results/publish.{json,md}.
.PHONY: bench-publish
bench-publish: deps
	$(PY) -m bench.publish $(PUBLISH_ARGS)

# Multi-node benchmark: a torchrun gloo training across 1, 2 and 3 emulated
# nodes (network namespaces, as root) reading one slowfs PFS, a data set twice
# one node's tiers; the PFS directly, a clairvoyant tier-run per node without
# peers, and with the peer tier; writes bench/results/multinode.{json,md,png}.
# About 10 minutes on 2 cores.
bench-multinode: install bench-deps
	$(PY) -m bench.multinode $(MULTINODE_ARGS)

# FUSE 3 for the emulated PFS (bench/slowfs): as root, installs fuse3 and
# libfuse3-dev with apt-get when missing; otherwise says what to install.
# Then builds bench/slowfs/slowfs.
bench-deps:
	@if ! pkg-config --exists fuse3 2>/dev/null || ! command -v fusermount3 >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "bench-deps: installing fuse3 and libfuse3-dev with apt-get"; \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y fuse3 libfuse3-dev pkg-config || exit 1; \
	  else \
	    echo "bench-deps: FUSE 3 is missing; run: sudo apt-get update && sudo apt-get install -y fuse3 libfuse3-dev pkg-config" >&2; \
	    exit 1; \
	  fi; \
	fi
	$(MAKE) -C bench/slowfs

# Accuracy of partial local shuffling: a small CNN (with and without BatchNorm)
# on scikit-learn's digits, classes sorted, 16 ranks (emulated, checked against
# a real gloo job), DistributedSampler and PLS at Q = 0, 0.1, 0.3, 1, 5 seeds;
# writes bench/results/pls-accuracy.{json,md,png}.  About 8 minutes on 2 cores
# (PLS_ACCURACY_ARGS=--quick: 2 seeds, 8 epochs, in bench/results/quick, 1.5 min).
.PHONY: bench-pls-accuracy
bench-pls-accuracy: install
	$(PY) -m bench.pls_accuracy $(PLS_ACCURACY_ARGS)
