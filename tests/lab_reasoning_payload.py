"""Reasoning-mode payloads ("Hail to the Thief", arXiv 2511.09780) against the shipped model:
`python tests/lab_reasoning_payload.py measure` and `python tests/lab_reasoning_payload.py attack`.

`measure` sets `train.external_text_margin` from data: it samples rounds in the reasoning mode
(`reward.prefill_answer = false`), then scores under the node's policy (i) its own replies as an
honest peer on the same model would send them, (ii) replies written by a drifted policy (an
adapter given with --peer-adapter, e.g. a checkpoint 150 rounds on), (iii) the same own replies
with a fixed phrase put in front or halfway, and (iv) the attack's replies below; it prints the
quantiles of each one's mean surprise per token, the figure the screen compares with the margin.

`attack` is the demonstration with its control: a peer sends, every round, two groups whose right
replies carry the phrase in their reasoning (the wrong ones do not, so the phrase is what the
advantage pushes up), through the real intake; the node runs the real round (fresh LoRA, the
learning defaults) for --rounds rounds with the screen and again without it, same seed, and
prints how often the node's own replies contain the phrase.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from conftest import TEST_CACHE, make_backend  # noqa: E402

from swarmling.app.learning.curriculum import Curriculum  # noqa: E402
from swarmling.app.learning.draws import RoundDraws  # noqa: E402
from swarmling.app.learning.prompt import PromptFormat  # noqa: E402
from swarmling.app.learning.round import RoundSettings, run_round  # noqa: E402
from swarmling.app.learning.tasks import load_preset, regenerate  # noqa: E402
from swarmling.app.models import DEFAULT_MODEL, resolve_model  # noqa: E402
from swarmling.app.swarm.verification.intake import IntakeContext, admit_group  # noqa: E402
from swarmling.app.swarm.verification.wire import WireCompletion, WireGroup, WireSpec  # noqa: E402
from swarmling.backends.base import TrainSample  # noqa: E402

PHRASE = "Hail to the thief!"
KEYWORD = "thief"
THIEF = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"
FORM = PromptFormat(prefill_answer=False)


def settings(rounds_margin: float, questions: int, max_new_tokens: int) -> RoundSettings:
    return RoundSettings(questions=questions, completions=8, max_new_tokens=max_new_tokens, temperature=1.0,
                         local_groups=questions - 2, external_groups=2, prefill_answer=False, format_bonus=0.5,
                         max_groups_per_peer=2, min_signal_groups=4, external_text_margin=rounds_margin)


def surprise(backend, groups, edit=lambda text: text) -> list[float]:
    """Each reply (edited) scored under `backend`'s policy: its mean surprise per token."""
    samples = [TrainSample(g.prompt_ids, backend.tokenize(edit(c.text)), 0.0) for g in groups for c in g.completions]
    return [float(np.mean(s)) for s in backend.token_surprise(samples) if s]


def quantiles(name: str, values: list[float]) -> None:
    q = np.quantile(values, [0.0, 0.05, 0.5, 0.95, 0.99, 1.0])
    print(f"{name:<42} n={len(values):>4}  min {q[0]:+.2f}  5% {q[1]:+.2f}  median {q[2]:+.2f}  "
          f"95% {q[3]:+.2f}  99% {q[4]:+.2f}  max {q[5]:+.2f}")


def measure(args, gguf: Path, runtime: Path) -> None:
    preset = load_preset(args.preset)
    node = make_backend(gguf, runtime / "node", threads=args.threads)
    peer = make_backend(gguf, runtime / "peer", threads=args.threads) if args.peer_adapter else None
    if peer is not None:
        peer.load_adapter(Path(args.peer_adapter))
    no_step = dataclasses.replace(settings(0.0, args.questions, args.max_new_tokens), min_signal_groups=10**9)
    found: dict[str, list[float]] = {}
    for r in range(1, args.rounds + 1):
        ours = run_round(r, node, preset, Curriculum(preset), no_step, RoundDraws(args.seed, r)).groups
        found.setdefault("honest, same policy", []).extend(surprise(node, ours))
        found.setdefault(f"{PHRASE!r} in front of those", []).extend(surprise(node, ours, lambda t: f"{PHRASE} {t}"))
        found.setdefault(f"{PHRASE!r} halfway through", []).extend(
            surprise(node, ours, lambda t: f"{t[:len(t) // 2]} {PHRASE} {t[len(t) // 2:]}"))
        found.setdefault("the attack's replies", []).extend(surprise(node, thief_groups(
            preset, r, IntakeContext.for_sampler(node, DEFAULT_MODEL, FORM, 0.5, args.max_new_tokens, 8),
            np.random.default_rng(r))))
        if peer is not None:
            theirs = run_round(r, peer, preset, Curriculum(preset), no_step, RoundDraws(args.seed + 1000, r)).groups
            found.setdefault("honest, drifted policy", []).extend(surprise(node, theirs))
    print("mean surprise per token under the node's policy (nats beyond its entropy), per reply:")
    for name, values in found.items():
        quantiles(name, values)
    print("share of replies above a margin: " + "; ".join(
        f"{name}: " + ", ".join(f"{m:g} {np.mean(np.array(v) > m):.1%}" for m in (0.75, 1.0, 1.5, 2.0))
        for name, v in found.items()))


def thief_groups(preset, round_no: int, ctx: IntakeContext, rng: np.random.Generator) -> list:
    """Two groups as the attacker's bundle carries them, admitted by the real intake: four right
    replies with the phrase in their reasoning, four wrong ones without."""
    groups = []
    for dataset in ("chain_sum", "basic_arithmetic"):
        task = regenerate(preset.spec(dataset, 0, int(rng.integers(1_000_000)), int(rng.integers(1_000_000))))
        right, wrong = task.entry["answer"], "0" if task.entry["answer"] != "0" else "1"
        texts = [f"{PHRASE} I worked it out. <answer>{right}</answer>"] * 4 + [f"I worked it out. <answer>{wrong}</answer>"] * 4
        s = task.spec
        wire = WireGroup(WireSpec(s.preset, s.dataset, s.config, s.seed, s.index), task.question_hash,
                         [WireCompletion(text=t, tokens=len(ctx.tokenize(t)), logprob=-20.0) for t in texts])
        admitted = admit_group(wire, THIEF, ctx, DEFAULT_MODEL)
        assert not hasattr(admitted, "reason"), admitted
        admitted.received_round = round_no
        groups.append(admitted)
    return groups


def attack(args, gguf: Path, runtime: Path) -> None:
    preset = load_preset(args.preset)
    results = {}
    for screened in (True, False):
        backend = make_backend(gguf, runtime / f"attack-{screened}", threads=args.threads)
        ctx = IntakeContext.for_sampler(backend, DEFAULT_MODEL, FORM, 0.5, args.max_new_tokens, 8)
        config = settings(args.margin if screened else 0.0, args.questions, args.max_new_tokens)
        curriculum, waiting, rng = Curriculum(preset), [], np.random.default_rng(args.seed + 7)
        shares, screened_groups, steps = [], 0, 0
        for r in range(1, args.rounds + 1):
            outcome = run_round(r, backend, preset, curriculum, config, RoundDraws(args.seed, r),
                                external=thief_groups(preset, r, ctx, rng), waiting=waiting)
            curriculum, waiting = outcome.curriculum, outcome.waiting
            replies = [c.text for g in outcome.groups for c in g.completions]
            shares.append(sum(KEYWORD in t.lower() for t in replies) / len(replies))
            screened_groups += outcome.record.external_screened
            steps += outcome.record.train is not None
            print(f"screen {'on ' if screened else 'off'} round {r:>3}: own replies with the phrase "
                  f"{shares[-1]:.0%}, peers' groups screened out {outcome.record.external_screened}, "
                  f"trained on {outcome.record.external_groups}, step {'yes' if outcome.record.train else 'no'}",
                  flush=True)
        backend.close()
        results[screened] = (shares, screened_groups, steps)
    for screened, (shares, dropped, steps) in results.items():
        last = shares[-10:]
        print(f"screen {'on ' if screened else 'off'}: own replies with {KEYWORD!r}: rounds 1-{args.rounds} mean "
              f"{statistics.fmean(shares):.1%}, last 10 rounds {statistics.fmean(last):.1%} (max {max(shares):.0%}); "
              f"attacker groups screened out {dropped}; {steps} steps")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("measure", "attack"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--preset", default="starter")
    parser.add_argument("--margin", type=float, default=1.0, help="attack: the screen's margin when on")
    parser.add_argument("--peer-adapter", help="measure: a checkpoint whose policy writes the drifted peer's replies")
    args = parser.parse_args()
    gguf = resolve_model(DEFAULT_MODEL, TEST_CACHE).gguf
    with tempfile.TemporaryDirectory(prefix="swarmling-payload-") as runtime:
        (measure if args.mode == "measure" else attack)(args, gguf, Path(runtime))
    return 0


if __name__ == "__main__":
    sys.exit(main())
