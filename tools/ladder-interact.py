#!/usr/bin/env python3
"""rnic ladder's HTML, used as a person uses it, in headless Chromium.

    tools/ladder-interact.py PAGE.html

Drives the page over the DevTools protocol (on a pipe: no port, no
library) with real input events: the mouse clicks an arrow and its full
decode must fill the side panel; it clicks a folded run and the run must
open; it types a PSN range and clicks "filter" and only packets in that
range may stay; it scrolls to the end and the rows drawn must follow,
never more than a window of them. Any console message or uncaught
exception fails it. Exits 0 when every step holds, 1 with what failed.
"""

import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time

TIMEOUT = 60.0


class Browser:
    def __init__(self):
        self.profile = tempfile.mkdtemp()
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def fds():
            # Through copies: a pipe may already be fd 3 or 4, and dup2 onto
            # itself would keep its close-on-exec flag.
            r, w = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
             "--hide-scrollbars", "--remote-debugging-pipe",
             "--user-data-dir=" + self.profile, "--window-size=1400,700",
             "about:blank"],
            preexec_fn=fds, close_fds=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def close(self):
        try:
            self.send("Browser.close", session=False, wait=False)
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        subprocess.run(["rm", "-rf", self.profile])

    def _read(self, deadline):
        while b"\0" not in self.buf:
            if time.monotonic() > deadline:
                raise TimeoutError("the browser did not answer")
            r, _, _ = select.select([self.from_chrome], [], [], 0.5)
            if r:
                chunk = os.read(self.from_chrome, 1 << 20)
                if not chunk:
                    raise EOFError("the browser went away")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=True, wait=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        if not wait:
            return None
        deadline = time.monotonic() + TIMEOUT
        while True:
            m = self._read(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method):
        deadline = time.monotonic() + TIMEOUT
        while True:
            for i, m in enumerate(self.events):
                if m.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read(deadline))

    def js(self, expr):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def click(self, x, y):
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {
                "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def complaints(self):
        out = []
        for m in self.events:
            meth = m.get("method")
            if meth == "Runtime.consoleAPICalled":
                out.append("console: " + " ".join(
                    str(a.get("value", a.get("description"))) for a in m["params"]["args"]))
            elif meth == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(m["params"]["exceptionDetails"])[:300])
            elif meth == "Log.entryAdded":
                out.append("log: " + m["params"]["entry"].get("text", ""))
        return out


SUMMARY = re.compile(r"(\d+) packets, (\d+) rows shown")


def summary(b):
    m = SUMMARY.search(b.js("document.getElementById('summary').textContent"))
    return int(m.group(1)), int(m.group(2))


def label_psns(label):
    """The PSNs an arrow's label names: `OPCODE 0xPSN ...`, or a folded
    run's `OPCODE x N (0xFIRST..0xLAST) +`."""
    run = re.search(r" x \d+ \(0x([0-9a-f]+)\.\.0x([0-9a-f]+)\)", label)
    if run:
        return [int(run.group(1), 16), int(run.group(2), 16)]
    one = re.match(r"\S+ 0x([0-9a-f]+)", label)
    return [int(one.group(1), 16)] if one else []


# Each drawn row: its label, the middle of its arrow (page coordinates),
# and whether it is a folded run.
ROWS_JS = """
[...document.querySelectorAll('#canvas g')].map(g => {
  const line = g.querySelector('line').getBoundingClientRect();
  const label = g.querySelectorAll('text')[1].textContent;
  const first = g.querySelector('text').textContent;
  return {label: label, first: first, x: line.left + line.width / 2,
          y: line.top + line.height / 2, folded: / x \\d+ \\(/.test(label)};
})
"""


def main(page):
    b = Browser()
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    try:
        target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        b.session = b.send("Target.attachToTarget",
                           {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            b.send(domain + ".enable")
        started = time.monotonic()
        b.send("Page.navigate", {"url": "file://" + os.path.abspath(page)})
        b.wait_event("Page.loadEventFired")
        took = time.monotonic() - started
        packets, shown = summary(b)
        check(packets > 0 and shown > 0,
              f"loaded: {packets} packets in {shown} rows, drawn in {took:.1f} s")
        rows = b.js(ROWS_JS)
        height = b.js("document.getElementById('scroll').clientHeight")
        check(len(rows) <= height / 22 + 21,
              f"{len(rows)} rows drawn for a view of {height} px, of {shown}")

        # An arrow: its decode in the side panel.
        single = [r for r in rows if not r["folded"] and 0 < r["y"] < height]
        check(bool(single), "an arrow in view to click")
        if single:
            r = single[0]
            before = b.js("document.getElementById('detail').textContent")
            b.click(r["x"], r["y"])
            after = b.js("document.getElementById('detail').textContent")
            psn = re.match(r"\S+ 0x([0-9a-f]+)", r["label"])
            check(after != before and "BTH" in after
                  and (psn is None or psn.group(1) in after),
                  f"clicking {r['first']} {r['label']!r} shows its decode")

        # A folded run: it opens.
        folded = [r for r in rows if r["folded"] and 0 < r["y"] < height]
        if folded:
            r = folded[0]
            count = int(re.search(r" x (\d+) \(", r["label"]).group(1))
            b.click(r["x"], r["y"])
            _, opened = summary(b)
            check(opened == shown + count - 1,
                  f"clicking the run {r['label']!r} opens it: {shown} -> {opened} rows")
            shown = opened
        else:
            print("      (no folded run in view)")

        # A PSN filter, typed and applied with the button.
        psns = sorted({p for r in rows for p in label_psns(r["label"])})
        singles = sorted({p for r in rows if not r["folded"] for p in label_psns(r["label"])})
        if len(psns) >= 3 and len(singles) >= 3:
            # From just above an arrow in the middle of the view: a filter
            # one PSN too wide keeps it.
            lo = singles[len(singles) // 3] + 1
            hi = max(lo, psns[2 * len(psns) // 3])
            # Ending inside a folded run, where there is one: only its
            # packets up to the bound may stay.
            runs = [label_psns(r["label"]) for r in rows if r["folded"]]
            inside = [first + 1 for first, last in runs if first >= lo and last > first + 1]
            if inside:
                hi = inside[0]
            box = b.js("(() => { const r = document.getElementById('psn')"
                       ".getBoundingClientRect(); return [r.left + 5, r.top + r.height / 2]; })()")
            b.click(*box)
            b.send("Input.insertText", {"text": f"{lo:x}-{hi:x}"})
            button = b.js("(() => { const r = document.getElementById('apply')"
                          ".getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()")
            b.click(*button)
            _, filtered = summary(b)
            seen = [p for r in b.js(ROWS_JS) for p in label_psns(r["label"])]
            check(0 < filtered < shown and all(lo <= p <= hi for p in seen),
                  f"filter PSN {lo:#x}-{hi:#x}: {shown} -> {filtered} rows, every PSN drawn in range")
            b.js("document.getElementById('psn').value = ''")
            b.click(*button)
            _, shown = summary(b)

        # Scrolling to the end: the window of rows drawn follows.
        first_before = b.js(ROWS_JS)[0]["first"]
        b.send("Input.dispatchMouseEvent", {
            "type": "mouseWheel", "x": 300, "y": 300, "deltaX": 0,
            "deltaY": shown * 22 + 1000})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            rows = b.js(ROWS_JS)
            if rows and rows[0]["first"] != first_before:
                break
            time.sleep(0.1)
        last_packet = b.js("(() => { const D = JSON.parse(document.getElementById('data')"
                           ".textContent); return D.packets[D.packets.length - 1][0]; })()")
        drawn = [r["first"] for r in rows]
        check(shown <= 40 or (rows and rows[0]["first"] != first_before
                              and any(f.startswith(f"#{last_packet} ") for f in drawn)
                              and len(rows) <= height / 22 + 21),
              f"scrolled to the end: {len(rows)} rows drawn, the last packet (#{last_packet}) among them")

        b.send("Runtime.evaluate", {"expression": "1"})  # collect pending events
        complaints = b.complaints()
        check(not complaints, "no console message or exception"
              + ("" if not complaints else ": " + "; ".join(complaints)))
    finally:
        b.close()
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
