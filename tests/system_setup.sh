#!/usr/bin/env bash
# System packages that some tests need (assay serve): Chromium and its WebDriver for the dashboard
# test, PostgreSQL for the shared-store test. Idempotent and quick when they are there; installs
# through apt only when running as root on a Debian-like system. Otherwise it says what is missing
# and leaves it: those tests then skip with the reason (and fail in CI, where CI is set).
set -u
missing=()
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "tests/system_setup.sh: missing ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
    exit 0
fi
echo "tests/system_setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || echo "tests/system_setup.sh: could not install ${missing[*]}; the tests that need them will say so" >&2
exit 0
