#!/usr/bin/env bash
# How long a newcomer's first `make demo` takes: a fresh clone, no package cache, no PostgreSQL/Redis variables.
# Usage: bash benchmarks/first_demo.sh [runs] [installer]   (installer: pip (default) or uv, which must be on PATH)
# Prints each run's wall time, then min / median, and the load average before the first run.
set -euo pipefail
runs=${1:-3}
installer=${2:-pip}
repo=$(cd "$(dirname "$0")/.." && pwd)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)  ($(nproc) cores)"
times=()
for i in $(seq "$runs"); do
  dir=$(mktemp -d)
  git clone -q "$repo" "$dir/p"
  cache=$(mktemp -d)  # uv's cache, empty: nothing comes from an earlier run
  start=$(date +%s.%N)
  if [ "$installer" = uv ]; then
    command -v uv >/dev/null || { echo "uv is not on PATH (pip install uv)"; exit 2; }
    (cd "$dir/p" && env -u REPLAYSAFE_PG_DSN -u REPLAYSAFE_REDIS_URL UV_CACHE_DIR="$cache" make demo >"$dir/log" 2>&1)
  else  # UV= makes the Makefile use pip even where uv is on PATH
    (cd "$dir/p" && env -u REPLAYSAFE_PG_DSN -u REPLAYSAFE_REDIS_URL PIP_NO_CACHE_DIR=1 make demo UV= >"$dir/log" 2>&1)
  fi
  end=$(date +%s.%N)
  t=$(echo "$end - $start" | bc)
  grep -q "^proved: " "$dir/log" || { echo "run $i: make demo did not prove anything; log in $dir/log"; exit 1; }
  printf 'run %d: %.1f s (%s)\n' "$i" "$t" "$(grep -m1 '^\[setup\] installing' "$dir/log" | sed 's/.*with \([a-z]*\).*/\1/')"
  times+=("$t")
  rm -rf "$dir" "$cache"
done
printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "min %.1f s, median %.1f s over %d runs\n", a[1], a[int((NR+1)/2)], NR}'
