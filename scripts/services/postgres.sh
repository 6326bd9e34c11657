#!/usr/bin/env bash
# PostgreSQL server binaries for the multi-worker tests (the tests start their own cluster on loopback).
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
fi
