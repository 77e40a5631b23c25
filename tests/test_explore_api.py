"""The explorer's HTTP API: every answer against a direct library call, every bad input a 4xx
with a clear message (and the server keeps serving), the guard (token, Host, Origin, body cap,
headers), the bounded cache, and a burst of concurrent requests that must not mix."""

import base64
import concurrent.futures
import io
import struct
import zlib

import httpx
import numpy as np
import pytest
import torch
from conftest import small_vit
from fastapi.testclient import TestClient
from live import TOKEN, serve
from PIL import Image

from vitkit import explain
from vitkit.data.images import preprocess
from vitkit.explain import causal, dense, stats
from vitkit.explain.methods import METHODS
from vitkit.web.app import allowed_hosts, create_app
from vitkit.web.samples import sample_table
from vitkit.web.session import Explorer

BASE = "http://127.0.0.1:8765"
AUTH = {"X-Vitkit-Token": TOKEN}


def png(seed: int = 0, size=(40, 40)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def decode(enc) -> np.ndarray:
    return np.frombuffer(base64.b64decode(enc["b64"]), "<f4").reshape(enc["shape"])


def model_of(**overrides):
    model = small_vit(scale=0.3, **{"num_classes": 7, **overrides})
    model.cfg.extra["class_names"] = [f"c{i}" for i in range(model.cfg.num_classes)]
    return model


@pytest.fixture
def explorer():
    return Explorer(model_of())


def client_for(explorer, **options) -> TestClient:
    app = create_app(explorer, token=TOKEN, host="127.0.0.1", port=8765,
                     samples=sample_table(), **options)
    return TestClient(app, base_url=BASE, headers=AUTH)


@pytest.fixture
def client(explorer):
    return client_for(explorer)


def upload(client, data=None) -> dict:
    r = client.post("/api/image", content=data if data is not None else png())
    assert r.status_code == 200, r.text
    return r.json()


def direct(model, data: bytes):
    """What the library gives for these image bytes, without the web layer."""
    x, _ = preprocess(Image.open(io.BytesIO(data)).convert("RGB"), (32, 32))
    with torch.no_grad():
        logits, maps = model(x[None], return_attn=True)
    return x[None], logits, maps


# ------------------------------------------------------------------------- the answers
def test_first_view_matches_the_library(client, explorer):
    data = png(3)
    v = upload(client, data)
    x, logits, maps = direct(explorer.model, data)
    probs = logits[0].softmax(-1)
    assert [t["index"] for t in v["top"]] == probs.topk(5).indices.tolist()
    assert v["top"][0]["name"] == f"c{int(probs.argmax())}"
    np.testing.assert_allclose([t["prob"] for t in v["top"]], probs.topk(5).values, rtol=1e-5)
    np.testing.assert_allclose(decode(v["heads"]), explain.readout_attention(maps)[0],
                               rtol=1e-5, atol=1e-7)
    pic = np.frombuffer(base64.b64decode(v["picture"]["b64"]), np.uint8)
    assert v["picture"]["shape"] == [32, 32, 3] and pic.size == 32 * 32 * 3


def test_token_rows_methods_stats_and_causal_match_the_library(client, explorer):
    data = png(4)
    image = upload(client, data)["image"]
    x, logits, maps = direct(explorer.model, data)
    r = client.get("/api/token", params=dict(image=image, query=9, layer=1, head=2)).json()
    np.testing.assert_allclose(decode(r["row"]), explain.token_attention(maps, 9, 1, 2)[0],
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(decode(r["rollout"]), explain.attention_rollout(maps)[0, 9],
                               rtol=1e-5, atol=1e-7)
    r = client.get("/api/token", params=dict(image=image, query=0, layer=2, head="max")).json()
    np.testing.assert_allclose(decode(r["row"]), explain.token_attention(maps, 0, 2, "max")[0],
                               rtol=1e-5, atol=1e-7)

    for method, extra in [("rollout", dict(residual=0.3, discard=0.5, fusion="max")),
                          ("cls", dict(layer=1, head="min")), ("chefer", dict(target=2)),
                          ("grad-rollout", dict(target=5)), ("gradcam", {})]:
        r = client.get("/api/method", params=dict(image=image, method=method, **extra)).json()
        want = explain.explain_map(
            explorer.model, x, method, target=extra.get("target"),
            layer=extra.get("layer", -1), head=extra.get("head", "mean"),
            residual=extra.get("residual", 0.5), discard_ratio=extra.get("discard", 0.0),
            head_fusion=extra.get("fusion", "mean"))
        np.testing.assert_allclose(decode(r["map"]), want.map[0], rtol=1e-4, atol=1e-6)
        gradients = METHODS[method].gradients  # the class-agnostic maps name no class
        assert r["target"] == (int(want.target[0]) if gradients else None)
        assert (r["target_name"] is None) == (not gradients)

    s = client.get("/api/stats", params=dict(image=image)).json()
    np.testing.assert_allclose(decode(s["entropy"]), stats.attention_entropy(maps), rtol=1e-5)
    np.testing.assert_allclose(decode(s["distance"]),
                               stats.mean_attention_distance(maps, (8, 8), 4, 1), rtol=1e-5)
    np.testing.assert_allclose(decode(s["norms"]), stats.token_norms(explorer.model, x)[:, 0],
                               rtol=1e-5)

    c = client.get("/api/causal", params=dict(image=image, target=3, measure="prob")).json()
    estimate, _ = causal.head_importance_estimate(explorer.model, x, 3, "prob")
    assert c["importance_kind"] == "estimate"  # shown at once, labelled as the linear estimate
    np.testing.assert_allclose(decode(c["importance"]), estimate[0], rtol=1e-4, atol=1e-6)
    exact = client.get("/api/causal", params=dict(image=image, target=3, measure="prob",
                                                  exact=1)).json()
    drops, _ = causal.head_importance(explorer.model, x, 3, "prob")
    assert exact["importance_kind"] == "exact"
    np.testing.assert_allclose(decode(exact["importance"]), drops[0], rtol=1e-4, atol=1e-6)
    # the page draws the server's rank correlation; scipy's Spearman is the reference
    from scipy.stats import spearmanr

    rho = spearmanr(drops[0].flatten().numpy(), estimate[0].flatten().numpy()).statistic
    assert exact["correlation_with_estimate"] == pytest.approx(rho, abs=1e-5)
    lens = causal.logit_lens(explorer.model, x)[:, 0].softmax(-1)
    np.testing.assert_allclose(c["lens_prob"], lens[:, 3], rtol=1e-5)
    assert c["lens_top"] == lens.argmax(-1).tolist()


def test_faithfulness_curves_against_a_random_map(client, explorer):
    data = png(5)
    image = upload(client, data)["image"]
    r = client.get("/api/faithfulness", params=dict(image=image, method="rollout",
                                                    steps=8)).json()
    assert r["rows"] == ["map", "random"] and len(r["fractions"]) == 9
    x, logits, maps = direct(explorer.model, data)
    from vitkit.explain.perturb import random_maps

    m = explain.explain_map(explorer.model, x, "rollout").map
    cls = int(logits.argmax())
    assert r["baseline"] == "constant" and r["target"] == cls
    for row, ranking in enumerate((m, random_maps(m))):
        deletion, insertion = deletion_by_hand(explorer.model, x, ranking[0], cls, steps=8)
        np.testing.assert_allclose(r["deletion"][row], deletion, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(r["insertion"][row], insertion, rtol=1e-4, atol=1e-6)
        trapezoids = (np.sum(deletion) - (deletion[0] + deletion[-1]) / 2) / 8
        assert r["deletion_auc"][row] == pytest.approx(trapezoids, abs=1e-5)
    # the verdict rests on 20 random maps and the two sanity checks, as vitkit trust computes
    from vitkit.explain import trust

    floor = trust.random_floor(explorer.model, x, m, logits.argmax(-1), steps=8,
                               baseline="constant")
    assert r["random_maps"] == 20 and r["percentile"] == pytest.approx(floor.percentile.item())
    assert r["p_value"] == pytest.approx(floor.p_value.item())
    randomised = trust.randomisation_check(explorer.model, x, "rollout").passes
    assert r["randomisation"]["passes"] == randomised
    assert r["class_sensitivity"] == {"passes": False, "correlation": pytest.approx(1.0)}
    # rollout is the same for every class: the page is told not to trust it, and why
    assert r["verdict"]["trusted"] is False and "class sensitivity" in r["verdict"]["fails"]
    assert r["verdict"]["text"] == trust.verdict(floor.percentile.item(), randomised,
                                                 False).text


def deletion_by_hand(model, x, ranking, cls: int, steps: int):
    """Deletion and insertion written out patch by patch: the patches in the order of
    ``ranking`` (gh, gw; ties by position), after k of ``steps`` steps the first k N / steps of
    them zeroed (deletion) or the only ones kept on a zero image (insertion); the class's
    probability at each step."""
    gh, gw = ranking.shape
    ph, pw = x.shape[-2] // gh, x.shape[-1] // gw
    values = ranking.flatten().tolist()
    order = sorted(range(gh * gw), key=lambda i: -values[i])
    deletion, insertion = [], []
    for k in range(steps + 1):
        deleted, inserted = x.clone(), torch.zeros_like(x)
        for p in order[:round(k * gh * gw / steps)]:
            r, c = divmod(p, gw)
            rows, cols = slice(r * ph, (r + 1) * ph), slice(c * pw, (c + 1) * pw)
            deleted[..., rows, cols] = 0
            inserted[..., rows, cols] = x[..., rows, cols]
        with torch.no_grad():
            deletion.append(model(deleted).softmax(-1)[0, cls].item())
            insertion.append(model(inserted).softmax(-1)[0, cls].item())
    return np.array(deletion), np.array(insertion)


def test_fused_heads_samples_multipart_and_export(client, explorer):
    image = upload(client)["image"]
    view = explorer.view(image)
    r = client.get("/api/heads", params=dict(image=image, fusion="max")).json()
    np.testing.assert_allclose(decode(r["map"]), explain.readout_attention(view.maps)[0].amax(1))

    info = client.get("/api/model").json()
    digits = [s for s in info["samples"] if s["group"].startswith("cluttered digits")]
    assert len(digits) == 6
    v = client.post("/api/sample", params=dict(id=digits[0]["id"])).json()
    x0, y0, x1, y1 = v["box"]
    assert x1 - x0 == 8 and y1 - y0 == 8  # the digit's box, as the model sees the image

    files = {"file": ("whatever/../../etc/passwd.png", png(6), "image/png")}
    r = client.post("/api/image", files=files)
    assert r.status_code == 200 and r.json()["image"] == upload(client, png(6))["image"]

    r = client.get("/api/export.npz", params=dict(image=image, method="rollout"))
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    with np.load(io.BytesIO(r.content)) as npz:
        np.testing.assert_allclose(npz["attention"], np.stack([m[0] for m in view.maps]))
        np.testing.assert_allclose(npz["method_map"],
                                   explain.explain_map(explorer.model, view.x, "rollout").map[0],
                                   rtol=1e-5)
        assert npz["heads"].shape == (3, 4, 8, 8) and "rollout" in str(npz["settings"])


@pytest.mark.parametrize("overrides,unavailable,prefix", [
    (dict(pool="avg", class_token=False), {"cls", "map"}, []),
    (dict(distilled=True), {"map"}, ["[CLS]", "[DIST]"]),
    (dict(num_reg_tokens=4), {"map"}, ["[CLS]", "[REG0]", "[REG1]", "[REG2]", "[REG3]"]),
    (dict(pool="map"), {"cls"}, ["[CLS]"]),
    (dict(pool="map", class_token=False), {"cls"}, []),  # SigLIP's layout
    (dict(img_size=(32, 48)), {"map"}, ["[CLS]"]),
])
def test_every_readout_and_rectangular_inputs(overrides, unavailable, prefix):
    explorer = Explorer(model_of(**overrides))
    client = client_for(explorer)
    info = client.get("/api/model").json()
    assert set(info["unavailable"]) == unavailable and info["prefix_tokens"] == prefix
    assert all("the model" in reason for reason in info["unavailable"].values())
    v = upload(client, png(1, size=(60, 40)))
    gh, gw = explorer.grid
    assert decode(v["heads"]).shape == (3, 4, gh, gw)
    for method in info["applicable"]:
        r = client.get("/api/method", params=dict(image=v["image"], method=method))
        assert r.status_code == 200 and decode(r.json()["map"]).shape == (gh, gw), method
    for method in unavailable:
        r = client.get("/api/method", params=dict(image=v["image"], method=method))
        assert r.status_code == 400 and "does not apply" in r.json()["error"]
    last = len(prefix) + gh * gw - 1
    r = client.get("/api/token", params=dict(image=v["image"], query=last, layer=0, head=0))
    assert decode(r.json()["row"]).shape == (len(prefix) + gh * gw,)
    assert client.get("/api/causal", params=dict(image=v["image"])).status_code == 200
    r = client.get("/api/features", params=dict(image=v["image"])).json()
    assert decode(r["rgb"]).shape == (gh, gw, 3) and decode(r["foreground"]).shape == (gh, gw)
    r = client.get("/api/similar", params=dict(image=v["image"], row=gh - 1, col=gw - 1)).json()
    assert decode(r["map"]).shape == (gh, gw)
    assert decode(r["map"])[gh - 1, gw - 1] == pytest.approx(1, abs=1e-5)


# ---------------------------------------------------------------------- dense features
def test_the_features_view_and_a_patchs_similarity_match_the_library(client, explorer):
    assert client.get("/api/model").json()["features"] is None  # scikit-learn is here
    data = png(5)
    image = upload(client, data)["image"]
    x, _, _ = direct(explorer.model, data)
    tokens = dense.patch_features(explorer.model, x)[0]  # (1, 8, 8, D)
    want = dense.feature_pca(tokens)
    r = client.get("/api/features", params=dict(image=image)).json()
    np.testing.assert_allclose(decode(r["rgb"]), want.rgb[0], atol=1e-5)
    np.testing.assert_array_equal(decode(r["foreground"]) > 0, want.foreground[0])
    np.testing.assert_allclose(r["explained"], want.explained[0], rtol=1e-5)
    assert r["threshold"] == dense.THRESHOLD and r["artifacts"] == []
    for row, col in [(0, 0), (5, 3), (7, 7)]:
        s = client.get("/api/similar", params=dict(image=image, row=row, col=col)).json()
        m = decode(s["map"])
        want_map = torch.nn.functional.cosine_similarity(tokens[0, row, col], tokens[0], dim=-1)
        np.testing.assert_allclose(m, want_map, atol=1e-5)
        assert m[row, col] == pytest.approx(1, abs=1e-5) and s["hi"] == pytest.approx(1, abs=1e-5)
        assert (s["row"], s["col"]) == (row, col) and s["lo"] == pytest.approx(m.min())


def test_the_features_view_marks_a_planted_high_norm_token():
    model = model_of()
    model.pos_embed.data[0, 1 + 2 * 8 + 5] += 30.0  # patch (2, 5)
    client = client_for(Explorer(model))
    image = upload(client)["image"]
    assert client.get("/api/features", params=dict(image=image)).json()["artifacts"] == [[2, 5]]
    outliers = client.get("/api/stats", params=dict(image=image)).json()["outliers"]
    assert {"layer": 2, "token": 1 + 2 * 8 + 5} in [
        {k: o[k] for k in ("layer", "token")} for o in outliers]  # what the per-head panel says


# ------------------------------------------------------------------------- bad inputs
def truncated_png() -> bytes:
    return png(7)[:200]


def bomb_header() -> bytes:
    """A valid PNG header claiming 100,000 x 100,000 pixels, and no pixel data."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize("body,status,words", [
    (b"", 400, "is empty"),
    (b"hello, this is text", 400, "not an image"),
    (None, 400, "runcated"),  # truncated_png(): Pillow's own word, in the message
    ("bomb", 400, "too large"),
])
def test_bad_images_are_4xx_and_the_server_keeps_serving(client, body, status, words):
    data = truncated_png() if body is None else bomb_header() if body == "bomb" else body
    r = client.post("/api/image", content=data)
    assert r.status_code == status and words in r.json()["error"], r.text
    assert "Traceback" not in r.text
    upload(client)  # still serving


def test_formats_beyond_the_named_ones_are_refused(client):
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"  # Ghostscript's
    r = client.post("/api/image", content=eps)
    assert r.status_code == 400 and "not an image Pillow recognises" in r.json()["error"]


def test_an_extreme_aspect_ratio_is_refused_before_the_resize(client):
    r = client.post("/api/image", content=png(10, size=(1, 40000)))  # 32 x 1.28 M: 41 MP
    assert r.status_code == 400 and "aspect ratio" in r.json()["error"]
    r = client.post("/api/image", content=png(10, size=(1, 30000)))  # 32 x 0.96 M: 31 MP
    assert r.status_code == 400 and "30000:1, more than 20:1" in r.json()["error"]
    assert client.post("/api/image", content=png(10, size=(20, 200))).status_code == 200


def test_every_error_is_json_with_an_error_key(client):
    for r, status in ((client.get("/api/nowhere"), 404), (client.get("/api/image"), 405),
                      (client.delete("/api/model"), 405)):
        assert r.status_code == status and set(r.json()) == {"error"}, r.text


def test_a_cache_smaller_than_one_image_grows_to_hold_it(vitkit_log):
    explorer = Explorer(model_of(img_size=64), cache_mb=1)  # one view: ~3 MB of maps
    assert "cannot hold one image's maps" in vitkit_log.text
    client = client_for(explorer)
    image = upload(client)["image"]
    assert client.get("/api/method", params=dict(image=image)).status_code == 200


def test_a_checkpoint_without_a_head_shows_attention_and_refuses_classes():
    explorer = Explorer(model_of(num_classes=0))
    client = client_for(explorer)
    info = client.get("/api/model").json()
    assert info["has_classifier"] is False and info["classes"] == []
    assert set(info["unavailable"]) >= {"chefer", "gradcam", "grad-rollout"}
    v = upload(client)
    assert v["top"] == [] and decode(v["heads"]).shape == (3, 4, 8, 8)
    assert client.get("/api/method", params=dict(image=v["image"])).status_code == 200
    for path, params in (("/api/method", dict(method="chefer")), ("/api/causal", {}),
                         ("/api/faithfulness", {})):
        r = client.get(path, params=dict(image=v["image"], **params))
        assert r.status_code == 400 and "no classifier head" in r.json()["error"], path
    assert client.get("/api/stats", params=dict(image=v["image"])).status_code == 200


def test_pillow_bomb_warning_is_an_error(client, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 40x40 = 1600 > 1000: a warning
    r = client.post("/api/image", content=png(8))
    assert r.status_code == 400 and "too large to decode safely" in r.json()["error"]


def test_pixel_cap_is_configurable():
    client = client_for(Explorer(model_of(), max_pixels=1000))
    r = client.post("/api/image", content=png(9, size=(50, 50)))
    assert r.status_code == 400 and "2.5 megapixels" not in r.text and "0.001" in r.text


@pytest.mark.parametrize("path,params,status,words", [
    ("/api/token", dict(query=10_000, layer=0, head=0), 400, "token 10000 does not exist"),
    ("/api/token", dict(query=1, layer=7, head=0), 400, "layer 7 does not exist"),
    ("/api/token", dict(query=1, layer=0, head=9), 400, "head '9' does not exist"),
    ("/api/token", dict(query=1, layer=0, head="average"), 400, "mean, max, min"),
    ("/api/token", dict(layer=0, head=0), 400, "query is missing"),
    ("/api/token", dict(query="x"), 400, "query must be a whole number"),
    ("/api/method", dict(method="lime"), 400, "unknown method 'lime'"),
    ("/api/method", dict(method="chefer", target=7), 400, "class 7 does not exist"),
    ("/api/method", dict(method="rollout", target=-1), 400, "class -1 does not exist"),
    ("/api/method", dict(method="rollout", residual=2), 400, "residual must be in [0, 1]"),
    ("/api/method", dict(method="rollout", discard="lots"), 400, "discard must be a number"),
    ("/api/token", dict(query=1, discard=-0.5), 400, "discard ratio in [0, 1)"),
    ("/api/token", dict(query=1, residual="nan"), 400, "residual must be in [0, 1]"),
    ("/api/method", dict(method="rollout", fusion="median"), 400, "fusion must be one of"),
    ("/api/heads", dict(fusion="median"), 400, "fusion must be one of"),
    ("/api/causal", dict(measure="loss"), 400, "measure must be one of"),
    ("/api/faithfulness", dict(steps=1000), 400, "steps must be 2..64"),
    ("/api/method", dict(image="feedbeef"), 404, "send the image again"),
    ("/api/stats", dict(image=""), 400, "image is missing"),
    ("/api/similar", dict(row=8, col=0), 400, "outside the 8x8 patch grid: rows 0..7"),
    ("/api/similar", dict(col=0), 400, "row is missing"),
    ("/api/similar", dict(row=1, col="x"), 400, "col must be a whole number"),
    ("/api/features", dict(image="feedbeef"), 404, "send the image again"),
])
def test_bad_requests_are_4xx_with_a_message(client, path, params, status, words):
    image = upload(client)["image"]
    r = client.get(path, params={"image": image, **params})
    assert r.status_code == status, r.text
    assert words in r.json()["error"], r.json()
    assert client.get("/api/model").status_code == 200


def test_bad_sample_ids(client):
    for bad in ("999", "-1", "two", ""):
        r = client.post("/api/sample", params=dict(id=bad))
        assert r.status_code == 400 and "sample" in r.json()["error"]


# ------------------------------------------------------------------------------ guard
def test_token_is_required_everywhere_but_the_bundled_assets(explorer):
    bare = TestClient(create_app(explorer, token=TOKEN, port=8765), base_url=BASE)
    for path in ("/api/model", "/api/stats?image=x", "/"):
        r = bare.get(path)
        assert r.status_code == 403 and "no token" in r.json()["error"]
    r = bare.get("/api/model", headers={"X-Vitkit-Token": "guess"})
    assert r.status_code == 403 and "wrong token" in r.json()["error"]
    assert bare.get(f"/api/model?token={TOKEN}").status_code == 200
    assert bare.get("/", params=dict(token=TOKEN)).headers["content-type"].startswith("text/html")
    for asset in ("/explorer.js", "/explorer.css", "/favicon.svg"):
        r = bare.get(asset)
        assert r.status_code == 200 and r.headers["x-content-type-options"] == "nosniff"
    for path in ("/pyproject.toml", "/static/explorer.js", "/index.html", "/web/app.py",
                 "/%2e%2e/pyproject.toml", "/explorer.js/../pyproject.toml"):
        assert bare.get(path, params=dict(token=TOKEN)).status_code == 404, path  # no other file


def test_security_headers_and_no_cors(client):
    for r in (client.get("/api/model"), client.get("/explorer.js"),
              client.get("/api/model", headers={"Origin": "http://evil.example"}),
              client.get("/api/method?image=nope")):
        assert r.headers["content-security-policy"] == "default-src 'self'"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert not any(k.startswith("access-control-") for k in r.headers)
    r = client.options("/api/image", headers={"Origin": "http://evil.example",
                                              "Access-Control-Request-Method": "POST"})
    assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers


def test_allowed_hosts():
    assert allowed_hosts("127.0.0.1", 8765) == {"127.0.0.1:8765", "localhost:8765", "[::1]:8765"}
    assert "localhost" in allowed_hosts("localhost", 80)  # port 80: browsers omit it
    assert allowed_hosts("192.168.1.5", 9000) == {"192.168.1.5:9000"}
    assert allowed_hosts("0.0.0.0", 8765) is None  # every interface: the token alone guards


def test_host_header_is_checked_against_the_bound_address(client):
    r = client.get("/api/model", headers={"Host": "evil.example:8765"})
    assert r.status_code == 400 and "not this server's address" in r.json()["error"]
    assert client.get("/api/model", headers={"Host": "localhost:8765"}).status_code == 200
    assert client.get("/api/model", headers={"Host": "127.0.0.1:9999"}).status_code == 400


def test_posts_from_another_origin_are_refused(client):
    for origin in ("http://evil.example", "null", "http://127.0.0.1:9999",
                   BASE.replace("http://", "https://"), BASE.replace("http://", "ftp://")):
        r = client.post("/api/image", content=png(), headers={"Origin": origin})
        assert r.status_code == 403 and "another origin" in r.json()["error"]
    r = client.post("/api/image", content=png(), headers={"Origin": BASE})
    assert r.status_code == 200


def test_bodies_are_capped_before_parsing(explorer):
    client = client_for(explorer, max_body=1000)
    r = client.post("/api/image", content=png(size=(60, 60)))
    assert r.status_code == 413 and "MB allowed" in r.json()["error"]

    def chunks():  # no Content-Length: counted while read
        for _ in range(10):
            yield b"x" * 500
    r = client.post("/api/image", content=chunks())
    assert r.status_code == 413
    assert client.post("/api/image", content=png(size=(8, 8))).status_code == 200


def test_cache_is_bounded(explorer):
    small = Explorer(explorer.model, max_entries=4)
    client = client_for(small)
    ids = [upload(client, png(100 + i))["image"] for i in range(10)]
    assert len(small.cache) <= 4
    r = client.get("/api/stats", params=dict(image=ids[0]))
    assert r.status_code == 404
    assert client.get("/api/stats", params=dict(image=ids[-1])).status_code == 200

    by_bytes = Explorer(explorer.model, cache_mb=1)
    for i in range(30):
        by_bytes.add(png(200 + i))
    assert by_bytes.cache.bytes <= 2**20


def test_fifty_concurrent_requests_do_not_mix(explorer):
    images = [png(300 + i) for i in range(50)]
    with serve(explorer) as url, httpx.Client(base_url=url, headers=AUTH, timeout=120) as http:
        def one(data):
            v = http.post("/api/image", content=data).json()
            m = http.get("/api/method", params=dict(image=v["image"], method="chefer")).json()
            return v, m

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(one, images))
    for data, (v, m) in zip(images, answers, strict=True):
        x, logits, maps = direct(explorer.model, data)
        assert v["top"][0]["index"] == int(logits.argmax())
        np.testing.assert_allclose(v["top"][0]["prob"], float(logits.softmax(-1).max()),
                                   rtol=1e-5)
        np.testing.assert_allclose(decode(m["map"]),
                                   explain.explain_map(explorer.model, x, "chefer").map[0],
                                   rtol=1e-4, atol=1e-7)


def wait_for(client, job_id, states=("done", "error", "cancelled"), timeout=60.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = client.get("/api/job", params=dict(id=job_id)).json()
        if r["state"] in states:
            return r
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} still {r['state']}")


def test_jobs_start_report_progress_finish_and_equal_the_direct_answer(client, explorer):
    image = upload(client, png(7))["image"]
    params = dict(image=image, method="rollout", steps=8)
    job = client.post("/api/job", params=dict(kind="faithfulness", **params)).json()
    assert job["state"] in ("queued", "running", "done") and job["id"].startswith("j")
    done = wait_for(client, job["id"])
    assert done["state"] == "done" and done["fraction"] == 1.0
    direct_answer = client.get("/api/faithfulness", params=params).json()
    assert done["result"] == direct_answer
    job = client.post("/api/job", params=dict(kind="methods", image=image, target=4,
                                              methods="chefer,gradcam")).json()
    maps = wait_for(client, job["id"])["result"]
    assert list(maps) == ["chefer", "gradcam"]
    for name, answer in maps.items():
        assert answer == client.get("/api/method", params=dict(image=image, method=name,
                                                                 target=4)).json()
    job = client.post("/api/job", params=dict(kind="causal", image=image, target=2)).json()
    assert wait_for(client, job["id"])["result"] == client.get(
        "/api/causal", params=dict(image=image, target=2)).json()
    job = client.post("/api/job", params=dict(kind="importance", image=image, target=2)).json()
    exact = wait_for(client, job["id"])["result"]
    x, _, _ = direct(explorer.model, png(7))
    drops, _ = causal.head_importance(explorer.model, x, 2)
    np.testing.assert_allclose(decode(exact["importance"]), drops[0], rtol=1e-4, atol=1e-6)


def test_a_job_is_cancelled_and_a_newer_one_supersedes_it(explorer):
    """Cancel takes effect at the job's next step; a newer job for the same panel cancels the
    older; the progress callback carries the fraction and an ETA."""
    import threading

    gate, seen = threading.Event(), []

    def slow(progress):
        for i in range(1, 101):
            gate.wait(5)
            progress(i / 100)
            seen.append(i)
        return "finished"

    jobs = explorer.jobs
    first = jobs.submit("faithfulness", slow)
    second = jobs.submit("faithfulness", lambda progress: "newest")  # supersedes the first
    gate.set()
    import time

    end = time.monotonic() + 30
    while second.state != "done" and time.monotonic() < end:
        time.sleep(0.01)
    assert first.state == "cancelled" and second.state == "done" and second.result == "newest"
    assert len(seen) < 100

    hold = threading.Event()
    started = threading.Event()

    def waiting(progress):
        progress(0.25, {"curves": [1, 2]})  # a first part of the answer, shown at once
        started.set()
        hold.wait(10)
        progress(0.5)  # raises: cancelled meanwhile
        return "never"

    job = jobs.submit("importance", waiting)
    assert started.wait(10)
    assert job.summary()["fraction"] == 0.25 and job.summary()["eta_s"] is not None
    assert job.partial == {"curves": [1, 2]}
    jobs.cancel(job.id)
    hold.set()
    end = time.monotonic() + 10
    while job.state == "running" and time.monotonic() < end:
        time.sleep(0.01)
    assert job.state == "cancelled" and job.result is None


def test_job_errors_and_bad_job_queries(client):
    image = upload(client, png(8))["image"]
    assert client.post("/api/job", params=dict(kind="lunch", image=image)).status_code == 400
    r = client.get("/api/job", params=dict(id="j999"))
    assert r.status_code == 400 and "no job 'j999'" in r.json()["error"]
    job = client.post("/api/job", params=dict(kind="faithfulness", image=image,
                                              method="nope")).json()
    failed = wait_for(client, job["id"])
    assert failed["state"] == "error" and "nope" in failed["error"]


def test_a_constant_map_is_said_so_and_gets_no_faithfulness_score(client, explorer,
                                                                  monkeypatch):
    image = upload(client, png(9))["image"]
    from vitkit.explain import methods as registry

    zero = registry.METHODS["gradcam"]
    monkeypatch.setitem(registry.METHODS, "gradcam", zero.__class__(
        **{**zero.__dict__, "compute": lambda model, x, target, o, outputs: (
            torch.zeros(len(x), *explorer.grid), model(x), torch.zeros(len(x), dtype=torch.long))}))
    r = client.get("/api/method", params=dict(image=image, method="gradcam", target=1)).json()
    assert r["constant"] is True and r["lo"] == r["hi"] == 0.0
    assert "constant (0 on every patch)" in r["note"]
    f = client.get("/api/faithfulness", params=dict(image=image, method="gradcam", target=1))
    assert f.status_code == 400 and "no faithfulness score" in f.json()["error"]
    ok = client.get("/api/method", params=dict(image=image, method="rollout")).json()
    assert ok["constant"] is False and ok["lo"] < ok["hi"]


def test_a_new_image_and_its_numbers_never_wait_behind_a_job(client, explorer):
    """The first view runs on the model's twin: a job holding the model lock (here until the
    gate opens) does not hold up an upload, its per-head numbers or its attention maps."""
    import threading

    gate, started = threading.Event(), threading.Event()

    def hold(progress):
        started.set()
        gate.wait(60)
        return "released"

    job = explorer.jobs.submit("importance", hold)
    try:
        assert started.wait(10)
        image = upload(client, png(11))["image"]
        assert client.get("/api/stats", params=dict(image=image)).status_code == 200
        assert client.get("/api/method", params=dict(image=image, method="rollout",
                                                     discard=0.3)).status_code == 200
        assert job.state == "running"  # all of it answered while the job held the model
    finally:
        gate.set()
    x, logits, maps = direct(explorer.model, png(11))
    view = explorer.view(image)
    torch.testing.assert_close(view.logits, logits)  # the twin computes what the model does
