#!/usr/bin/env bash
# The whole test suite, on a fresh machine or an old one: installs what the
# tests need when it is missing, then checks formatting and lints and runs
# every test of the workspace. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n== %s\n' "$*"; }

# --- what the tests need -----------------------------------------------------
# Debian packages: dd (coreutils) for the spool benchmark's smoke test;
# redis-server (and redis-cli, in the same package) for the Redis store's
# tests (they start their own servers on free ports, clusters included, and
# never touch one that is already running).
missing=()
command -v dd >/dev/null 2>&1 || missing+=(coreutils)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# openssl makes a private CA and certificate for the rediss:// test.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# python3 runs the example handler of the --exec protocol test.
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
# Rust tools: cached in ~/.cargo/bin, outside the repository, and reused.
if ! cargo nextest --version >/dev/null 2>&1; then
  say "installing cargo-nextest (cached in ~/.cargo/bin)"
  cargo install --locked cargo-nextest || echo "cargo-nextest unavailable; falling back to cargo test"
fi

# --- checks ------------------------------------------------------------------
say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

say "tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
