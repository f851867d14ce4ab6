#!/usr/bin/env bash
# oneDNN primitive cache A/B, second part (memory), the rescue grid paused (SIGSTOP) meanwhile.
. /root/venv/bin/activate
cd /root/runs/peak
grid=$(pgrep -f "experiment --design rescue" | tr '\n' ' ')
kill -STOP $grid; echo "paused $grid at $(date +%T)" >> ab.log
{ ONEDNN_PRIMITIVE_CACHE_CAPACITY=32 python dnn_ab.py 6 2>>ab.err
  echo "with MALLOC_MMAP_THRESHOLD_=131072:"; MALLOC_MMAP_THRESHOLD_=131072 ONEDNN_PRIMITIVE_CACHE_CAPACITY=64 python dnn_ab.py 6 2>>ab.err; } >> ab.out
kill -CONT $grid; echo "resumed at $(date +%T)" >> ab.log
