"""Headless Chromium for the report tests: render a page, read back its DOM, its console and what plotly drew.

`probe(page)` opens a copy of the page with a script appended that waits until every figure has rendered, reads
each figure's drawn state (plot area, x range, pixel positions of two instants, traces and their sums), zooms the
shared time axis twice (through the page's own zoom function, then by a plotly relayout on the timeline as a drag
would) and writes all that as JSON into the DOM, which --dump-dom returns."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    assert path, "chromium not found: run scripts/install-deps.sh (Debian package chromium)"
    return path


def run(page: Path, profile: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=20000", *args,
                           page.as_uri()], capture_output=True, text=True, timeout=timeout)


def dom_and_console(page: Path, profile: Path) -> tuple[str, list[str]]:
    """The DOM after scripts ran, and every console message the page logged."""
    proc = run(page, profile, "--dump-dom", "--enable-logging=stderr", "--v=0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def screenshot(page: Path, profile: Path, out: Path, size: str = "1400,5200") -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = run(page, profile, "--hide-scrollbars", f"--window-size={size}", f"--screenshot={out}")
    assert proc.returncode == 0 and out.stat().st_size > 10_000, proc.stderr[-2000:]


def script_errors(dom: str) -> str | None:
    """What window.onerror recorded on the <html> element (see report._ERRORS), or None."""
    m = re.search(r"<html[^>]*data-errors=\"([^\"]*)\"", dom)
    return html.unescape(m.group(1)) if m else None


def rendered(dom: str) -> str | None:
    m = re.search(r"<body[^>]*data-rendered=\"([^\"]*)\"", dom)
    return m.group(1) if m else None


def without_blocks(page: str, tags: tuple[str, ...]) -> str:
    """The page with each <TAG…</TAG> block of these tags, the first closing tag ending it, replaced by a space:
    what re.sub(r"<script.*?</script>|<style.*?</style>", " ", page, flags=re.S) gives for ("script", "style"),
    found with str.find: the expression's lazy `.*?` steps through a report's megabytes of inlined script one
    character at a time."""
    kept, copied, look = [], 0, 0
    while True:
        opens = [(at, tag) for tag in tags if (at := page.find(f"<{tag}", look)) >= 0]
        if not opens:
            break
        at, tag = min(opens)
        end = page.find(f"</{tag}>", at + len(tag) + 1)
        if end < 0:  # never closed: no block starts here
            look = at + 1
            continue
        kept += [page[copied:at], " "]
        copied = look = end + len(tag) + 3
    kept.append(page[copied:])
    return "".join(kept)


def page_text(dom: str) -> str:
    text = without_blocks(dom, ("script",))
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


def flat_text(dom: str) -> str:
    """Text as a reader sees it: tags removed without adding space (inline markup does not split words)."""
    text = without_blocks(dom, ("script",))
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", text)).split())


def section(dom: str, name: str) -> str:
    """One section of the page (from the DOM Chromium dumps, or the file as written)."""
    return re.split(f"id=[\"']{name}[\"']", dom, maxsplit=1)[1].split("</section>", 1)[0]


_PROBE = r"""
<script>
(function(){
  function sum(a){ var s = 0; for (var i = 0; i < a.length; i++) { if (a[i] === a[i]) { s += Number(a[i]); } } return s; }
  function max(a){ var m = null; for (var i = 0; i < a.length; i++) { if (a[i] === a[i] && (m === null || Number(a[i]) > m)) { m = Number(a[i]); } } return m; }
  function figure(el){
    var fl = el._fullLayout, ax = fl.xaxis, r = ax.range.map(ax.r2l);
    return {l: fl._size.l, w: fl._size.w, range: r, type: ax.type,
            px: [fl._size.l + ax.l2p(r[0] + (r[1] - r[0]) / 4), fl._size.l + ax.l2p(r[0] + 3 * (r[1] - r[0]) / 4)],
            traces: el._fullData.map(function(t){
              var y = t.y || [], x = t.x || [], z = t.z || [];
              return {name: t.name, type: t.type, n: x.length || y.length, ysum: sum(y), xsum: sum(x), ymax: max(y),
                      zsum: z.length ? z.reduce(function(s, row){ return s + sum(row); }, 0) : 0};
            }),
            ticktext: (fl.yaxis && fl.yaxis.ticktext) || null,
            shapes: (fl.shapes || []).length, annotations: (fl.annotations || []).map(function(a){ return a.text; })};
  }
  function ranges(){
    var out = {};
    document.querySelectorAll('.fig').forEach(function(el){
      if (el._fullLayout && el._fullLayout.xaxis.type === 'date') {
        var ax = el._fullLayout.xaxis; out[el.id] = ax.range.map(ax.r2l);
      }
    });
    return out;
  }
  function write(result){
    var pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(result);
    document.body.appendChild(pre);
  }
  function wait(){
    if (document.body.getAttribute('data-rendered') === 'no') { setTimeout(wait, 50); return; }
    var result = {figures: {}, errors: window.__errors.slice()};
    document.querySelectorAll('.fig').forEach(function(el){ if (el._fullLayout) { result.figures[el.id] = figure(el); } });
    var tl = document.getElementById('fig-timeline');
    if (!tl || !tl._fullLayout) { write(result); return; }
    // the tooltip of the first point of each marker trace, as the page's own hover handler writes it
    result.tips = {};
    tl._fullData.forEach(function(t, i){
      if (t.mode !== 'markers') { return; }
      Plotly.Fx.unhover(tl);
      var tip = document.getElementById('timeline-tip');
      if (tip) { tip.textContent = ''; }
      Plotly.Fx.hover(tl, {xval: t.x[0], yval: t.y[0], target: tl}, 'xy');  // a target: as from the mouse
      tip = document.getElementById('timeline-tip');
      result.tips[t.name] = tip ? tip.textContent : null;
    });
    var r = tl._fullLayout.xaxis.range.map(tl._fullLayout.xaxis.r2l), span = r[1] - r[0];
    var zoom1 = [r[0] + span / 3, r[0] + span / 2];
    var zoom2 = [r[0] + span / 5, r[0] + span / 4];
    window.pcapdecompSetRange(zoom1, null).then(function(){
      result.zoom1 = {asked: zoom1, got: ranges()};
      return Plotly.relayout(tl, {'xaxis.range': zoom2});
    }).then(function(){
      return new Promise(function(resolve){ setTimeout(resolve, 300); });
    }).then(function(){
      result.zoom2 = {asked: zoom2, got: ranges()};
      write(result);
    }, function(err){ result.errors.push(String(err)); write(result); });
  }
  wait();
})();
</script>
"""


def probe(page: Path, profile: Path) -> tuple[dict, str, list[str]]:
    """(what the probe found, the DOM, the console) for a copy of `page` with the probe appended."""
    copy = profile.parent / f"probe-{page.parent.name}.html"
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>", 1), encoding="utf-8")
    dom, console = dom_and_console(copy, profile)
    m = re.search(r"<pre id=\"probe\">(.*?)</pre>", dom, flags=re.S)
    assert m, f"the probe did not finish: {script_errors(dom)} {console[-5:]}"
    return json.loads(html.unescape(m.group(1))), dom, console
