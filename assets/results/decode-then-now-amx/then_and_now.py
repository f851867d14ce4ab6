"""Issue 38's decode target as one same-run ratio: the sampler as the issue found it (the shipped
Q4_1 file, flash attention off) against the sampler that ships now (its F16 copy, flash attention
on), each without and with a trained node's LoRA adapter. Same 8 prompts x 8 replies, the same
reply lengths (the Q4_1 sampler's own at T = 1, max 48 tokens) decoded by raw llama.cpp
(`reference_decode`), the four alternated, 3 times each, one process, 2 threads. Then each
sampler's own generate once, its decode steps fitted as seconds = fixed + per live reply x live.
Usage: python then_and_now.py Q4_1.gguf F16.gguf live-adapter.gguf"""
import statistics, sys
from pathlib import Path
import llama_cpp as lc
import numpy as np

from swarmling.backends.llama_cpp_generator import LlamaCppGenerator
from swarmling.backends.base import ChatPrompt, SamplingParams
from swarmling.backends.chat_template import render


class FlashOff(LlamaCppGenerator):
    """The sampler as issue 38 found it: flash attention off (the engine turns it on since ec3b10a)."""
    def _ensure_context(self, cells, seqs, batch):
        enabled = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        lc.LLAMA_FLASH_ATTN_TYPE_ENABLED = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        try:
            super()._ensure_context(cells, seqs, batch)
        finally:
            lc.LLAMA_FLASH_ATTN_TYPE_ENABLED = enabled


q4_1, f16, adapter = (Path(a) for a in sys.argv[1:4])
samplers = {"then (Q4_1, no flash attention)": FlashOff(q4_1, 2), "now (F16 copy, flash attention)": LlamaCppGenerator(f16, 2)}
then = next(iter(samplers.values()))
sys_msg = "Reply with only the final answer inside <answer></answer> tags."
qs = ["What is 17 + 25 - 3?", "How many legs do 2 cats and 1 spider have?", "Convert 1011 from base 2 to base 10.",
      "What is 4.5 + 2.25 + 1.1?", "Solve for x: 3x + 4 = 19", "What is 8 * 7 - 12?",
      "What day of the week is 3 days after Monday?", "How many r's are in 'strawberry'?"]
prompts = [then.tokenize_prompt(render(ChatPrompt(sys_msg, q, "<answer>"), then.meta("tokenizer.chat_template"))) for q in qs]
params = SamplingParams(temperature=1.0, max_new_tokens=48, seed=1, stop=("</answer>",))
lengths = [[len(c.token_ids) for c in grp] for grp in then.generate(prompts, 8, params).completions]
live = [sum(1 for ls in lengths for n in ls if n > step) for step in range(1, max(max(ls) for ls in lengths))]
print(f"lengths: {sum(map(sum, lengths))} tokens, {len(live)} decode steps, live replies {live[0]} at the first, "
      f"{live[len(live) // 2]} halfway, {live[-1]} at the last (mean {np.mean(live):.1f})", flush=True)
times = {(name, a): [] for name in samplers for a in ("no adapter", "adapter")}
for rep in range(3):
    for name, s in samplers.items():
        for a in ("no adapter", "adapter"):
            s.set_adapter(adapter if a == "adapter" else None)
            tokens, sec = s.reference_decode(prompts, 8, lengths, 1.0, 11)
            times[(name, a)].append(sec)
            print(f"rep {rep} {name}, {a}: {sec:.2f} s ({tokens} tokens)", flush=True)
med = {k: statistics.median(v) for k, v in times.items()}
names = list(samplers)
for a in ("no adapter", "adapter"):
    print(f"{a}: then {med[(names[0], a)]:.2f} s, now {med[(names[1], a)]:.2f} s: now/then {med[(names[1], a)] / med[(names[0], a)]:.2f}")
for name, s in samplers.items():
    s.set_adapter(adapter)
    s.generate(prompts, 8, params)
    p = s.last_profile
    per_live, fixed = np.polyfit(p.live_per_step, p.seconds_per_step, 1)
    print(f"{name}, adapter, its own generate: {len(p.live_per_step)} steps, a step {1000 * fixed:.1f} ms + "
          f"{1000 * per_live:.2f} ms a live reply; prefill {p.prefill_s:.2f} s, decode {p.decode_s:.2f} s")
