#!/usr/bin/python3
"""`shardkit report` of a real training run, opened in a real browser (headless Chromium).

A 2-rank gpt2-tiny run (fp16 loss scaling, whose scale doubles every few steps, so the log-scale chart
has something to show) trains 25 steps with a checkpoint every 10, then resumes from step 20 to step 30:
steps 21-25 are in the metrics file twice. The report of that file is rendered by Chromium and:

* every chart's <svg id="chart-NAME"> is in the browser's DOM, with a <title>, tick labels on both
  axes, and a <polyline class="series"> per series with one point per step of the merged metrics
  (30 steps, not 35 records) or per committed checkpoint;
* a screenshot of the page is not blank: a good share of its pixels is neither white nor the page
  background, and some are in the series' colours (decoded with zlib and struct only);
* bad input is one line on stderr naming the file and line, exit code 2; an existing output is kept
  without --force.

Exits 77 (ctest SKIP_RETURN_CODE) when no chromium is installed."""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from html.parser import HTMLParser

SKIP = 77
CHARTS = {  # chart name -> the series it draws
    "loss": ["loss"],
    "lr": ["lr"],
    "grad-norm": ["grad_norm"],
    "loss-scale": ["loss_scale"],
    "tokens-per-s": ["tokens_per_s"],
    "checkpoint": ["training_lost_ms", "loop_blocked_ms", "write_ms"],
}
WINDOW = (1280, 1300)  # two columns of charts, all of them on screen
BACKGROUND = (0xF3, 0xF4, 0xF6)  # body background of the page

ap = argparse.ArgumentParser()
ap.add_argument("--shardkit", required=True)
ap.add_argument("--mpiexec", required=True)
ap.add_argument("--configs", required=True, help="samples/configs of the repository")
args = ap.parse_args()

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def sk(*argv, ranks=None, expect=0):
    cmd = ([args.mpiexec, "-n", str(ranks), "--oversubscribe"] if ranks else []) + [args.shardkit, *argv]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != expect:
        sys.exit(f"FAIL: {' '.join(cmd)}: exit {r.returncode}, expected {expect}\n{r.stdout}{r.stderr}")
    return r


def merged_metrics(path):
    """The last record of each step, and of each checkpoint event, as the report merges them."""
    steps, saves = {}, {}
    for line in open(path):
        record = json.loads(line)
        (saves if "event" in record else steps)[record["step"]] = record
    return steps, saves


def finite(value):
    return isinstance(value, (int, float)) and value == value and abs(value) != float("inf")


class Charts(HTMLParser):
    """Per <svg id="chart-*">: its <title> text, tick labels per axis, points per series polyline."""

    def __init__(self):
        super().__init__()
        self.charts, self.current, self.axis, self.in_title = {}, None, None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and a.get("id", "").startswith("chart-"):
            self.current = self.charts[a["id"][len("chart-"):]] = {"title": "", "ticks": {}, "series": {}}
        elif self.current is None:
            return
        elif tag == "title" and not self.current["title"]:
            self.in_title = True
        elif tag == "g" and "axis" in a.get("class", "").split():
            self.axis = a["class"].split()[-1]
            self.current["ticks"][self.axis] = 0
        elif tag == "text" and self.axis:
            self.current["ticks"][self.axis] += 1
        elif tag == "polyline" and "series" in a.get("class", "").split():
            self.current["series"][a.get("data-series")] = len(a.get("points", "").split())

    def handle_endtag(self, tag):
        if tag == "svg":
            self.current = None
        elif tag == "title":
            self.in_title = False
        elif tag == "g":
            self.axis = None

    def handle_data(self, data):
        if self.in_title:
            self.current["title"] += data


def decode_png(path):
    """(width, height, channels, rows of bytes) of an 8-bit RGB or RGBA PNG, unfiltered."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"FAIL: {path} is not a PNG")
    pos, idat = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
    if depth != 8 or color not in (2, 6) or interlace:
        sys.exit(f"FAIL: {path}: PNG of depth {depth}, colour type {color}, interlace {interlace} not handled")
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(b"".join(idat)), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:  # Sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif kind == 2:  # Up
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif kind == 4:  # Paeth
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def chromium(browser, work, *argv):
    profile = tempfile.mkdtemp(dir=work)  # one per run: no shared profile lock, nothing of the user's
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
           "--no-first-run", f"--user-data-dir={profile}", *argv]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


browser = shutil.which("chromium") or shutil.which("chromium-browser")
if not browser:
    print("SKIPPED: chromium not found (Debian: apt-get install chromium)")
    sys.exit(SKIP)

with tempfile.TemporaryDirectory() as work:
    path = lambda name: os.path.join(work, name)  # noqa: E731
    with open(path("text.txt"), "w") as f:
        f.write("".join(f"sharded checkpoints let a run resume on any number of ranks {i}. " for i in range(300)))
    sk("data", "encode", path("text.txt"), "-o", path("text.bin"))
    config = json.load(open(os.path.join(args.configs, "tiny_zero2.json")))
    config["fp16"] = {"enabled": True, "initial_scale_power": 16, "loss_scale_window": 5}
    json.dump(config, open(path("fp16.json"), "w"))
    train = ["train", "--config", path("fp16.json"), "--model", "gpt2-tiny", "--data", path("text.bin"),
             "--save-dir", path("run"), "--save-interval", "10", "--metrics", path("m.jsonl"), "--threads", "1", "-q"]
    sk(*train, "--steps", "25", ranks=2)
    sk(*train, "--steps", "30", "--resume", os.path.join(path("run"), "step-00000020"), ranks=2)

    steps, saves = merged_metrics(path("m.jsonl"))
    records = sum(1 for line in open(path("m.jsonl")) if '"event"' not in line)
    check(sorted(steps) == list(range(1, 31)) and records == 35, f"30 steps in 35 records, got {len(steps)} in {records}")
    committed = [s for s in saves.values() if s["event"] == "checkpoint"]
    check(len(committed) == 4, f"checkpoints at 10, 20, 25, 30: {sorted(saves)}")
    expected = {"checkpoint": {k: sum(finite(s.get(k)) for s in committed) for k in CHARTS["checkpoint"]}}
    for chart, (key,) in ((c, k) for c, k in CHARTS.items() if c != "checkpoint"):
        expected[chart] = {key: sum(finite(s.get(key)) for s in steps.values())}

    out = sk("report", path("m.jsonl"), "-o", path("report.html"), "--title", "gpt2-tiny <resumed> & fp16")
    check("30 steps" in out.stdout, f"report prints what it wrote: {out.stdout!r}")
    size = os.path.getsize(path("report.html"))
    print(f"report.html: {size} bytes")

    # Both renderings at once: each Chromium start takes a few seconds.
    url = "file://" + path("report.html")
    dom = chromium(browser, work, "--dump-dom", url)
    shot = chromium(browser, work, f"--screenshot={path('shot.png')}", "--window-size={},{}".format(*WINDOW), url)
    dom_text, _ = dom.communicate(timeout=60)
    shot.wait(timeout=60)
    check(dom.returncode == 0 and shot.returncode == 0, f"chromium exit codes {dom.returncode}, {shot.returncode}")

    parser = Charts()
    parser.feed(dom_text)
    check("<title>gpt2-tiny &lt;resumed&gt; &amp; fp16</title>" in dom_text, "the title is escaped text in the DOM")
    for chart, series in expected.items():
        found = parser.charts.get(chart)
        if found is None:
            check(False, f"chart-{chart} is not in the rendered DOM")
            continue
        check(found["title"].strip() != "", f"chart-{chart} has a <title>")
        for axis in ("y-axis", "x-axis"):
            check(found["ticks"].get(axis, 0) >= 2, f"chart-{chart}: tick labels on the {axis}: {found['ticks']}")
        for key, points in series.items():
            drawn = found["series"].get(key)
            check(drawn == points, f"chart-{chart}: series {key} draws {drawn} points, the metrics have {points}")

    width, height, bpp, rows = decode_png(path("shot.png"))
    check((width, height) == WINDOW, f"screenshot is {width}x{height}")
    inked = coloured = 0
    for row in rows:
        for i in range(0, len(row), bpp):
            r, g, b = row[i], row[i + 1], row[i + 2]
            if min(r, g, b) >= 250 or max(abs(r - BACKGROUND[0]), abs(g - BACKGROUND[1]), abs(b - BACKGROUND[2])) <= 3:
                continue
            inked += 1
            coloured += max(r, g, b) - min(r, g, b) > 80
    total = width * height
    print(f"screenshot: {100 * inked / total:.1f}% of pixels drawn, {100 * coloured / total:.2f}% in colour")
    check(inked > 0.03 * total, "the screenshot is not blank: over 3% of pixels neither white nor background")
    check(coloured > 0.002 * total, "the series are drawn: over 0.2% of pixels in colour")

    # Errors: one line naming the file and line, exit code 2; an existing report is not replaced.
    with open(path("bad.jsonl"), "w") as f:
        f.write(open(path("m.jsonl")).readline() + '{"step": 2, "loss": \n')
    r = sk("report", path("bad.jsonl"), "-o", path("bad.html"), expect=2)
    check(r.stderr.startswith("shardkit: error: " + path("bad.jsonl") + ":2: not JSON") and r.stderr.count("\n") == 1,
          f"bad input is one line naming file and line: {r.stderr!r}")
    check(not os.path.exists(path("bad.html")), "nothing written for bad input")
    r = sk("report", path("m.jsonl"), "-o", path("report.html"), expect=2)
    check("already exists (use --force to replace it)" in r.stderr, f"existing output: {r.stderr!r}")
    sk("report", path("m.jsonl"), "-o", path("report.html"), "--force", "-q")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("report renders in chromium: all checks passed")
