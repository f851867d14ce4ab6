#!/usr/bin/env bash
. /root/venv/bin/activate
cd /root/runs/stepprof
grid=$(pgrep -f "experiment --design rescue" | tr '\n' ' ')
kill -STOP $grid; echo "paused $grid at $(date +%T)" >> run.log
for cap in 1024 32; do
  ONEDNN_VERBOSE=2 ONEDNN_PRIMITIVE_CACHE_CAPACITY=$cap timeout 600 python prof.py > verbose-$cap.txt 2> err-$cap.txt
done
kill -CONT $grid; echo "resumed at $(date +%T)" >> run.log
