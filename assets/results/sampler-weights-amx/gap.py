"""Sampler/trainer gap per weight file: replies sampled by each llama.cpp file (T=1), their
per-token logprobs from that sampler against an fp32 torch forward of the converted Q4_1 model."""
import sys, statistics
from pathlib import Path
import numpy as np, torch

from swarmling.backends.llama_cpp_generator import LlamaCppGenerator
from swarmling.backends.base import ChatPrompt, SamplingParams
from swarmling.backends.chat_template import render
from transformers import AutoModelForCausalLM
torch.set_num_threads(1)
hf = sys.argv[1]
files = {q: Path(p) for q, p in (a.split("=") for a in sys.argv[2:])}
model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
sys_msg = "Reply with only the final answer inside <answer></answer> tags."
qs = ["What is 17 + 25 - 3?", "How many legs do 2 cats and 1 spider have?", "Convert 1011 from base 2 to base 10.",
      "What is 4.5 + 2.25 + 1.1?", "Solve for x: 3x + 4 = 19", "What is 8 * 7 - 12?",
      "What day of the week is 3 days after Monday?", "How many r's are in 'strawberry'?"]
for q, p in files.items():
    g = LlamaCppGenerator(p, 1)
    tmpl = g.meta("tokenizer.chat_template")
    prompts = [g.tokenize_prompt(render(ChatPrompt(sys_msg, x, "<answer>"), tmpl)) for x in qs]
    res = g.generate(prompts, 4, SamplingParams(temperature=1.0, max_new_tokens=32, seed=3, stop=("</answer>",)))
    diffs = []
    for pi, grp in enumerate(res.completions):
        for c in grp:
            ids = torch.tensor([prompts[pi] + c.token_ids])
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits[0].float(), -1)
            n = len(prompts[pi])
            tl = lp[n - 1:n - 1 + len(c.token_ids)].gather(1, torch.tensor(c.token_ids)[:, None])[:, 0].numpy()
            diffs.extend(np.abs(tl - np.array(c.logprobs)).tolist())
    d = np.array(diffs)
    print(f"{q}: {len(d)} tokens, mean |gap| {d.mean():.4f} nats, p95 {np.quantile(d, .95):.3f}, max {d.max():.3f}, "
          f"outside [0.8,1.2] {(np.abs(d) > np.log(1.2)).mean():.1%}", flush=True)
    g.close()
