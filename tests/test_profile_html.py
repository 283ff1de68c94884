"""The HTML profile report rendered by headless Chromium (issue 16): it loads with no console
messages (errors included) and draws. Skips without Chromium (scripts/install_chromium.sh)."""
import importlib.util
import os

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def load_script():
    spec = importlib.util.spec_from_file_location("headless_chromium", os.path.join(SCRIPTS, "headless_chromium.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


chromium = load_script()
pytestmark = pytest.mark.skipif(chromium.find_chromium() is None,
                                reason="no Chromium on PATH: run scripts/install_chromium.sh "
                                       "(Debian: apt-get install chromium)")


def test_console_messages_are_caught(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><svg width="10" height="10"><rect width="-4" height="x"/></svg>'
                    '<script>missingFunction()</script></body></html>')
    messages = chromium.screenshot(page, tmp_path / "bad.png", 200, 200)
    assert any("missingFunction is not defined" in m for m in messages), messages
    assert any("<rect> attribute" in m for m in messages), messages


def test_report_renders_with_no_console_messages(recorded, tmp_path):
    png = tmp_path / "report.png"
    messages = chromium.screenshot(recorded["dir"] / "report.html", png, 1100, 1200)
    assert messages == []
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000  # a page of tables and a chart, not blank


def test_overflow_check_sees_a_page_wider_than_the_window(tmp_path):
    page = tmp_path / "wide.html"
    page.write_text('<!DOCTYPE html><html><body><div style="width:1200px">wide</div>'
                    '<div style="overflow-x:auto;width:100px"><table style="width:500px"><tr><td>x</td></tr></table>'
                    '</div></body></html>')
    metrics = chromium.page_metrics(page, 900)
    assert metrics["scrollWidth"] > metrics["clientWidth"] and metrics["boxesScrolling"] == 1


@pytest.mark.parametrize("width", [900, 1600])
def test_report_and_comparison_fit_the_window(recorded, tmp_path, width):
    """No horizontal overflow at 900 or 1600 px (issue 33 item 7), the side-by-side page too."""
    from openpop import report
    assert report.main([str(recorded["dir"]), "--compare", str(recorded["dir"])]) == 0
    for name in ("report.html", report.COMPARE_HTML):
        metrics = chromium.page_metrics(recorded["dir"] / name, width)
        assert metrics["scrollWidth"] <= metrics["clientWidth"] == width, (name, metrics)
        assert metrics["boxesScrolling"] == 0, (name, metrics)  # no table scrolls inside its box either
    png = tmp_path / "report.png"
    assert chromium.screenshot(recorded["dir"] / "report.html", png, width, 1200) == []
