"""The explorer's parts without HTTP: the query parser every route reads its parameters with
(good values, defaults, and each refusal's exact message, NaN and infinities included) and the
LRU cache (eviction by entries and by bytes, the newest entry always kept, sizes counted)."""

import numpy as np
import pytest
import torch

from vitkit.errors import VitkitError
from vitkit.web.cache import LRU, cache_budget, nbytes
from vitkit.web.query import BadQuery, Query

FUSIONS = ("mean", "max", "min")


# ------------------------------------------------------------------------------ query
def test_query_reads_values_and_defaults():
    q = Query({"layer": "-1", "steps": "64", "residual": "0.25", "discard": "0", "fusion": "max",
               "image": "abc", "empty": "", "token": "secret"})
    assert q.integer("layer") == -1 and q.integer("steps", 16, lo=2, hi=64) == 64
    assert q.integer("absent") is None and q.integer("empty", 3) == 3
    assert q.number("residual", 0.5, lo=0, hi=1) == 0.25
    assert q.number("discard", 0.5, lo=0, hi=1, hi_open=True) == 0.0
    assert q.number("absent", 0.5, lo=0, hi=1) == 0.5 and q.number("layer", 0.0) == -1.0
    assert q.choice("fusion", FUSIONS, "mean") == "max"
    assert q.choice("empty", FUSIONS, "min") == "min"
    assert q.text("image") == "abc" and q.text("empty", "rollout") == "rollout"
    assert q.text("absent") is None
    assert "token" not in q.settings() and q.settings()["fusion"] == "max"


@pytest.mark.parametrize("params,read,message", [
    ({"steps": "x"}, lambda q: q.integer("steps", 16), "steps must be a whole number, got 'x'"),
    ({"steps": "1.5"}, lambda q: q.integer("steps"), "steps must be a whole number, got '1.5'"),
    ({"steps": "1"}, lambda q: q.integer("steps", 16, lo=2, hi=64), "steps must be 2..64, got 1"),
    ({"steps": "65"}, lambda q: q.integer("steps", lo=2, hi=64), "steps must be 2..64, got 65"),
    ({"id": "two"}, lambda q: q.integer("id", label="sample id"),
     "sample id must be a whole number, got 'two'"),
    ({}, lambda q: q.integer("query", missing="which token's row"),
     "query is missing: which token's row"),
    ({"image": ""}, lambda q: q.text("image", missing="send an image first"),
     "image is missing: send an image first"),
    ({"discard": "lots"}, lambda q: q.number("discard", 0.0),
     "discard must be a number, got 'lots'"),
    ({"r": "nan"}, lambda q: q.number("r", 0.0), "r must be a finite number, got nan"),
    ({"r": "inf"}, lambda q: q.number("r", 0.0), "r must be a finite number, got inf"),
    ({"r": "-Infinity"}, lambda q: q.number("r", 0.0), "r must be a finite number, got -Infinity"),
    ({"r": "1e999"}, lambda q: q.number("r", 0.0), "r must be a finite number, got 1e999"),
    ({"residual": "NaN"}, lambda q: q.number("residual", 0.5, lo=0, hi=1),
     "residual must be in [0, 1], got NaN"),
    ({"residual": "inf"}, lambda q: q.number("residual", 0.5, lo=0),
     "residual must be in [0, inf), got inf"),
    ({"residual": "2"}, lambda q: q.number("residual", 0.5, lo=0, hi=1),
     "residual must be in [0, 1], got 2"),
    ({"discard": "1"}, lambda q: q.number("discard", 0.0, lo=0, hi=1, hi_open=True, what="a ratio"),
     "discard must be a ratio in [0, 1), got 1"),
    ({"fusion": "median"}, lambda q: q.choice("fusion", FUSIONS, "mean"),
     "fusion must be one of mean, max, min, got 'median'"),
    ({}, lambda q: q.choice("fusion", FUSIONS), "fusion must be one of mean, max, min, got None"),
])
def test_query_refusals_name_the_parameter(params, read, message):
    with pytest.raises(BadQuery) as refused:
        read(Query(params))
    assert str(refused.value) == message
    assert isinstance(refused.value, VitkitError)  # the app answers it with 400


# ------------------------------------------------------------------------------ cache
def test_lru_evicts_the_least_recently_used_past_its_entries():
    cache = LRU(max_bytes=10**6, max_entries=3)
    for key in "abc":
        cache.put(key, key.upper(), 10)
    assert cache.get("a") == "A"  # now the most recently used: b is the oldest
    cache.put("d", "D", 10)
    assert cache.get("b") is None and [cache.get(k) for k in "acd"] == ["A", "C", "D"]
    assert len(cache) == 3 and cache.bytes == 30
    assert cache.get(("never", "stored")) is None


def test_lru_evicts_past_its_bytes_and_keeps_the_newest():
    cache = LRU(max_bytes=100, max_entries=100)
    cache.put("a", 1, 40)
    cache.put("b", 2, 40)
    cache.put("c", 3, 40)  # 120 bytes > 100: a goes
    assert cache.get("a") is None and cache.bytes == 80 and len(cache) == 2
    cache.put("b", 22, 10)  # a key stored again counts its new size only
    assert cache.get("b") == 22 and cache.bytes == 50
    cache.put("huge", 0, 1000)  # larger than the whole budget: alone, but kept
    assert len(cache) == 1 and cache.get("huge") == 0 and cache.bytes == 1000
    cache.put("next", 0, 1)  # and the next entry evicts it
    assert cache.get("huge") is None and cache.bytes == 1


def test_sizes_and_the_budget(vitkit_log):
    assert nbytes(torch.zeros(2, 3)) == 24 and nbytes(np.zeros(5, np.uint8)) == 5
    assert nbytes({"a": torch.zeros(4), "b": [np.zeros(2)]}) == 16 + (16 + 1024) + 1024
    assert nbytes("anything else") == 1024
    assert cache_budget(1, 1000) == 2**20 and not vitkit_log.text
    assert cache_budget(1, 2**20) == 3 * 2**20  # three images' maps, not one MB
    assert "cannot hold one image's maps" in vitkit_log.text
