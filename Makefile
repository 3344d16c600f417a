# One command each on a fresh machine: the targets set up what they need themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1

.PHONY: test test-timing test-other-botocore demo bench lint synth clean consumer-image consumer-image-engine \
	emr-env browser

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

$(NODE_STAMP): package.json
	npm install --no-audit --no-fund --loglevel=error
	touch $@

# Arguments for pytest: make test ARGS="tests/unit -x -q" (pytest's own PYTEST_ADDOPTS works too).
ARGS ?=
# The suite waits on processes, queues and timers far more than it computes: pytest-xdist
# workers overlap the waits (4 on 2 cores: 7.5 min instead of 19). Tests that share a session
# fixture (the CDK synths, Chromium, podman, Spark) stay on one worker (tests/xdist_groups.py).
# TEST_WORKERS=0 runs every test in this process.
TEST_WORKERS ?= 4

test: $(STAMP) $(NODE_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(ARGS)

# The timing-dependent tests RUNS times (default 20), every core kept busy by a spinning
# process beside the workers (tests/stress.py prints JSON: each failing test and in how many runs).
RUNS ?= 20
TIMING_TESTS := tests/unit/test_prefetch.py tests/unit/test_consumer.py \
	tests/integration/test_prefetch.py tests/integration/test_leases.py \
	tests/integration/test_consumer_process.py tests/integration/test_consumer_runtime.py \
	tests/integration/test_outcome_table.py tests/integration/test_retry_budget.py \
	tests/integration/test_unrecoverable.py tests/integration/test_results.py \
	tests/integration/test_status_sigterm.py tests/integration/test_status_writer.py \
	tests/integration/test_cli_errors.py tests/integration/test_job_failures.py \
	tests/integration/test_task_protection.py tests/integration/test_dlq_concurrent_reads.py \
	tests/integration/test_dedup.py tests/integration/test_schedules.py \
	tests/integration/test_http_api_deadline.py tests/integration/test_http_workflows.py \
	tests/integration/test_job_ids.py tests/integration/test_cancel_races.py \
	tests/integration/test_status_tracking.py tests/integration/test_refused_entries.py \
	tests/reliability/test_kill.py \
	tests/reliability/test_controls.py \
	tests/integration/test_flow_control.py \
	tests/integration/test_workflows.py tests/reliability/test_workflow_kills.py \
	tests/integration/test_dashboard_pages.py tests/integration/test_dashboard_auth.py \
	tests/integration/test_dashboard_workflows_browser.py \
	tests/integration/test_dashboard_limits_browser.py

test-timing: $(STAMP) $(NODE_STAMP)
	$(BIN)/python -m tests.stress --runs $(RUNS) -- -n $(TEST_WORKERS) --dist loadgroup $(TIMING_TESTS)

# The retry-budget tests and the integration tests that exercise the wire (producer, offload,
# consumer, requeue) again on another botocore than the pinned one: boto3 allows any 1.44.x, and
# the Lambda runtime brings its own (the bundles ship none). A venv of its own, .venv-botocore:
# requirements.txt but for the CDK, Spark, browser and lint packages, with OTHER_BOTOCORE.
# CI runs it after `make test`.
OTHER_BOTOCORE ?= 1.44.8
OTHER_VENV := .venv-botocore
OTHER_STAMP := $(OTHER_VENV)/.installed-$(OTHER_BOTOCORE)
OTHER_BOTOCORE_LEFT_OUT := botocore|aws-cdk-lib|constructs|cdk-nag|cfn-lint|pyspark|selenium|ruff|mypy|vermin
OTHER_BOTOCORE_TESTS := tests/integration/test_retry_budget.py tests/unit/test_bounded_retries.py \
	tests/integration/test_producer.py tests/integration/test_push_partial.py \
	tests/integration/test_consumer_runtime.py tests/integration/test_requeue.py

$(OTHER_STAMP): requirements.txt pyproject.toml
	test -x $(OTHER_VENV)/bin/python || $(PYTHON) -m venv $(OTHER_VENV)
	$(OTHER_VENV)/bin/pip install --quiet --upgrade pip
	grep -vE '^($(OTHER_BOTOCORE_LEFT_OUT))(\[.*\])?==' requirements.txt > $(OTHER_VENV)/requirements.txt
	$(OTHER_VENV)/bin/pip install --quiet -r $(OTHER_VENV)/requirements.txt botocore==$(OTHER_BOTOCORE)
	$(OTHER_VENV)/bin/pip install --quiet --no-deps -e .
	rm -f $(OTHER_VENV)/.installed-*
	touch $@

test-other-botocore: $(OTHER_STAMP)
	$(OTHER_VENV)/bin/python -c 'import botocore, sys; sys.exit(botocore.__version__ != "$(OTHER_BOTOCORE)")'
	$(OTHER_VENV)/bin/python -m pytest $(OTHER_BOTOCORE_TESTS) $(ARGS)

demo: $(STAMP) $(NODE_STAMP)
	$(BIN)/python -m examples.demo

bench: $(STAMP) $(NODE_STAMP)
	$(BIN)/pip install --quiet -r bench/requirements.txt
	$(BIN)/python bench/run_all.py
	$(BIN)/python bench/figures.py

lint: $(STAMP)
	$(BIN)/ruff check messenger stacks lambdas spark_jobs examples tests bench app.py
	$(BIN)/mypy messenger --ignore-missing-imports

synth: $(STAMP) $(NODE_STAMP)
	npx cdk synth --quiet

# The consumer image built with podman as `cdk deploy` builds it (consumer_image/README.md):
# APP_DIR=<folder> for a team's own code. The engine and base images are set up once (root).
consumer-image-engine:
	consumer_image/build_local.sh --setup

# Headless Chromium for the dashboard's browser tests (Debian's packages; as root, ~1 min once).
# Without it those tests skip (fail with MESSENGER_REQUIRE_BROWSER=1).
browser:
	test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		chromium chromium-driver >/dev/null; }

consumer-image: $(STAMP)
	consumer_image/build_local.sh $(if $(APP_DIR),--app-dir $(APP_DIR)) $(if $(TAG),--tag $(TAG))

# EMR nodes' interpreters for the EMR tests (requirements-emr.txt): Python 3.11 with pyspark 3.5.5,
# and Python 3.9 with boto3 only. Without them those tests skip (fail with
# MESSENGER_REQUIRE_EMR_ENV=1).
PYTHON39 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.9*/bin/python3.9) \
	$(shell command -v python3.9 2>/dev/null))
PYTHON311 ?= $(firstword $(shell command -v python3.11 2>/dev/null) $(PYTHON))
EMR_STAMPS := .venv-emr/.installed .venv-emr39/.installed

.venv-emr/.installed: requirements-emr.txt
	test -x .venv-emr/bin/python || $(PYTHON311) -m venv .venv-emr
	.venv-emr/bin/pip install --quiet -r requirements-emr.txt
	touch $@

.venv-emr39/.installed: requirements-emr.txt
	test -n "$(PYTHON39)" || { echo "python3.9 not found: set PYTHON39=" >&2; exit 1; }
	test -x .venv-emr39/bin/python || $(PYTHON39) -m venv .venv-emr39
	.venv-emr39/bin/pip install --quiet -r requirements-emr.txt
	touch $@

emr-env: $(EMR_STAMPS)

clean:
	rm -rf $(VENV) .venv-emr .venv-emr39 .venv-botocore node_modules cdk.out .pytest_cache
