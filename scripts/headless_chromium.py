"""Open a profile report in headless Chromium: a screenshot and the page's console messages.

    python scripts/headless_chromium.py REPORT_DIR OUT.png [WIDTH HEIGHT]

Prints the console messages (none for a good report) and exits 1 if there were any.
``tests/test_profile_html.py`` uses ``screenshot``; ``scripts/install_chromium.sh`` installs it.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(html_path, png_path, width=1280, height=2000, timeout=120):
    """Render ``html_path`` into ``png_path``; returns the console messages it logged."""
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError("no Chromium on PATH: run scripts/install_chromium.sh")
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", f"--screenshot={os.path.abspath(png_path)}",
             "file://" + os.path.abspath(html_path)],
            capture_output=True, text=True, timeout=timeout, check=False)
    if not os.path.exists(png_path):
        raise RuntimeError(f"Chromium wrote no screenshot (exit {result.returncode}): {result.stderr[-2000:]}")
    return [m.group(1) for m in map(CONSOLE.search, result.stderr.splitlines()) if m]


_MEASURE = ("<script>document.body.setAttribute('data-openpop-metrics', JSON.stringify({"
            "scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth, "
            "scrollHeight: document.documentElement.scrollHeight, "
            "boxesScrolling: Array.from(document.querySelectorAll('body *')).filter("
            "e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX == 'auto').length}));</script>")
_METRICS = re.compile(r'data-openpop-metrics="([^"]*)"')


def page_metrics(html_path, width=1280, height=2000, timeout=120):
    """``{"scrollWidth", "clientWidth", "scrollHeight", "boxesScrolling"}`` of the page laid out
    in a window ``width`` px wide (a copy of the page with a measuring script at its end,
    ``--dump-dom``): ``scrollWidth > clientWidth`` is a page that scrolls sideways;
    ``boxesScrolling`` counts the boxes (``overflow-x: auto``) whose content is wider than they are."""
    import html
    import json
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError("no Chromium on PATH: run scripts/install_chromium.sh")
    with open(html_path) as stream:
        text = stream.read()
    text = text.replace("</body>", _MEASURE + "</body>", 1) if "</body>" in text else text + _MEASURE
    with tempfile.TemporaryDirectory() as profile:
        page = os.path.join(profile, "measured.html")
        with open(page, "w") as stream:
            stream.write(text)
        result = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "--dump-dom", "file://" + page],
            capture_output=True, text=True, timeout=timeout, check=False)
    found = _METRICS.search(result.stdout)
    if found is None:
        raise RuntimeError(f"Chromium gave no page metrics (exit {result.returncode}): {result.stderr[-2000:]}")
    return json.loads(html.unescape(found.group(1)))


def main(argv):
    if len(argv) not in (2, 4):
        print(__doc__, file=sys.stderr)
        return 2
    size = [int(v) for v in argv[2:]] or [1280, 2000]
    messages = screenshot(os.path.join(argv[0], "report.html"), argv[1], *size)
    for message in messages:
        print(message)
    return 1 if messages else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
