"""Generation speed and log-prob agreement of the node's sampler on GGUF files of different
weight types, same prompts, same seed, alternating (ratio against Q4_1 in the same run)."""
import sys, time, statistics
from pathlib import Path
import numpy as np

from swarmling.backends.llama_cpp_generator import LlamaCppGenerator
from swarmling.backends.base import ChatPrompt, SamplingParams
from swarmling.backends.chat_template import render

files = {q: Path(p) for q, p in (a.split("=") for a in sys.argv[1:])}
sys_msg = "Reply with only the final answer inside <answer></answer> tags."
qs = ["What is 17 + 25 - 3?", "How many legs do 2 cats and 1 spider have?", "Convert 1011 from base 2 to base 10.",
      "What is 4.5 + 2.25 + 1.1?", "Solve for x: 3x + 4 = 19", "What is 8 * 7 - 12?",
      "What day of the week is 3 days after Monday?", "How many r's are in 'strawberry'?"]
gens = {q: LlamaCppGenerator(p, 2) for q, p in files.items()}
ref = gens[next(iter(gens))]
tmpl = ref.meta("tokenizer.chat_template")
prompts = [ref.tokenize_prompt(render(ChatPrompt(sys_msg, q, "<answer>"), tmpl)) for q in qs]
params = SamplingParams(temperature=1.0, max_new_tokens=48, seed=1, stop=("</answer>",))
times = {q: [] for q in gens}
first = {}
for rep in range(4):
    for q, g in gens.items():
        t = time.perf_counter()
        res = g.generate(prompts, 8, params)
        times[q].append(time.perf_counter() - t)
        p = g.last_profile
        if rep == 0:
            first[q] = res
        print(f"rep {rep} {q}: {times[q][-1]:.2f} s prefill {p.prefill_s:.2f} decode {p.decode_s:.2f} "
              f"steps {len(p.live_per_step)} tokens {res.generated_tokens}", flush=True)
base = next(iter(gens))
lengths = [[len(c.token_ids) for c in grp] for grp in first[base].completions]
rt = {q: [] for q in gens}
for rep in range(3):
    for q, g in gens.items():
        tok, sec = g.reference_decode(prompts, 8, lengths, 1.0, 11)
        rt[q].append(sec)
for q in gens:
    print(f"{q}: raw llama.cpp same lengths ({tok} tokens): median {statistics.median(rt[q]):.2f} s ratio {statistics.median(rt[q]) / statistics.median(rt[base]):.2f}")
for q in gens:
    print(f"{q}: median {statistics.median(times[q]):.2f} s  ratio to {base} {statistics.median(times[q]) / statistics.median(times[base]):.2f}")
