#!/usr/bin/env bash
# There, after chunk.sh has installed the wheels and the model on this warm machine: a screen of
# learning settings, one `swarmling experiment` per setting into its own folder (a grid's plan
# fixes its overrides), the same design, arm and seeds for each, until MINUTES have passed.
#
#   bash packaging/gpu/screen.sh NAME MINUTES "EXPERIMENT FLAGS" "SETTING" ["SETTING" ...]
#
# A SETTING is --set flags, e.g. "--set train.kl_beta=0 --set train.learning_rate=1e-4". Sends
# back $OUT/NAME-I.tar.gz for the I-th setting: its finished runs (the experiment's --archive: no
# weights; its plan.json names the setting). A setting cut by the clock goes on where it stood
# when the same command runs again on the warm machine. Settings run in the order given: put the
# ones that matter most first.
set -euo pipefail
name=${1:?usage: screen.sh NAME MINUTES "EXPERIMENT FLAGS" SETTING...}
minutes=${2:?}
flags=${3:?}
shift 3
cd "$(dirname "$0")/../.."
tmp=${SWARMLING_GPU_TMP:-/tmp/swarmling-gpu}
export PYTHONPATH="$tmp/src:$tmp/site" PYTHONUNBUFFERED=1
end=$(( $(date +%s) + ${minutes%.*} * 60 ))
root="$tmp/screen/$name"
i=0
for setting in "$@"; do
  i=$((i + 1))
  left=$(( (end - $(date +%s)) / 60 ))
  [ "$left" -ge 1 ] || break
  echo "screen: setting $i: $setting ($left minutes left)"
  # shellcheck disable=SC2086
  python3 -m swarmling.app experiment $flags $setting --minutes "$left" --out "$root/setting-$i" \
    --archive "${OUT:?}/$name-$i.tar.gz" || true
done
