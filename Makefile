# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv on first use,
# installing vitkit with every extra at the exact versions of constraints.txt.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint docs clean

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[all]'
	# LXT, the reference AttnLRP the tests compare with, without its dependencies (bitsandbytes,
	# accelerate, zennit: the rules the tests use need torch alone)
	$(PY) -m pip install --quiet --no-deps -c constraints.txt lxt
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/vitkit demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

# The documentation site (MkDocs, material theme, API reference from the docstrings) in site/.
# --strict: a broken link or a missing docstring reference is an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

test: $(STAMP) lint docs
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build site src/*.egg-info
