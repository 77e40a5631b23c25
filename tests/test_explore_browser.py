"""The explorer page in a real browser: Debian's headless Chromium driven by Playwright (never a
downloaded browser). Every interaction must change the pixels it should, under the page's own
Content-Security-Policy, with no error in the console.

``VITKIT_EXPLORE_CHECKPOINT`` explores that checkpoint instead of a random small ViT, and
``VITKIT_SCREENSHOT`` keeps the screenshot there (how the README's picture is made). CI sets
``VITKIT_REQUIRE_BROWSER=1``: there a missing Chromium or Playwright fails instead of skipping.
"""

import base64
import contextlib
import copy
import hashlib
import io
import json
import logging
import math
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import small_vit
from live import TOKEN, serve
from PIL import Image

from vitkit import explain
from vitkit.explain import dense
from vitkit.web.session import Explorer

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--disable-gpu", "--disable-quic", "--disable-sync", "--disable-background-networking"]
log = logging.getLogger("vitkit.tests")

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None

if not (sync_playwright and shutil.which(CHROMIUM)):
    if os.environ.get("VITKIT_REQUIRE_BROWSER"):
        raise RuntimeError(f"the browser tests need Playwright and {CHROMIUM} "
                           "(apt-get install chromium)")
    pytest.skip(f"needs Playwright and {CHROMIUM}", allow_module_level=True)


def model():
    path = os.environ.get("VITKIT_EXPLORE_CHECKPOINT")
    if path:
        import vitkit

        return vitkit.load_model(path, verbose=False)
    m = small_vit(scale=0.3, num_classes=10)
    m.cfg.extra["class_names"] = [f"class {i}" for i in range(10)]
    return m


@pytest.fixture(scope="module")
def page_at(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / "noise.png")
    with serve(Explorer(model()), images=folder) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        log.warning("browser: Chromium %s", browser.version)
        print(f"browser: Chromium {browser.version}")
        page = browser.new_page(viewport={"width": 1400, "height": 1600}, accept_downloads=True)
        problems = []
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning")
                else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(f"{url}/?token={TOKEN}")
        until(page, "document.body.dataset.ready === '1'")
        yield page, problems, url
        browser.close()


def until(page, expression: str, timeout: float = 60.0) -> None:
    """Poll ``expression`` (evaluated by the driver: the page's CSP forbids eval) until true."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if page.evaluate(expression):
            return
        time.sleep(0.05)
    status = page.evaluate("document.getElementById('status').textContent")
    raise AssertionError(f"timed out waiting for {expression!r}; status line: {status!r}")


def idle(page) -> None:
    """Until the page is quiet: nothing in the status line and the view fully drawn."""
    until(page, "document.getElementById('status').textContent === '' && "
                "(!S.view || document.body.dataset.view === 'full') && "
                "Object.keys(JOBS).length === 0")


def pixels(page, canvas: str) -> str:
    """A digest of a canvas's pixels (read by the driver, not by page script)."""
    data = page.evaluate(f"document.getElementById('{canvas}').toDataURL('image/png')")
    return hashlib.sha256(data.encode()).hexdigest()


def test_the_whole_page(page_at, tmp_path):
    page, problems, _ = page_at
    blank = pixels(page, "main")

    # 1. upload a sample image through the file picker
    sample = tmp_path / "digit.png"
    from vitkit.data.digits import cluttered_digits

    d = cluttered_digits(1, "val", canvas=32, align=4, seed=5)
    Image.fromarray((d.images[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8)).save(sample)
    page.set_input_files("#file", str(sample))
    until(page, "document.querySelectorAll('#top5 li').length === 5")
    idle(page)
    top = page.evaluate("[...document.querySelectorAll('#top5 li')].map(li => li.textContent)")
    assert len(top) == 5 and all(t.strip().endswith("%") and "class" in t for t in top), top
    first = pixels(page, "main")
    assert first != blank

    # 2. layers x heads: every cell drawn; change layer and head, click a cell
    cells = page.locator("#mosaic canvas")
    assert cells.count() == page.evaluate("S.model.depth * S.model.heads")
    page.select_option("#layer", "0")
    after_layer = pixels(page, "main")
    assert after_layer != first
    page.select_option("#head", "1")
    after_head = pixels(page, "main")
    assert after_head != after_layer
    page.select_option("#head", "max")  # a fusion, by name
    until(page, "S.fused && S.fused.name === 'max'")
    assert pixels(page, "main") != after_head
    cells.nth(2).click()
    assert page.evaluate("S.layer") == 0 and page.evaluate("S.head") == "2"

    # 3. click a patch: its row and its rollout row
    before = pixels(page, "token-row")
    page.click("#main", position={"x": 40, "y": 60})
    until(page, "document.getElementById('token-caption').textContent.includes('attention at')")
    row = pixels(page, "token-row")
    assert row != before and pixels(page, "token-rollout") != before
    page.click("#main", position={"x": 300, "y": 300})
    until(page, "document.getElementById('token-caption').textContent.includes('row 5')")
    assert pixels(page, "token-row") != row

    # 4. methods side by side; switch the main overlay to each
    until(page, "Object.keys(S.methods).length === S.model.applicable.length")
    shown = pixels(page, "main")
    for name in reversed(page.evaluate("S.model.applicable")):  # cls (= the head shown) last
        page.click(f"#method-{name} canvas")
        now = pixels(page, "main")
        assert now != shown, name
        shown = now
    assert page.locator("#methods figure.unavailable").count() == \
        len(page.evaluate("Object.keys(S.model.unavailable)"))
    page.select_option("#target", "3")  # another class: the gradient maps change
    idle(page)
    until(page, "document.querySelector('#method-chefer figcaption').textContent.includes('3')")

    # 5. faithfulness curves
    before = pixels(page, "faith-plot")
    page.select_option("#faith-method", "rollout")
    page.click("#faith-run")
    until(page, "document.getElementById('faith-text').textContent.includes('AUC')")
    assert pixels(page, "faith-plot") != before  # the curves first, the verdict after
    until(page, "document.getElementById('faith-text').textContent.includes('random maps on')")
    verdict = page.text_content("#faith-text")
    assert "random maps on deletion (p " in verdict and "Class sensitivity: fails" in verdict

    # 6. per-head numbers
    cells = page.evaluate("S.model.depth * S.model.heads")
    assert page.locator("#entropy-table td").count() == cells
    assert page.locator("#distance-table td").count() == cells

    # 7. causal: logit lens and head importance; a click shows that head's map
    page.click("#causal-run")
    until(page, "document.querySelectorAll('#importance-table td').length > 0")
    idle(page)
    assert "Top class after each layer" in page.inner_text("#lens-text")
    page.locator("#importance-table td").nth(1).click()
    assert page.evaluate("S.layer") == 0 and page.evaluate("S.head") == "1"

    # 8. export: the figure, the maps, the settings; and settings that reproduce the view
    with page.expect_download() as png_download:
        page.click("#export-png")
    figure = Image.open(png_download.value.path())
    assert figure.size[0] > 100 and np.asarray(figure.convert("L")).std() > 5
    with page.expect_download() as npz_download:
        page.click("#export-npz")
    with np.load(npz_download.value.path()) as npz:
        assert npz["attention"].ndim == 4
    with page.expect_download() as json_download:
        page.click("#export-json")
    settings = json.loads(Path(json_download.value.path()).read_text())
    assert settings["layer"] == 0 and settings["head"] == "1"
    settings["layer"], settings["head"] = 1, "3"
    saved = tmp_path / "view.json"
    saved.write_text(json.dumps(settings))
    page.set_input_files("#import-json", str(saved))
    until(page, "S.layer === 1 && S.head === '3'")

    # samples: the digits with their box, and the --images folder
    groups = page.evaluate("[...document.querySelectorAll('#samples optgroup')].map(g => g.label)")
    assert any(g.startswith("cluttered digits") for g in groups)
    assert any(g.startswith("--images") for g in groups)
    page.select_option("#samples", label="noise.png")
    until(page, "S.view && S.view.label === 'noise.png'")
    idle(page)

    # the screenshot is not blank
    digit = page.evaluate("S.model.samples.find(s => s.group.startsWith('cluttered')).id")
    page.select_option("#samples", str(digit))
    until(page, "S.view && S.view.box !== null")
    idle(page)
    page.click("#main", position={"x": 200, "y": 200})
    until(page, "document.getElementById('token-caption').textContent.includes('attention at')")
    until(page, "Object.keys(S.methods).length === S.model.applicable.length")
    page.click("#method-rollout canvas")
    page.select_option("#faith-method", "rollout")
    page.click("#faith-run")
    page.click("#causal-run")
    until(page, "document.getElementById('faith-text').textContent.includes('AUC')")
    until(page, "document.querySelectorAll('#importance-table td').length > 0")
    idle(page)
    shot = Path(os.environ.get("VITKIT_SCREENSHOT") or tmp_path / "explore.png")
    page.screenshot(path=str(shot), full_page=True)
    grey = np.asarray(Image.open(shot).convert("L"))
    assert grey.std() > 20 and len(np.unique(grey)) > 50
    assert not problems, problems


def test_drag_and_drop_and_a_bad_file(page_at):
    page, problems, _ = page_at
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 40, 3), 200, np.uint8)).save(buf, "PNG")
    drop = """async ([bytes, name, type]) => {
        const dt = new DataTransfer();
        dt.items.add(new File([new Uint8Array(bytes)], name, { type }));
        const event = new DragEvent('drop', { dataTransfer: dt, bubbles: true });
        document.getElementById('drop').dispatchEvent(event);
    }"""
    page.evaluate(drop, [list(buf.getvalue()), "grey.png", "image/png"])
    until(page, "S.view && S.view.label === 'grey.png'")
    idle(page)
    page.evaluate(drop, [list(b"not an image at all"), "notes.png", "image/png"])
    until(page, "document.getElementById('status').classList.contains('error')")
    assert "not an image" in page.inner_text("#status")
    assert page.evaluate("S.view.label") == "grey.png"  # the last good view stays
    problems.clear()  # the 400 is logged by the browser as a failed resource: expected


def test_the_page_without_the_token_says_what_to_do(page_at):
    page, _, url = page_at
    response = page.goto(f"{url}/")
    assert response.status == 403 and "?token=" in page.inner_text("body")


def test_an_audit_folder_is_browsed_from_its_flags(page_at, tmp_path):
    """`vitkit explore --audit`: the audit's flag, ranking and clusters head the sample list;
    picking the flag's first image draws it with its prediction."""
    import vitkit
    from vitkit.audit import store
    from vitkit.audit.report import write

    checkpoint = Path(__file__).parent / "data" / "audit" / "marked.safetensors"
    out = tmp_path / "audit"
    result = store.run(checkpoint, "cluttered-digits+mark:3", out, split="train", limit=600,
                       batch_size=128, say=lambda line: None)
    write(result, result.split, out, store.read_options(out))
    explorer = Explorer(vitkit.load_model(checkpoint, verbose=False))
    browser = page_at[0].context.browser  # one Playwright per process: the module's browser
    with serve(explorer, audit=out) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        problems = []
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(f"{url}/?token={TOKEN}")
        until(page, "document.body.dataset.ready === '1'")
        groups = page.evaluate("[...document.querySelectorAll('#samples optgroup')]"
                               ".map(g => g.label)")
        assert groups[0].startswith("audit: the model relies on a fixed region for class 3")
        assert "audit: most suspicious images" in groups
        blank = pixels(page, "main")
        first = page.evaluate("document.querySelector('#samples optgroup option').value")
        page.select_option("#samples", first)
        until(page, "document.querySelectorAll('#top5 li').length === 5")
        idle(page)
        assert pixels(page, "main") != blank
        top = page.evaluate("document.querySelector('#top5 li').textContent")
        assert top.strip().startswith("3"), top  # the marked image is predicted a 3
        page.close()
    assert problems == []


# ----------------------------------------------------------------- scale, jobs, settings
def uniform_head_model():
    """A small ViT whose layer 2, head 0 attends uniformly (its queries are zero)."""
    m = small_vit(scale=0.3, num_classes=10)
    d = m.cfg.embed_dim // m.cfg.num_heads
    with torch.no_grad():
        m.blocks[2].attn.qkv.weight[:d] = 0
        m.blocks[2].attn.qkv.bias[:d] = 0
    return m


@contextlib.contextmanager
def page_for(page_at, explorer, width=1400, **serve_options):
    """A fresh page on a fresh server of ``explorer``, in the module's browser."""
    browser = page_at[0].context.browser
    with serve(explorer, **serve_options) as url:
        page = browser.new_page(viewport={"width": width, "height": 1600}, accept_downloads=True)
        problems = []
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(f"{url}/?token={TOKEN}")
        until(page, "document.body.dataset.ready === '1'")
        try:
            yield page, problems
        finally:
            page.close()


def luminance(page, canvas: str) -> float:
    data = page.evaluate(f"document.getElementById('{canvas}').toDataURL('image/png')")
    img = Image.open(io.BytesIO(base64.b64decode(data.split(",", 1)[1]))).convert("L")
    return float(np.asarray(img, dtype=np.float64).mean())


def pick_digit(page) -> None:
    digit = page.evaluate("S.model.samples.find(s => s.group.startsWith('cluttered')).id")
    page.select_option("#samples", str(digit))
    until(page, "S.view && S.view.box !== null")
    idle(page)


def test_every_map_has_a_scale_and_a_uniform_head_looks_uniform(page_at):
    explorer = Explorer(uniform_head_model())
    with page_for(page_at, explorer) as (page, problems):
        pick_digit(page)
        # the colour bar carries the shown map's real minimum and maximum
        page.locator("#mosaic canvas[data-layer='1'][data-head='2']").click()
        image = page.evaluate("S.view.image")
        heads = explain.readout_attention(explorer.view(image).maps)[0]
        lo, hi = page.evaluate("[Number(document.getElementById('main-scale').dataset.lo),"
                               " Number(document.getElementById('main-scale').dataset.hi)]")
        assert lo == pytest.approx(heads[1, 2].min().item(), rel=1e-5)
        assert hi == pytest.approx(heads[1, 2].max().item(), rel=1e-5)
        assert not page.is_hidden("#main-scale")
        # the uniform head on its own scale: a constant map, said so, nothing drawn over it
        page.locator("#mosaic canvas[data-layer='2'][data-head='0']").click()
        assert "constant map" in page.text_content("#main-note")
        own = luminance(page, "main")
        # on the shared scale it is drawn at its value: near the bottom, so dark
        page.select_option("#scale", "shared")
        until(page, "document.getElementById('mosaic-caption').textContent.includes('one scale')")
        shared = page.evaluate("[Number(document.getElementById('main-scale').dataset.lo),"
                               " Number(document.getElementById('main-scale').dataset.hi)]")
        assert shared[0] == pytest.approx(heads.min().item(), rel=1e-5)
        assert shared[1] == pytest.approx(heads.max().item(), rel=1e-5)
        assert "uniform" in page.text_content("#main-note")
        assert luminance(page, "main") < 0.75 * own  # darkened by a dark overlay
        # the tables: a fixed scale with the uniform value marked
        assert "uniform rows" in page.text_content("#entropy-table .legend")
        assert "uniform attention" in page.text_content("#distance-table .legend")
        entropy_hi = page.evaluate("Number(document.querySelector('#entropy-table .legend')"
                                   ".dataset.hi)")
        assert entropy_hi == pytest.approx(math.log(65), rel=1e-5)
        assert not problems, problems


def slow_exact_ablation(explorer, monkeypatch, steps: int = 200) -> threading.Event:
    """Make the explorer's exact ablation a job of ``steps`` steps of 0.1 s; the event is set
    when it was cancelled."""
    cancelled = threading.Event()

    def slow_exact(view, target, measure="logit", progress=None):
        try:
            for i in range(1, steps + 1):
                time.sleep(0.1)
                progress(i / steps)
        except Exception:
            cancelled.set()
            raise
        return dict(target=0, measure=measure, importance=torch.zeros(3, 4),
                    importance_kind="exact")

    monkeypatch.setattr(explorer, "exact_importance", slow_exact)
    return cancelled


def start_exact(page) -> None:
    pick_digit(page)
    page.click("#causal-run")
    until(page, "!document.getElementById('causal-exact').disabled")
    page.click("#causal-exact")
    until(page, "!document.getElementById('causal-job').hidden")


def test_a_click_is_answered_while_a_slow_job_runs_and_the_job_cancels(page_at, monkeypatch):
    explorer = Explorer(model())
    slow_exact_ablation(explorer, monkeypatch)
    with page_for(page_at, explorer) as (page, problems):
        start_exact(page)
        until(page, "!document.getElementById('causal-job').hidden && "
                    "document.querySelector('#causal-job progress').value > 0")
        assert "s left" in page.text_content("#causal-job .eta")
        # a head click while the job holds the model: drawn at once
        before = pixels(page, "main")
        start = time.monotonic()
        page.locator("#mosaic canvas[data-layer='0'][data-head='3']").click()
        until(page, "S.layer === 0 && S.head === '3'", timeout=1.0)
        assert pixels(page, "main") != before
        # a [CLS] map of another layer, asked of the server, answered within a second too
        answered = page.evaluate("""async () => { const t = performance.now();
            await api('/api/method', { image: S.view.image, method: 'cls', layer: 1, head: 2 });
            return performance.now() - t; }""")
        assert answered < 1000 and time.monotonic() - start < 3
        assert page.evaluate("JOBS.causal !== undefined")  # the job is still running
        page.click("#causal-cancel")
        until(page, "document.getElementById('causal-job').hidden")
        assert "cancelled" in page.text_content("#status")
        assert page.evaluate("document.getElementById('causal-job').dataset.state") == \
            "cancelled"
        assert not problems, problems


def test_a_constant_map_is_noted_and_gets_no_score(page_at, monkeypatch):
    from vitkit.explain import methods as registry

    explorer = Explorer(model())
    zero = registry.METHODS["gradcam"]
    monkeypatch.setitem(registry.METHODS, "gradcam", zero.__class__(**{
        **zero.__dict__, "compute": lambda m, x, target, o, outputs: (
            torch.zeros(len(x), *explorer.grid), m(x), torch.zeros(len(x), dtype=torch.long))}))
    with page_for(page_at, explorer) as (page, problems):
        pick_digit(page)
        assert "Constant map" in page.text_content("#method-gradcam figcaption")
        page.click("#method-gradcam canvas")
        assert "constant map" in page.text_content("#main-note")
        page.select_option("#faith-method", "gradcam")
        page.click("#faith-run")
        until(page, "document.getElementById('faith-text').textContent.includes('no faithful"
                    "ness score')", timeout=10)
        assert not problems, problems


def test_settings_are_checked_and_travel_with_an_uploaded_image(page_at, tmp_path):
    m = model()
    with page_for(page_at, Explorer(m)) as (page, problems):
        pick_digit(page)
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"vitkit_explore": 1, "layer": 99, "head": "zzz"}))
        page.set_input_files("#import-json", str(bad))
        until(page, "document.getElementById('status').classList.contains('error')")
        message = page.text_content("#status")
        assert "layer 99 does not exist (0..2)" in message
        assert 'head "zzz" does not exist' in message
        # an uploaded image: the sample list is cleared, and its settings carry the picture
        upload = tmp_path / "mine.png"
        rng = np.random.default_rng(3)
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(upload)
        page.set_input_files("#file", str(upload))
        until(page, "S.view && S.view.label === 'mine.png'")
        idle(page)
        assert page.evaluate("document.getElementById('samples').value") == ""
        page.locator("#mosaic canvas[data-layer='1'][data-head='2']").click()
        top = page.evaluate("S.view.top")
        with page.expect_download() as saved:
            page.click("#export-json")
        settings = Path(saved.value.path()).read_text()
        assert json.loads(settings)["picture"].startswith("data:image/png;base64,")
    # a new server (another process, as far as the page knows): the settings still apply
    with page_for(page_at, Explorer(m)) as (page, problems):
        again = tmp_path / "again.json"
        again.write_text(settings)
        page.set_input_files("#import-json", str(again))
        until(page, "S.view && S.layer === 1 && S.head === '2'")
        idle(page)
        assert [t["index"] for t in page.evaluate("S.view.top")] == [t["index"] for t in top]
        assert not problems, problems


def test_a_narrow_window_does_not_scroll_sideways_and_captions_name_a_class_once(page_at):
    m = small_vit(scale=0.3, num_classes=10)  # no class names: "class 7", never "class class 7"
    with page_for(page_at, Explorer(m), width=420) as (page, problems):
        pick_digit(page)
        assert page.evaluate("document.documentElement.scrollWidth") <= 420
        page.select_option("#target", "7")
        until(page, "document.querySelector('#method-chefer figcaption').textContent"
                    ".includes('(class 7)')")
        page.click("#method-chefer canvas")
        text = page.text_content("#overlay-title") + page.text_content("#methods")
        assert "class class" not in text
        assert not problems, problems


def test_compare_two_images_two_classes_and_two_checkpoints(page_at):
    a = model()
    b = copy.deepcopy(a)
    with torch.no_grad():  # "after fine-tuning": the same architecture, other weights
        for p in b.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with page_for(page_at, Explorer(a), compare=Explorer(b, name="tuned")) as (page, problems):
        pick_digit(page)
        page.locator("#mosaic canvas[data-layer='1'][data-head='2']").click()
        # another image: the same head of the same layer, on one scale
        page.select_option("#compare-kind", "image")
        other = page.evaluate("S.model.samples.filter(s => s.group.startsWith('cluttered'))[1].id")
        page.select_option("#compare-sample", str(other))
        until(page, "document.getElementById('compare-note').textContent.includes('one colour')")
        assert "layer 1, head 2" in page.text_content("#compare-b-caption")
        assert pixels(page, "compare-a") != pixels(page, "compare-b")
        # another class: Chefer for the predicted class and for class 3
        page.click("#method-chefer canvas")
        page.select_option("#compare-kind", "class")
        page.select_option("#compare-class", "3")
        until(page, "document.getElementById('compare-b-caption').textContent.includes('class 3')")
        assert pixels(page, "compare-a") != pixels(page, "compare-b")
        # the second checkpoint: the same image through the other weights
        page.locator("#mosaic canvas[data-layer='2'][data-head='1']").click()
        page.select_option("#compare-kind", "model")
        until(page, "document.getElementById('compare-b-caption').textContent.includes('tuned')")
        assert pixels(page, "compare-a") != pixels(page, "compare-b")
        assert not problems, problems
    # the same checkpoint on both sides: the same picture, pixel for pixel
    with page_for(page_at, Explorer(a), compare=Explorer(copy.deepcopy(a), name="same")) as (
            page, problems):
        pick_digit(page)
        page.locator("#mosaic canvas[data-layer='2'][data-head='1']").click()
        page.select_option("#compare-kind", "model")
        until(page, "document.getElementById('compare-b-caption').textContent.includes('same')")
        assert pixels(page, "compare-a") == pixels(page, "compare-b")


def test_the_report_export_is_one_page_with_everything_shown(page_at, tmp_path):
    with page_for(page_at, Explorer(model())) as (page, problems):
        pick_digit(page)
        page.select_option("#faith-method", "rollout")
        page.click("#faith-run")
        until(page, "document.getElementById('faith-text').textContent.includes('AUC')")
        page.click("#causal-run")
        until(page, "document.querySelectorAll('#importance-table td').length > 0")
        idle(page)
        with page.expect_download() as report:
            page.click("#export-html")
        path = tmp_path / "report.html"
        path.write_bytes(Path(report.value.path()).read_bytes())
        html = path.read_text()
        assert "http://" not in html.replace("http://www.w3.org", "")  # nothing fetched
        viewer = page.context.browser.new_page()
        viewer.goto(path.as_uri())
        cells = page.evaluate("S.model.depth * S.model.heads")
        assert viewer.locator("#mosaic img").count() == cells
        images = viewer.evaluate("[...document.images].map(i => i.complete && i.naturalWidth)")
        assert len(images) >= cells + 4 and all(images)  # every picture decodes
        body = viewer.inner_text("body")
        for part in ("Prediction", "Layers x heads", "Methods", "deletion AUC", "attention "
                     "entropy", "head importance", "logit lens", "colour scale"):
            assert part in body, part
        assert viewer.locator("table").count() >= 3
        viewer.close()
        assert not problems, problems


def test_a_new_image_cancels_the_old_images_job_quietly(page_at, monkeypatch):
    explorer = Explorer(model())
    cancelled = slow_exact_ablation(explorer, monkeypatch, steps=300)
    with page_for(page_at, explorer) as (page, problems):
        start_exact(page)
        other = page.evaluate("S.model.samples.filter(s => s.group.startsWith('cluttered'))[2].id")
        page.select_option("#samples", str(other))
        assert cancelled.wait(10)  # the server stopped working for the old image
        idle(page)  # ... and the page says nothing about it
        assert page.evaluate("document.getElementById('causal-job').hidden")
        assert not problems, problems


def test_an_lrp_map_shows_where_the_logit_goes_as_the_library_computes_it(page_at):
    """The AttnLRP figure's caption carries the relevance budget (pixels, position table,
    tokens, biases, the rules' remainder): the server's numbers, equal to the library's."""
    from vitkit.explain import lrp

    explorer = Explorer(model())
    with page_for(page_at, explorer) as (page, problems):
        pick_digit(page)
        until(page, "document.querySelector('#method-attnlrp figcaption').textContent"
                    ".includes('Relevance budget')")
        caption = page.text_content("#method-attnlrp figcaption")
        view = explorer.view(page.evaluate("S.view.image"))
        *_, budget = lrp.relevance(explorer.model, view.x, rule="attnlrp", budget=True)
        logit = sum(v[0] for v in budget.values())
        for part, value in budget.items():
            shown = f"{lrp.BUDGET_LABELS[part]} {100 * float(value[0] / logit):.1f}%"
            assert shown in caption, (shown, caption)
        assert not problems, problems


def test_the_pages_trust_verdict_is_the_librarys(page_at):
    """The faithfulness panel shows the verdict vitkit.explain.trust gives for the same map:
    the random maps beaten and the sentence, on the doctor catalogue's trained ViT, for a map
    that is the same for every class (rollout) and a class-specific one (chefer)."""
    from doctor_catalogue import TRAINED

    import vitkit
    from vitkit.explain import trust

    explorer = Explorer(vitkit.load_model(TRAINED, verbose=False))
    with page_for(page_at, explorer) as (page, problems):
        pick_digit(page)
        x = explorer.view(page.evaluate("S.view.image")).x
        said = []
        for method in ("rollout", "chefer"):
            page.evaluate("document.getElementById('faith-text').textContent = ''")
            page.select_option("#faith-method", method)
            page.click("#faith-run")
            until(page, "document.getElementById('faith-text').textContent.includes('Trust it')")
            text = page.text_content("#faith-text")
            e = explain.explain_map(explorer.model, x, method)
            floor = trust.random_floor(explorer.model, x, e.map, e.target,
                                       baseline=trust.VERDICT_BASELINE)
            want = trust.verdict(floor.percentile.item(),
                                 trust.randomisation_check(explorer.model, x, method).passes,
                                 trust.class_sensitivity(explorer.model, x, method).passes)
            beaten = round(floor.percentile.item() * trust.RANDOM_MAPS)
            assert f"Beats {beaten} of {trust.RANDOM_MAPS} random maps" in text, text
            assert text.endswith(want.text), (text, want)
            said.append(want.trusted)
        assert said[0] is False  # rollout explains no class in particular
        assert not problems, problems


def test_the_features_view_draws_the_pca_and_a_clicked_patchs_similarity(page_at):
    m = model()
    gw = m.cfg.grid_size[1]
    m.pos_embed.data[0, m.num_prefix_tokens + 2 * gw + 5] += 30.0  # a high-norm token at (2, 5)
    explorer = Explorer(m)
    with page_for(page_at, explorer) as (page, problems):
        blank = pixels(page, "features-similar")
        pick_digit(page)
        until(page, "document.getElementById('features-panel').dataset.drawn === S.view.image")
        assert pixels(page, "features-pca") != blank
        assert page.evaluate("F.answer.artifacts") == [[2, 5]]
        assert "(row 2, column 5)" in page.text_content("#artifacts-note")
        view = explorer.view(page.evaluate("S.view.image"))
        tokens = dense.patch_features(m, view.x)[0][0]
        drawn = blank
        for row, col in [(1, 3), (6, 0)]:
            box = page.locator("#features-pca").bounding_box()
            page.click("#features-pca", position={"x": (col + 0.5) * box["width"] / gw,
                                                  "y": (row + 0.5) * box["height"] / gw})
            until(page, f"document.getElementById('features-panel').dataset.similar === "
                        f"'{row},{col}'")
            assert pixels(page, "features-similar") != drawn  # the map changed
            drawn = pixels(page, "features-similar")
            shown = np.array(page.evaluate("Array.from(F.similar.data)"))
            assert shown[row * gw + col] == pytest.approx(1, abs=1e-5)  # the clicked patch
            want = torch.nn.functional.cosine_similarity(tokens[row, col], tokens, dim=-1)
            np.testing.assert_allclose(shown.reshape(want.shape), want, atol=1e-5)
            assert f"row {row}, column {col}" in page.text_content("#similar-caption")
        assert not problems, problems
