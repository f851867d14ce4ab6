"""Decode time on the sampler's F16 copy: no adapter, the node's f32 LoRA adapter, the same in f16.
Same prompts and lengths, alternated, 3 times each; one process, 2 threads."""
import shutil, statistics, sys
from pathlib import Path
import numpy as np
import gguf
from swarmling.backends.llama_cpp_generator import LlamaCppGenerator

model = Path(sys.argv[1]); f32 = Path(sys.argv[2]); out = Path(sys.argv[3])
f16 = out / "adapter-f16.gguf"
r = gguf.GGUFReader(str(f32))
w = gguf.GGUFWriter(str(f16), "llama")
w.add_string("general.type", "adapter"); w.add_string("adapter.type", "lora")
alpha = float(r.fields["adapter.lora.alpha"].parts[-1][0])
w.add_float32("adapter.lora.alpha", alpha)
for t in r.tensors:
    w.add_tensor(t.name, np.asarray(t.data, dtype=np.float16).reshape(t.data.shape))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
print("alpha", alpha, "tensors", len(r.tensors), r.tensors[0].tensor_type.name, "->", f16.stat().st_size, "bytes vs", f32.stat().st_size)

g = LlamaCppGenerator(model, 2)
prompts = [g.tokenize(f"Question {i}: what is {i * 7} plus {i * 13}? Think, then answer.") for i in range(8)]
lengths = [[40 - (j * 4) for j in range(8)] for _ in prompts]
times = {"none": [], "f32": [], "f16": []}
g.reference_decode(prompts[:1], 1, [[2]], 1.0, 11)
for rep in range(3):
    for name, path in (("none", None), ("f32", f32), ("f16", f16)):
        g.set_adapter(path)
        tokens, s = g.reference_decode(prompts, 8, lengths, 1.0, 11)
        times[name].append(s)
g.close()
med = {k: statistics.median(v) for k, v in times.items()}
print("tokens", tokens, {k: [round(x, 3) for x in v] for k, v in times.items()})
print(f"medians: none {med['none']:.3f} s, f32 adapter {med['f32']:.3f} s ({med['f32']/med['none']:.2f}x), "
      f"f16 adapter {med['f16']:.3f} s ({med['f16']/med['none']:.2f}x); f16/f32 {med['f16']/med['f32']:.2f}")
