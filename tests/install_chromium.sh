#!/usr/bin/env bash
# Headless Chromium for the HTML report's browser test (tests/test_report.py). Without it that one test
# skips, except under CI, where it fails: CI must check the page people look at.
command -v chromium >/dev/null && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get install -y -qq chromium >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
    || echo "could not install chromium with apt-get" >&2
else
  echo "chromium not found (Debian/Ubuntu: sudo apt-get install chromium); the report's browser test will skip" >&2
fi
exit 0
