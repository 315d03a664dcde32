# Everything runs inside .venv, which these targets create and fill themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Distributions of this repository, installed editable, in dependency order.
PACKAGES := -e ./core -e ./backends/heap -e ./backends/rocksdb -e ./backends/lmdb -e "./storage[s3,hdfs]" -e ./examples/statekit-sqlite \
	-e ./examples/urlcount -e ".[test]"
HYPOTHESIS_PROFILE ?= ci
# Test processes (pytest-xdist); a test file stays in one process, so its module fixtures start once.
# Much of a run waits on JVMs, child processes and servers: on two cores a third process fills those
# waits (the suite 797 s with three against 884 s with two, 2026-12-02, the same tree and machine).
PYTEST_WORKERS ?= 3
# Every distribution of this repository, for `make wheels`; the umbrella (.) last.
DISTRIBUTIONS := ./core ./backends/heap ./backends/rocksdb ./backends/lmdb ./storage ./examples/statekit-sqlite \
	./examples/urlcount .
WHEELHOUSE ?= wheelhouse

.PHONY: install wheels test lint typecheck pytest bench demo clean
# Spark's Python workers must run this environment's interpreter.
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1

$(VENV)/.installed: pyproject.toml core/pyproject.toml core/hatch_build.py backends/heap/pyproject.toml backends/rocksdb/pyproject.toml \
		backends/lmdb/pyproject.toml storage/pyproject.toml \
		examples/statekit-sqlite/pyproject.toml examples/urlcount/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PACKAGES)
	# The JVM helper that gives Spark tasks their preferred executor: a wheel ships it compiled; this
	# editable install compiles it into core/build/jvm (its own tree, no shared cache), here or on the
	# first query. Needs a JDK's javac; without one, queries run without task locality and say why.
	-$(PY) -c "import pyspark; from statekit.spark._jvm import helper_jar; print(helper_jar(pyspark.__version__).jar)"
	touch $@

# Bytecode of this repository's own modules, written ahead: its distributions are installed editable, so
# pip compiled none of them, and with PYTHONDONTWRITEBYTECODE set (as on this project's machines) Python
# caches none, so every process compiled statekit afresh: each Spark Python worker, on the first batch's
# critical path (0.6-0.7 s of a worker's 1.8-2.0 s start; docs/spark.md#compiled-ahead). Python still
# checks each file against its source: an edited module is compiled again, in memory.
install: $(VENV)/.installed
	$(PY) -m compileall -q $(addsuffix /src,$(filter-out .,$(DISTRIBUTIONS)))

## A wheel of every distribution into $(WHEELHOUSE) (statekit is not on PyPI); then, in any environment:
##   pip install --find-links wheelhouse "statekit[rocksdb,spark]"
## statekit-core's wheel ships the JVM locality helper, compiled by its build hook against the PySpark of
## its isolated build environment: building needs a JDK 17+ (STATEKIT_BUILD_WITHOUT_JDK=1 builds a wheel
## without the helper, whose Spark queries then run without task locality).
## It also writes $(WHEELHOUSE)/constraints.txt, every statekit distribution pinned to the version built:
## `pip install -c wheelhouse/constraints.txt ...` then never takes one of those names from an index
## (install them with --no-index --find-links wheelhouse first; docs/writing-a-backend.md).
wheels:
	rm -f $(WHEELHOUSE)/statekit*.whl
	$(PYTHON) -m pip wheel -q --no-deps -w $(WHEELHOUSE) $(DISTRIBUTIONS)
	@for w in $(WHEELHOUSE)/statekit*.whl; do n=$${w##*/}; echo "$$(echo $${n%%-*} | tr _ -)==$$(echo $$n | cut -d- -f2)"; done | sort > $(WHEELHOUSE)/constraints.txt
	@ls -1 $(WHEELHOUSE)/statekit*.whl $(WHEELHOUSE)/constraints.txt

## The whole test suite: lint, types, then every test.
test: lint typecheck pytest

lint: install
	$(VENV)/bin/ruff check core backends storage examples tests bench conftest.py
	# The layers and no-circle contracts of pyproject.toml's [tool.importlinter]; no cache in the tree.
	$(VENV)/bin/lint-imports --no-cache

typecheck: install
	$(VENV)/bin/mypy --strict -p statekit -p statekit_spark_daemon -p statekit_heap -p statekit_rocksdb -p statekit_lmdb -p statekit_storage -p statekit_sqlite -p statekit_urlcount

pytest: install
	$(PY) -m pytest -q -p no:cacheprovider --hypothesis-profile=$(HYPOTHESIS_PROFILE) --durations=25 \
		-n $(PYTEST_WORKERS) --dist loadfile

## Benchmarks print ratios against a baseline measured in the same run.
bench: install
	$(PY) bench/bench_heap_value_state.py
	$(PY) bench/bench_snapshot_restore.py
	cd bench && ../$(PY) bench_rocksdb.py
	cd bench && ../$(PY) bench_lmdb.py
	$(PY) bench/bench_state_reader.py
	cd bench && ../$(PY) bench_state_migration.py
	$(PY) bench/bench_spark_urlcount.py

## The main job: the URL-count demo on Spark with the embedded defaults.
demo: install
	$(VENV)/bin/statekit-urlcount demo

clean:
	rm -rf $(VENV)
