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
# python3 runs the example handler of the --exec protocol test, and (in a
# virtualenv) the independent Kafka client of the Kafka tests.
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-venv)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
# librdkafka (bundled in the rdkafka crate) is compiled here and links the
# system's OpenSSL and zlib.
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[ -e /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
[ -e /usr/include/zlib.h ] || missing+=(zlib1g-dev)
command -v make >/dev/null 2>&1 || missing+=(make)
# Headless Chromium loads `shardcall web`'s page in the browser test
# (chromium-driver comes with it for whoever drives it by WebDriver).
[ -x /usr/bin/chromium ] || missing+=(chromium chromium-driver)
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

# tansu, a Kafka-protocol broker written in Rust, for the Kafka tests (they
# start their own on free ports). Its memory engine needs the dynostore
# feature. The build takes a quarter of an hour; the binary is cached.
if ! command -v tansu >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/tansu" ]; then
  say "installing the tansu broker (cached in ~/.cargo/bin; slow the first time)"
  cargo install --locked tansu --features dynostore
fi
# s3s-fs, an S3-compatible server that keeps objects in a folder, for the
# S3 backup store's tests (they start their own on free ports).
if ! command -v s3s-fs >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/s3s-fs" ]; then
  say "installing the s3s-fs server (cached in ~/.cargo/bin)"
  # Pinned: later releases need a newer rustc than this machine has.
  cargo install --locked s3s-fs --version 0.14.1 --features binary
fi
# kinesalite, a Kinesis implementation in Node.js (from the npm registry),
# for the Kinesis source's tests (they start their own on free ports),
# cached outside the repository.
kinesalite_dir="$HOME/.cache/shardcall/kinesalite"
if [ ! -x "$kinesalite_dir/node_modules/.bin/kinesalite" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    say "installing nodejs and npm from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
  fi
  say "installing kinesalite into $kinesalite_dir"
  mkdir -p "$kinesalite_dir"
  npm install --prefix "$kinesalite_dir" --no-audit --no-fund --loglevel=error kinesalite@3.3.3
fi
export KINESALITE="$kinesalite_dir/node_modules/.bin/kinesalite"
# The independent Kafka client (kafka-python, from PyPI), in a virtualenv
# cached outside the repository.
venv="$HOME/.cache/shardcall/kafka-venv"
if ! "$venv/bin/python" -c 'import kafka' >/dev/null 2>&1; then
  say "installing kafka-python into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet kafka-python
fi
export KAFKA_PEER_PYTHON="$venv/bin/python"

# --- checks ------------------------------------------------------------------
say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

say "the shipped binary links no test kit"
if cargo tree -e features,normal,build -p shardcall-cli --all-features --locked | grep -q testkit; then
  echo "shardcall-cli's own dependencies enable a testkit feature:" >&2
  cargo tree -e features,normal,build -p shardcall-cli --all-features --locked -i shardcall >&2 || true
  exit 1
fi

say "tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --locked --no-fail-fast
  # nextest does not run doc tests: the examples in the API docs, the page
  # docs/first-handler.md and the handler that must not compile.
  say "doc tests"
  cargo test --workspace --all-features --locked --doc
else
  cargo test --workspace --all-features --locked --no-fail-fast
fi
