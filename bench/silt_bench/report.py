"""Reporting: a terminal table, a JSON result file, and a picture of ratios vs goals.

The result document (a dict, written as JSON):

    {"date", "machine": {"node", "cpus", "kernel", "python"}, "commit", "profile", "params",
     "results": {figure: {"median", "min", "max", "runs", "unit"?}},
     "ratios": {goal id or free name: value},
     "goals": [describe() lines], "counters": {name: [values]}, "notes": {scenario: [text]},
     "picture": {"kind": "png"|"svg"|None, "path", "drawn_with"?: "matplotlib"|"pillow"}}

The picture is a PNG drawn with matplotlib when it can be imported, else a PNG drawn with
Pillow (the same chart as the SVG: a bar per goal ratio on its own scale) when PIL can be
imported, else an SVG bar chart written by hand (no dependency), so there is always one;
"picture.kind" says which, and for a PNG "picture.drawn_with" says by what.
"""
import json
import os
import platform
import subprocess
import time
from xml.sax.saxutils import escape

from . import stats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def machine():
    return {"node": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version()}


def git_commit(root=ROOT):
    r = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or None


def build(results, ratios, profile, params=None, root=ROOT, units=None, counters=None, notes=None):
    """results: {figure: list of runs or a stats.summary() dict}; ratios: {id: value};
    counters: {name: list of measured values} (not speeds); notes: {scenario: [text]}."""
    res = {}
    for k, v in results.items():
        s = dict(v) if isinstance(v, dict) else stats.summary(v)
        if units and k in units:
            s["unit"] = units[k]
        res[k] = s
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
            "commit": git_commit(root), "profile": profile, "params": params or {}, "results": res,
            "ratios": dict(ratios), "goals": stats.gaps(ratios), "counters": dict(counters or {}),
            "notes": dict(notes or {}), "picture": {"kind": None, "path": None}}


def table(doc):
    """The document as terminal text: figures (median, min-max, runs), ratios, goals."""
    lines = [f"Silt benchmark  {doc['date']}  commit {doc.get('commit')}  profile {doc.get('profile')}",
             f"machine {doc['machine']['node']} ({doc['machine']['cpus']} CPUs, kernel {doc['machine']['kernel']})", ""]
    if doc["results"]:
        w = max(len(k) for k in doc["results"])
        lines.append(f"{'figure':{w}}  {'median':>10}  {'min':>10}  {'max':>10}  unit      runs")
        for k, v in doc["results"].items():
            lines.append(f"{k:{w}}  {v['median']:10.3f}  {v['min']:10.3f}  {v['max']:10.3f}  {v.get('unit', ''):8}  {len(v['runs'])}")
        lines.append("")
    if doc["ratios"]:
        w = max(len(k) for k in doc["ratios"])
        lines.append(f"{'ratio (of medians)':{w}}  value   goal")
        for k, v in doc["ratios"].items():
            g = stats.GOALS_BY_ID.get(k)
            goal = f"{'≥' if g.direction == '>=' else '≤'} {g.shown or g.goal:}  {'met' if g.met(v) else 'gap ' + format(g.gap(v), '.2f')}" if g else "-"
            lines.append(f"{k:{w}}  {v:6.2f}  {goal}")
        lines.append("")
    lines += doc.get("goals", [])
    if doc.get("counters"):
        lines += ["", "counters (every run)"]
        for k, v in doc["counters"].items():
            lines.append(f"  {k}: " + ", ".join(f"{x:.4g}" for x in v))
    if doc.get("notes"):
        lines += ["", "notes"]
        for k, v in doc["notes"].items():
            lines += [f"  {k}: {t}" for t in v]
    return "\n".join(lines)


def write_json(doc, path):
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return path


def read_json(path):
    with open(path) as f:
        return json.load(f)


def _rows(doc):
    return [(k, v, stats.GOALS_BY_ID[k]) for k, v in doc["ratios"].items() if k in stats.GOALS_BY_ID]


def svg(doc, path):
    """A horizontal bar per goal: the measured value (green when met, red when not) on a scale of
    its own row (values and goals differ in units), with the goal as a black tick."""
    rows = _rows(doc)
    label_w, bar_w, row_h, top = 240, 420, 28, 40
    h = top + row_h * max(1, len(rows)) + 20
    width = label_w + bar_w + 140
    title = "Silt vs goals — %s — %s — %s" % (doc.get("profile"), doc.get("commit"), doc["date"])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" font-family="sans-serif" font-size="12">',
           '<text x="10" y="22" font-size="14">%s</text>' % escape(title)]
    if not rows:
        out.append(f'<text x="10" y="{top + 16}">no ratio with a goal in this run</text>')
    for i, (k, v, g) in enumerate(rows):
        y = top + i * row_h
        scale = bar_w / (max(v, g.goal, 1e-9) * 1.25)
        colour = "#2e7d32" if g.met(v) else "#c62828"
        gx = label_w + g.goal * scale
        sym = "≥" if g.direction == ">=" else "≤"
        out += [f'<text x="10" y="{y + 17}">{escape(k)}</text>',
                f'<rect x="{label_w}" y="{y + 5}" width="{max(v, 0) * scale:.1f}" height="{row_h - 10}" fill="{colour}"/>',
                f'<line x1="{gx:.1f}" y1="{y + 1}" x2="{gx:.1f}" y2="{y + row_h - 1}" stroke="black" stroke-width="2"/>',
                f'<text x="{label_w + bar_w + 8}" y="{y + 17}">{v:.2f} (goal {escape(sym)} {escape(g.shown or str(g.goal if g.goal < 100 else int(g.goal)))})</text>']
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return path


def png(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = _rows(doc)
    fig, ax = plt.subplots(figsize=(8, 0.4 * max(1, len(rows)) + 1))
    for i, (k, v, g) in enumerate(rows):
        # Normalise each row by its goal: 1.0 is the goal; for "<=" goals, lower is better.
        ax.barh(i, v / g.goal, color="#2e7d32" if g.met(v) else "#c62828")
    ax.axvline(1.0, color="black")
    ax.set_yticks(range(len(rows)), [k for k, _, _ in rows])
    ax.set_xlabel("measured ÷ goal")
    ax.set_title(f"Silt vs goals — {doc.get('profile')} — {doc.get('commit')}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _pillow_font(size=14):
    from PIL import ImageFont
    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1 (scalable when FreeType is there)
    except TypeError:
        return ImageFont.load_default()           # older Pillow: the small bitmap font


_ASCII = {"≥": ">=", "≤": "<=", "—": "-", "×": "x"}


def _pillow_text(draw, xy, text, font):
    """draw.text, with "≥", "≤", "—", "×" written in ASCII when the font has no glyph for them
    (the default fonts of Pillow have none: the embedded scalable one draws an empty box, the
    bitmap one of older Pillow is Latin-1 only)."""
    try:
        missing = bytes(font.getmask("\U0010fffd"))  # a private-use character: surely no glyph
    except Exception:
        missing = None
    for ch, ascii_form in _ASCII.items():
        if ch in text:
            try:
                has = missing is not None and bytes(font.getmask(ch)) != missing
            except Exception:
                has = False
            if not has:
                text = text.replace(ch, ascii_form)
    draw.text(xy, text.encode("latin-1", "replace").decode("latin-1") if missing is None else text,
              fill="black", font=font)


def png_pillow(doc, path):
    """The chart of svg() drawn with Pillow: a horizontal bar per goal ratio, green when met and
    red when not, each row on a scale of its own, the goal as a black tick, "value (goal ≥ x)"
    to the right of the bar."""
    from PIL import Image, ImageDraw
    rows = _rows(doc)
    font = _pillow_font(14)
    label_w, bar_w, text_w, row_h, top = 260, 460, 180, 30, 44
    width = label_w + bar_w + text_w
    h = top + row_h * max(1, len(rows)) + 20
    img = Image.new("RGB", (width, h), "white")
    draw = ImageDraw.Draw(img)
    title = "Silt vs goals — %s — %s — %s" % (doc.get("profile"), doc.get("commit"), doc["date"])
    _pillow_text(draw, (10, 12), title, font)
    if not rows:
        _pillow_text(draw, (10, top + 6), "no ratio with a goal in this run", font)
    for i, (k, v, g) in enumerate(rows):
        y = top + i * row_h
        scale = bar_w / (max(v, g.goal, 1e-9) * 1.25)
        colour = "#2e7d32" if g.met(v) else "#c62828"
        gx = round(label_w + g.goal * scale)
        sym = "≥" if g.direction == ">=" else "≤"
        _pillow_text(draw, (10, y + 7), k, font)
        bar = max(v, 0) * scale
        if bar >= 0.5:
            draw.rectangle([label_w, y + 5, round(label_w + bar) - 1, y + row_h - 6], fill=colour)
        draw.line([(gx, y + 1), (gx, y + row_h - 2)], fill="black", width=2)
        shown = g.shown or str(g.goal if g.goal < 100 else int(g.goal))
        _pillow_text(draw, (label_w + bar_w + 8, y + 7), f"{v:.2f} (goal {sym} {shown})", font)
    img.save(path, format="PNG")
    return path


def picture(doc, base, prefer_png=True):
    """Writes base.png (matplotlib, else Pillow) or else base.svg; records which in doc["picture"].
    prefer_png=False always writes the SVG."""
    if prefer_png:
        try:
            import matplotlib  # noqa: F401
            doc["picture"] = {"kind": "png", "path": png(doc, base + ".png"), "drawn_with": "matplotlib"}
            return doc["picture"]
        except ImportError:
            pass
        try:
            from PIL import Image, ImageDraw, ImageFont  # noqa: F401
        except ImportError:
            pass
        else:
            doc["picture"] = {"kind": "png", "path": png_pillow(doc, base + ".png"), "drawn_with": "pillow"}
            return doc["picture"]
    doc["picture"] = {"kind": "svg", "path": svg(doc, base + ".svg")}
    return doc["picture"]


def write_all(doc, outdir, name="results", prefer_png=True):
    """Picture, then JSON (which names the picture), then the table on stdout. Returns paths."""
    os.makedirs(outdir, exist_ok=True)
    pic = picture(doc, os.path.join(outdir, name), prefer_png)
    j = write_json(doc, os.path.join(outdir, name + ".json"))
    print(table(doc))
    return {"json": j, "picture": pic["path"]}
