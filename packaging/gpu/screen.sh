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
# ones that matter most first. SCREEN_PARALLEL=1 runs them all at once instead (a small model
# leaves most of the GPU idle: a dozen single-node settings take about as long as one), each
# with its output in $OUT/NAME-I.log; give each setting `--threads 1` then.
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
run_setting() {  # I SETTING
  # shellcheck disable=SC2086
  python3 -m swarmling.app experiment $flags $2 --minutes "$left" --out "$root/setting-$1" \
    --archive "${OUT:?}/$name-$1.tar.gz" || true
}
i=0
for setting in "$@"; do
  i=$((i + 1))
  left=$(( (end - $(date +%s)) / 60 ))
  [ "$left" -ge 1 ] || break
  echo "screen: setting $i: $setting ($left minutes left)"
  if [ "${SCREEN_PARALLEL:-0}" = 1 ]; then
    run_setting "$i" "$setting" > "${OUT:?}/$name-$i.log" 2>&1 &
  else
    run_setting "$i" "$setting"
  fi
done
wait
