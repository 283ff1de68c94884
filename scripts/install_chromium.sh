#!/usr/bin/env bash
# Best effort: headless Chromium from the Debian packages, for tests/test_profile_html.py
# (which skips without it). Does nothing if a Chromium is already on PATH; never fails.
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
    || command -v google-chrome >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != "0" ]; then
    echo "install_chromium: needs apt-get as root; the HTML report test will skip" >&2
    exit 0
fi
(timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends chromium) \
    >/dev/null 2>&1 || echo "install_chromium: apt-get failed; the HTML report test will skip" >&2
exit 0
