#!/usr/bin/env bash
# oneDNN primitive cache A/B, alternated, the rescue grid paused (SIGSTOP) meanwhile.
. /root/venv/bin/activate
cd /root/runs/peak
grid=$(pgrep -f "experiment --design rescue" | tr '\n' ' ')
kill -STOP $grid; echo "paused $grid at $(date +%T)" >> ab.log
for rep in 1 2; do
  for cap in default 64 16; do
    if [ $cap = default ]; then python dnn_ab.py 6 2>>ab.err; else ONEDNN_PRIMITIVE_CACHE_CAPACITY=$cap python dnn_ab.py 6 2>>ab.err; fi
  done
done >> ab.out
kill -CONT $grid; echo "resumed at $(date +%T)" >> ab.log
