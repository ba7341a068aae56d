# Crafter VLM Dataset Studio. `make demo` and `make test` work on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HASH := $(shell sha256sum pyproject.toml | cut -c1-12)
BASE_STAMP := $(VENV)/.installed-base-$(HASH)
DEV_STAMP := $(VENV)/.installed-dev-$(HASH)

TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/studio
TEST_BROKER_URL ?= redis://127.0.0.1:6379/0

.PHONY: demo manage test install services chromium lint bench bench-scale clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(BASE_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e .
	touch $@

# The tests train a tiny open model (the `trl` provider): the train extra too.
$(DEV_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e '.[dev,train]'
	touch $@ $(BASE_STAMP)

install: $(DEV_STAMP)

demo: $(BASE_STAMP)
	@mkdir -p var
	@DEBUG=1 $(PY) manage.py migrate --noinput -v0
	@DEBUG=1 $(PY) manage.py demo_setup
	@DEBUG=1 exec $(PY) -m studio.demo

# Any manage.py command beside `make demo`, on its settings (DEBUG=1: the database, broker and
# secret key under var/), e.g. make manage ARGS="rollout --policy scripted --seeds 0-3 --inline".
# Migrates first only when the demo's SQLite file does not exist yet.
manage: $(BASE_STAMP)
	@mkdir -p var
	@test -n "$$DATABASE_URL" || test -e "$${STUDIO_VAR_DIR:-var}/studio.sqlite3" || \
	  DEBUG=1 $(PY) manage.py migrate --noinput -v0
	@DEBUG=1 $(PY) manage.py $(ARGS)

services:
	@pg_isready -q -h 127.0.0.1 -p 5432 || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start
	@for i in $$(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
	@for i in $$(seq 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done

chromium:
	@test -x /usr/bin/chromium || (DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

test: $(DEV_STAMP) services chromium
	$(VENV)/bin/ruff check .
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) SECRET_KEY=test-only \
	  STUDIO_MEDIA_ROOT=$(CURDIR)/var/test-media $(VENV)/bin/pytest -q

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# scale.py is apart: 10 million turns take a while to seed (`make bench-scale`).
bench: $(DEV_STAMP) services
	for script in benchmarks/*.py; do \
	  case $$script in */common.py|*/scale.py) continue;; esac; \
	  DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) SECRET_KEY=bench \
	  $(PY) $$script || exit 1; done

bench-scale: $(DEV_STAMP) services
	SECRET_KEY=bench $(PY) benchmarks/scale.py

clean:
	rm -rf var .pytest_cache
