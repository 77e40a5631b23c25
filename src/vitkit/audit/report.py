"""What an audit folder holds, written by rank 0 once the audit is finished:

- ``audit.json``: the options, a summary, the confirmed findings and the hypotheses apart, every
  cluster (size, mean map, region shares, typical members), and the images ranked by suspicion;
- ``audit.csv``: one row per image (``path``, ``label``, ``prediction``, ``confidence``,
  ``correct``, ``cluster``, ``suspicion``, the region shares, entropy, high-norm tokens, error);
- ``maps.npz``: ``maps`` (n, gh, gw) float32 and ``index`` (n,);
- ``images/NNNNNN.png``: the images the report and the explorer show (each cluster's typical
  members and the most suspicious images);
- ``audit.png``: each flag's mean map and typical images with their maps (no flag: the largest
  clusters' mean maps);
- ``report.html``: all of it in one self-contained page (pictures inlined).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from vitkit.audit.analysis import TYPICAL, Audit, result_shares
from vitkit.audit.flags import VERDICTS
from vitkit.audit.regions import CORNERS
from vitkit.util.files import atomic_write
from vitkit.viz import plot

RANKED = 50  # the most suspicious images listed and saved
THUMB = 256  # saved images are at most this many pixels a side
OUTLINE = dict(levels=[0.5], colors="cyan", linewidths=1.2, linestyles="dashed")  # a region
# below this accuracy on the labelled images audited most predictions are wrong: the findings
# then describe how a model that has not learned the task errs, not a shortcut it took
LEARNED = 0.5
COLUMNS = ("path", "label", "prediction", "confidence", "correct", "cluster", "suspicion",
           "border", *CORNERS, "in_box", "entropy", "high_norm_tokens", "error", "index")


def image_path(split, data: str, split_name: str, i: int) -> str:
    """The image's file, or ``SPEC[split]#index`` for a built-in dataset."""
    # a file list is a list; a built-in dataset makes its images when indexed: do not
    img = split.images[i] if isinstance(split.images, (list, tuple)) else None
    return str(img) if isinstance(img, (str, Path)) else f"{data}[{split_name}]#{i}"


def ranked(result: Audit, count: int = RANKED) -> list[int]:
    """The readable images with a suspicion above zero, most suspicious first."""
    rows = [r for r in result.rows if not r["error"] and r["suspicion"] > 0]
    rows.sort(key=lambda r: (-r["suspicion"], r["index"]))
    return [r["index"] for r in rows[:count]]


def _picture(split, i: int) -> np.ndarray | None:
    try:
        img = split[i][0].convert("RGB")
    except (OSError, ValueError):
        return None
    img.thumbnail((THUMB, THUMB))
    return np.asarray(img, dtype=np.float32) / 255


def summarise(result: Audit) -> dict:
    ok = [r for r in result.rows if not r["error"]]
    labelled = [r for r in ok if r["correct"] is not None]
    accuracy = sum(r["correct"] for r in labelled) / len(labelled) if labelled else None
    return {"images": len(result.rows), "readable": len(ok),
            "unreadable": len(result.rows) - len(ok),
            "accuracy": accuracy,
            "findings": sum(f.verdict == "finding" for f in result.flags),
            "unsettled": sum(f.verdict == "unsettled" for f in result.flags),
            "refuted": sum(f.verdict == "refuted" for f in result.flags),
            "clusters": len(result.clusters),
            "warning": untrained(accuracy, labelled)}


def untrained(accuracy: float | None, labelled: list[dict]) -> str | None:
    """A warning when the model is wrong on most (``LEARNED``) of the ``labelled`` rows audited,
    on which it is right at ``accuracy``; else None."""
    if accuracy is None or accuracy >= LEARNED:
        return None
    chance = 1 / max(len({r["label"] for r in labelled}), 1)
    return (f"the model is right on {accuracy:.0%} of the {len(labelled)} labelled images "
            f"(chance {chance:.0%}): it has not learned the task, so what its predictions rest "
            "on is mostly how it errs, not a shortcut it took; train it further (or check the "
            "data and its labels) before reading the findings")


def _flag_images(result: Audit, f, count: int = TYPICAL) -> list[int]:
    """The flag's own images that show it best: for a region, the members with the most
    relevance on it; for the context, the least inside the box; for a statistic, the most
    suspicious."""
    if f.kind == "region":
        mass = (result_shares(result, f.members) * f.region).flatten(1).sum(1)
        return [f.members[j] for j in mass.argsort(descending=True, stable=True)[:count].tolist()]
    rows = [result.rows[i] for i in f.members]
    if f.kind == "outside-box":
        rows.sort(key=lambda r: (r["in_box"], r["index"]))
    else:
        rows.sort(key=lambda r: (-r["suspicion"], r["index"]))
    return [r["index"] for r in rows[:count]]


def _panel(result: Audit, picture, title: str, mean: np.ndarray, members: list[int], boxes,
           region: np.ndarray | None = None):
    """One figure: the mean map with its colour bar, then up to 6 images with their maps and
    the region outlined."""
    shown = [(i, p) for i in members[:6] if (p := picture(i)) is not None]
    fig, axes = plot.subplots(1, 1 + max(1, len(shown)), figsize=(2.2 * (1 + max(1, len(shown))),
                                                                  2.6), squeeze=False)
    axes = axes[0]
    im = axes[0].imshow(mean, cmap="magma", vmin=0)
    axes[0].set_title("mean map (share)", fontsize=8)
    axes[0].set_xticks([])
    axes[0].set_yticks([])
    fig.colorbar(im, ax=axes[0], fraction=0.046, pad=0.04)
    if region is not None:
        axes[0].contour(region.astype(float), **OUTLINE)
    for ax, (i, picture) in zip(axes[1:], shown, strict=False):
        r = result.rows[i]
        box = boxes[i] if boxes is not None else None
        plot.overlay(ax, picture, result.maps[i], box=box,
                     title=f"#{i} pred {r['prediction']} ({r['confidence']:.2f})")
        if region is not None:
            h, w = picture.shape[:2]
            gh, gw = region.shape
            big = region.repeat(h // gh, 0).repeat(w // gw, 1).astype(float)
            ax.contour(big, **OUTLINE)
    for ax in axes[1 + len(shown):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _figures(result: Audit, split, picture) -> list[tuple[str, bytes]]:
    """One figure per flag, in the order of ``result.flags``; nothing flagged: the largest
    clusters. ``picture(i)``: image ``i`` as the report shows it."""
    boxes = np.asarray(split.boxes) if getattr(split, "boxes", None) is not None else None
    out = []
    for f in result.flags:
        mean = result_shares(result, f.members).mean(0).numpy()
        region = f.region.numpy() if f.region is not None else None
        out.append((f.title, _png(_panel(result, picture, f.title, mean, _flag_images(result, f),
                                         boxes, region))))
    if not out:  # nothing flagged: the largest cluster of each class, so the reader sees why
        for c in sorted(result.clusters, key=lambda c: -c["size"])[:4]:
            title = f"no flag; class {c['class']}, cluster {c['cluster']} ({c['size']} images)"
            out.append((title, _png(_panel(result, picture, title, np.asarray(c["mean_map"]),
                                           c["typical"], boxes))))
    return out


def _sheet(figures: list[tuple[str, bytes]]) -> Image.Image:
    pictures = [Image.open(io.BytesIO(b)).convert("RGB") for _, b in figures[:4]]
    width = max(p.width for p in pictures)
    sheet = Image.new("RGB", (width, sum(p.height for p in pictures)), "white")
    y = 0
    for p in pictures:
        sheet.paste(p, (0, y))
        y += p.height
    return sheet


def _effect_text(f) -> str:
    """The tests' numbers in words."""
    e = f.effect
    parts = []
    change = "filled" if f.kind == "region" else "neutralised"
    if "removed" in e:
        r = e["removed"]
        parts.append(
            f"{change} on {r['images']} images of class {f.cls}: its confidence "
            f"{r['confidence_before']:.2f} -> {r['confidence_after']:.2f}, {r['flipped']:.0%} "
            f"no longer predicted {f.cls} (the same change on {r['control_images']} images of "
            f"other classes: {r['control_confidence_before']:.2f} -> "
            f"{r['control_confidence_after']:.2f}, {r['control_flipped']:.0%} changed)")
    if "added" in e:
        a = e["added"]
        what = "pasted" if f.kind == "region" else "imposed"
        parts.append(
            f"{what} from class {f.cls}'s images onto {a['images']} images of other classes: "
            f"{a['to_class_after']:.0%} turn to {f.cls} (from other classes' images: "
            f"{a['to_class_control']:.0%}; unchanged: {a['to_class_before']:.0%})")
    if "pixel_variation" in e:
        parts.append(f"the pixels there vary {e['pixel_variation']:.0%} as much as the same "
                     "place on other classes' images (0% for a mark stamped alike)")
    if e.get("context_removed"):
        c, k = e["context_removed"], e["control"]
        parts.append(f"outside of the box filled: confidence {c['confidence_before']:.2f} -> "
                     f"{c['confidence_after']:.2f} on class {f.cls}, "
                     + (f"{k['confidence_before']:.2f} -> {k['confidence_after']:.2f} on the "
                        "other classes" if k else "no image of another class to compare"))
    if "baseline_reliance" in e:
        parts.append(f"images of other classes rest on it {e['baseline_reliance']:.2f} on "
                     "average: an image's suspicion counts from there")
    return "; ".join(parts) or "not tested"


def _where(f) -> str:
    """The region in words (rows and columns of patches), or the kind of a statistic."""
    if f.region is None:
        return {"outside-box": "everything outside the object's box"}.get(
            f.kind, f"not a place: {f.kind}")
    rows, cols = np.nonzero(f.region.numpy())
    gh, gw = f.region.shape
    return (f"{len(rows)} of {gh * gw} patches, rows {rows.min()}-{rows.max()} and columns "
            f"{cols.min()}-{cols.max()} of the {gh} x {gw} grid (outlined in dashed cyan)")


def _flag_html(f, png: bytes | None) -> str:
    e = html.escape
    out = (f"<div class='{f.verdict}'><h3>{e(f.title)}</h3>"
           f"<p><b>Where:</b> {e(_where(f))}</p>"
           f"<p><b>Evidence:</b> {e(f.evidence)}</p>"
           f"<p><b>Tests:</b> {e(_effect_text(f))}</p>"
           f"<p><b>What to do:</b> {e(f.fix)}</p>")
    if png:
        out += (f"<img alt='{e(f.title)}' src='data:image/png;base64,"
                f"{base64.b64encode(png).decode()}'>")
    return out + "</div>"


def _html(result: Audit, options: dict, summary: dict, figures, csv_rows, out: Path) -> str:
    e = html.escape
    explore = f"vitkit explore --audit {out}"
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>vitkit audit</title>"
             "<style>body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
             "padding:2px 6px}img{max-width:100%}.finding{border-left:4px solid #c00;"
             "padding-left:.6em}.unsettled{border-left:4px solid #e90;padding-left:.6em}"
             ".refuted{border-left:4px solid #aaa;padding-left:.6em;color:#555}"
             "code{background:#f4f4f4}.warning{background:#fff3cd;padding:.4em}</style></head><body>",
             f"<h1>Audit of {e(options['checkpoint'])}</h1>",
             f"<p>{summary['images']} images of <code>{e(options['data'])}</code> "
             f"({e(options['split'])}), method <code>{e(result.method)}</code>: "
             f"{summary['findings']} finding(s), {summary['unsettled']} unsettled and "
             f"{summary['refuted']} refuted hypothesis(es), {summary['clusters']} clusters, "
             f"{summary['unreadable']} "
             "unreadable image(s)"
             + (f", accuracy {summary['accuracy']:.3f}" if summary["accuracy"] is not None
                else "") + ".</p>",
             f"<p>Browse the clusters and ranked images: <code>{e(explore)}</code></p>"]
    if summary["warning"]:
        parts.insert(-1, f"<p class='warning'><strong>Warning:</strong> {e(summary['warning'])}"
                         "</p>")
    pictures = dict(zip(range(len(result.flags)), (png for _, png in figures), strict=False))
    by_verdict = {v: [(f, pictures.get(j)) for j, f in enumerate(result.flags) if f.verdict == v]
                  for v in VERDICTS}
    findings, unsettled, refuted = (by_verdict[v] for v in VERDICTS)
    parts.append(f"<h2>Findings ({len(findings)})</h2>")
    if not findings:
        parts.append("<p>No pattern passed its tests: no place with the same pixels on the "
                     "class's images is needed for its predictions or enough to cause them, "
                     "and no context or image property is both"
                     + ("." if result.flags
                        else "; no class's maps put more relevance anywhere than the others'."
                        " The largest clusters are shown below.") + "</p>")
    parts += [_flag_html(f, png) for f, png in findings]
    if unsettled:
        parts.append(f"<h2>Hypotheses the tests could not settle ({len(unsettled)})</h2><p>One "
                     "test passed and another did not: look at the images.</p>")
        parts += [_flag_html(f, png) for f, png in unsettled]
    if refuted:
        parts.append(f"<details><summary>{len(refuted)} hypothesis(es) refuted by the tests "
                     "(neither needed nor enough): show them with their numbers</summary>")
        parts += [_flag_html(f, png) for f, png in refuted]
        parts.append("</details>")
    if not result.flags:
        for title, png in figures:
            parts.append(f"<h3>{e(title)}</h3><img alt='{e(title)}' src='data:image/png;base64,"
                         f"{base64.b64encode(png).decode()}'>")
    parts.append("<h2>Clusters</h2><table><tr><th>class</th><th>cluster</th><th>images</th>"
                 "<th>peak share</th><th>typical images</th></tr>")
    for c in result.clusters:
        parts.append(f"<tr><td>{c['class']}</td><td>{c['cluster']}</td><td>{c['size']}</td>"
                     f"<td>{np.max(c['mean_map']):.3f}</td>"
                     f"<td>{', '.join(f'#{i}' for i in c['typical'])}</td></tr>")
    parts.append("</table><h2>Most suspicious images</h2><table><tr>"
                 + "".join(f"<th>{k}</th>" for k in ("path", "label", "prediction",
                                                      "confidence", "cluster", "suspicion"))
                 + "</tr>")
    for row in csv_rows[:RANKED]:
        if not row["suspicion"]:
            break
        parts.append("<tr>" + "".join(f"<td>{e(str(row[k]))}</td>" for k in (
            "path", "label", "prediction", "confidence", "cluster", "suspicion")) + "</tr>")
    parts.append("</table><p>Every image is in audit.csv (sort by suspicion); the maps are in "
                 "maps.npz.</p></body></html>")
    return "\n".join(parts)


def _fmt(v):
    return round(v, 5) if isinstance(v, float) else ("" if v is None else v)


def write(result: Audit, split, out: str | Path, options: dict) -> list[Path]:
    """Write the audit's files into ``out``; returns their paths."""
    out = Path(out)
    data, split_name = options["data"], options["split"]
    summary = summarise(result)
    top = ranked(result)
    csv_rows = []
    for r in sorted(result.rows, key=lambda r: (-r.get("suspicion", 0.0), r["index"])):
        csv_rows.append({k: _fmt(r.get(k)) for k in COLUMNS}
                        | {"path": image_path(split, data, split_name, r["index"])})
    for name, value in (("cluster", -1), ("suspicion", 0.0)):
        for row in csv_rows:
            if row[name] == "":
                row[name] = value

    def write_csv(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(csv_rows)

    flag_images = [_flag_images(result, f) for f in result.flags]
    decoded: dict[int, np.ndarray | None] = {}

    def picture(i: int) -> np.ndarray | None:  # each image decoded once
        if i not in decoded:
            decoded[i] = _picture(split, i)
        return decoded[i]

    saved = []
    for i in sorted({i for c in result.clusters for i in c["typical"]} | set(top)
                    | {i for images in flag_images for i in images}):
        pic = picture(i)
        if pic is not None:
            png = Image.fromarray((pic * 255).round().astype(np.uint8))
            atomic_write(out / "images" / f"{i:06d}.png",
                         lambda tmp, p=png: p.save(tmp, format="PNG"))
            saved.append(i)
    boxes = np.asarray(split.boxes) if getattr(split, "boxes", None) is not None else None
    flags = [f.to_dict() | {"images": images}
             for f, images in zip(result.flags, flag_images, strict=True)]
    record = {"options": options, "method": result.method, "summary": summary,
              "findings": [d for d in flags if d["confirmed"]],
              "hypotheses": [d for d in flags if not d["confirmed"]],
              "clusters": [{k: v for k, v in c.items() if k != "members"}
                           | {"region_share": float(np.max(c["mean_map"]))}
                           for c in result.clusters],
              "ranked": top,
              "images": [{"index": i, "file": f"images/{i:06d}.png",
                          "path": image_path(split, data, split_name, i),
                          "box": None if boxes is None else [int(v) for v in boxes[i]],
                          **{k: result.rows[i].get(k) for k in (
                              "label", "prediction", "confidence", "cluster", "suspicion")}}
                         for i in saved],
              "explore": f"vitkit explore --audit {out}"}
    files = [atomic_write(out / "audit.json",
                          lambda tmp: tmp.write_text(json.dumps(record, indent=1) + "\n")),
             atomic_write(out / "audit.csv", write_csv)]

    def save_maps(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, maps=result.maps,
                                index=np.asarray([r["index"] for r in result.rows]))

    files.append(atomic_write(out / "maps.npz", save_maps))
    figures = _figures(result, split, picture)
    files.append(atomic_write(out / "audit.png",
                              lambda tmp: _sheet(figures).save(tmp, format="PNG")))
    files.append(atomic_write(out / "report.html", lambda tmp: tmp.write_text(
        _html(result, options, summary, figures, csv_rows, out))))
    return files
