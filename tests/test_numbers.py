"""The one check of numeric options (vitkit.util.numbers): its words, and that no other place
writes them by hand."""

import math
import re
from pathlib import Path

import pytest

from vitkit.errors import ConfigError, ModelError
from vitkit.recipe import DEFAULT_BATCH_SIZE, DEFAULT_LR, plan_run
from vitkit.train.config import TrainConfig
from vitkit.util.numbers import check_counts, check_number

SRC = Path(__file__).resolve().parents[1] / "src" / "vitkit"


@pytest.mark.parametrize("value, options, words", [
    (0, {}, "--n must be 1 or more, got 0"),
    (-1, dict(least=0, zero_means="no cap"), "--n must be 0 (no cap) or more, got -1"),
    (-2, dict(least=0), "--n must be 0 or more, got -2"),
    (math.nan, {}, "--n must be 1 or more, got nan"),
    (math.inf, dict(positive=True), "--n must be a positive finite number, got inf"),
    (0.0, dict(positive=True), "--n must be a positive finite number, got 0.0"),
    (2e6, dict(positive=True, below=1e6),
     "--n must be a positive finite number below 1,000,000, got 2000000.0"),
    (True, {}, "--n must be 1 or more, got True"),
    ("3", {}, "--n must be 1 or more, got 3"),
])
def test_a_bad_number_is_named_with_what_was_expected(value, options, words):
    with pytest.raises(ConfigError) as caught:
        check_number("--n", value, **options)
    assert str(caught.value) == words


def test_good_numbers_pass_and_the_error_type_is_the_callers():
    assert check_number("--n", 1) == 1 and check_number("--n", 0, least=0) == 0
    assert check_number("--lr", 1e-9, positive=True) == 1e-9
    check_counts([("batch_size", 4), ("steps", 1)])
    with pytest.raises(ModelError, match="^depth must be 1 or more, got 0$"):
        check_counts([("depth", 0)], cli=False, error=ModelError)
    with pytest.raises(ConfigError, match="^--batch-size must be 1 or more, got 0$"):
        check_counts([("steps", 3), ("batch_size", 0)])


def test_no_other_module_writes_the_check_by_hand():
    """'must be 1 or more' and its kin are said by vitkit.util.numbers alone."""
    hand = re.compile(r"must be (1|0|\{least\}) or more|must not be negative|"
                      r"must be a positive (finite )?number")
    found = [f"{p.relative_to(SRC)}:{n}" for p in SRC.rglob("*.py")
             if p.name != "numbers.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if hand.search(line)]
    assert not found, found


def test_the_training_defaults_are_read_from_one_place():
    """The trainer's config, the plan of a config that leaves them out and the doctor's
    reading of it all use recipe.DEFAULT_BATCH_SIZE and DEFAULT_LR."""
    cfg = TrainConfig()
    assert (cfg.batch_size, cfg.lr) == (DEFAULT_BATCH_SIZE, DEFAULT_LR)
    plan = plan_run({}, 51_200, 10)
    assert plan.global_batch == DEFAULT_BATCH_SIZE
    assert plan.lr == pytest.approx(DEFAULT_LR * DEFAULT_BATCH_SIZE / 512)
    restated = re.compile(r"get\(\"(batch_size\", 64|lr\", 5e-4)|"
                          r"batch_size: int = 64  # per process|"
                          r"lr: float = 5e-4")
    found = [f"{p.relative_to(SRC)}:{n}" for p in SRC.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if restated.search(line)]
    assert not found, found
