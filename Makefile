# One command each on a fresh machine: the targets set up what they need themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1

.PHONY: test demo bench lint synth clean consumer-image consumer-image-engine

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

$(NODE_STAMP): package.json
	npm install --no-audit --no-fund --loglevel=error
	touch $@

test: $(STAMP) $(NODE_STAMP)
	$(BIN)/python -m pytest

demo: $(STAMP) $(NODE_STAMP)
	$(BIN)/python -m examples.demo

bench: $(STAMP) $(NODE_STAMP)
	$(BIN)/pip install --quiet -r bench/requirements.txt
	$(BIN)/python bench/run_all.py

lint: $(STAMP)
	$(BIN)/ruff check messenger stacks lambdas spark_jobs examples tests bench app.py
	$(BIN)/mypy messenger --ignore-missing-imports

synth: $(STAMP) $(NODE_STAMP)
	npx cdk synth --quiet

# The consumer image built with podman as `cdk deploy` builds it (consumer_image/README.md):
# APP_DIR=<folder> for a team's own code. The engine and base images are set up once (root).
consumer-image-engine:
	consumer_image/build_local.sh --setup

consumer-image: $(STAMP)
	consumer_image/build_local.sh $(if $(APP_DIR),--app-dir $(APP_DIR)) $(if $(TAG),--tag $(TAG))

clean:
	rm -rf $(VENV) node_modules cdk.out .pytest_cache
