"""The configuration's schema: its sections, keys, defaults and checks, and which keys a running
node takes without a restart (LIVE_KEYS)."""

from __future__ import annotations

import re
from datetime import time as dtime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ...backends.registry import NAMES

# "auto", or a backend the registry has (one entry there adds a backend's name here).
BackendName = Literal[("auto", *NAMES)]  # type: ignore[valid-type]

PEER_ADDR = re.compile(r"^/(ip4|ip6|dns|dns4|dns6)/[^/\s]+/tcp/\d{1,5}/p2p/[1-9A-HJ-NP-Za-km-z]{32,64}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    # A shipped model's name (see `swarmling doctor`), a path to a local .gguf file, or (CUDA
    # backend) a Hugging Face model folder or an id already in the local Hugging Face cache.
    name: str = "smollm2-135m"


class BackendSection(_Section):
    kind: BackendName = "auto"
    threads: int | None = Field(default=None, ge=1, le=1024)
    # The CPU sampler's weights (app/sizing.sampler_weights_choice): "auto" samples from an F16 copy
    # of a Q4_1 file where the CPU has AVX-512 (faster, and nearer the trainer), "f16" from an F16
    # copy of any quantized file, "shipped" from the file as it is.
    sampler_weights: Literal["auto", "f16", "shipped"] = "auto"


class RoundSection(_Section):
    # The tasks (assets/presets/): starter-2 pays no constant answer; "starter", its predecessor, is
    # kept so that nodes of older releases stay verifiable (and for the experiments that ran on it).
    preset: str = "starter-2"
    questions: int | None = Field(default=None, ge=1, le=256)  # Q: questions sampled per round
    completions: int | None = Field(default=None, ge=2, le=64)  # G: completions per question
    max_new_tokens: int | None = Field(default=None, ge=4, le=8192)
    temperature: float = Field(default=1.0, gt=0.05, le=2.0)
    # I local + J external question-groups trained on per round (the paper's best: 4 / 4). When
    # fewer than J external groups are available (no peers yet), local groups fill the gap.
    local_groups: int | None = Field(default=None, ge=0, le=256)
    external_groups: int = Field(default=4, ge=0, le=256)
    # How peers' groups join the own ones (learning/group_selection.py): "fill" trains on every own
    # group with signal and lets peers' groups take the places left, up to J; "mix" is the paper's
    # fixed I + J, where peers' groups take places the own round had signal for.
    peer_groups: Literal["fill", "mix"] = "fill"
    # At most this many external groups from any one peer per round.
    max_groups_per_peer: int = Field(default=2, ge=1, le=256)
    # Rescue (learning/rescue.py): the first `common_questions` of a round's questions come from a
    # stream every node of the swarm derives by itself, and an own group on one with no right reply
    # takes peers' verified right replies on the same question (`rescue`). 2 of 8: most of a
    # round stays the node's own curriculum's draw. "clock" windows the stream by wall-clock time
    # (asynchronous nodes meet); "round" by the round number (an experiment's lockstep nodes).
    common_questions: int = Field(default=2, ge=0, le=256)
    rescue: bool = True
    common_window: Literal["clock", "round"] = "clock"
    # A focus (specialists, experiments): local questions only from these of the preset's datasets
    # (default: all of them) ...
    datasets: tuple[str, ...] = ()
    # ... and these datasets held at a level (the curriculum does not move them, no replay); when
    # every dataset drawn is held, datasets are picked uniformly: the curriculum is off.
    levels: dict[str, int] = Field(default_factory=dict)


def mix_problem(questions: int, external_groups: int) -> str | None:
    """SAPO's I + J rule as the settings screen enforces it: J must leave room for at least one of
    the node's own groups. A config file or flag beyond it is still accepted (`defaults.resolve`
    then trains on one local group a round), as it always was."""
    if external_groups >= questions:
        return (f"external groups (J = {external_groups}) must be below questions per round (Q = {questions}): "
                "at least one of the node's own groups is trained on each round")
    return None


class TrainSection(_Section):
    # "lora": a LoRA adapter on the frozen base (every backend). "full": every weight trains
    # (CUDA backend only, when the GPU has room for weights + gradients + AdamW moments).
    mode: Literal["lora", "full"] = "lora"
    # AdamW's step size once warmed up: linearly from 0 over the first `warmup_steps` updates
    # (Adam's moments are mostly noise until then). Above the literature's range for LoRA RL on
    # small batches (5e-5 to 1e-4): chosen on the right trainer, where 1e-4 learnt least
    # (docs/learning.md, assets/results/defaults-screen-volunteer).
    learning_rate: float = Field(default=3e-4, gt=0, le=1.0)
    warmup_steps: int = Field(default=5, ge=0, le=100_000)
    # Step only once this many question-groups with right *and* wrong replies (a strict reward
    # spread; a spread of the format bonus alone does not count) have accumulated, this node's and
    # peers'. Groups waiting for the step stay on-policy (the policy has not moved since they were
    # sampled); they are kept in the checkpoint. 1: a step on every round with a signal. It was 4
    # (under Adam a step from one group moves the adapter as far as one from eight), chosen on the
    # eager-bf16 trainer; on the trainer that ships, 1 learnt faster in every run of the defaults
    # screen (volunteer design, tuning seeds 611-612, assets/results/defaults-screen-volunteer/):
    # held-out 10.4-12.5 % at round 20 in all five runs at 1, 7.1-9.2 % in all six at 4 with the
    # same learning rates (3e-4 to 1e-3) and beta <= 0.05. A fresh node no longer waits rounds for
    # its first step.
    min_signal_groups: int = Field(default=1, ge=0, le=1024)
    # The anchor's weight (k2 toward the base model, backends/torch_grpo.py). Screened: 0.2 learnt
    # least at lr 3e-4 (6.2-6.7 % at round 30); 0 and 0.05 were within one standard error (~2
    # points) of each other; 0.05 kept for the long runs' sake (a 500-round run holds it).
    kl_beta: float = Field(default=0.05, ge=0, le=100)
    lora_r: int = Field(default=16, ge=1, le=1024)
    lora_alpha: float = Field(default=32.0, gt=0)
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.28, ge=0, le=10)
    # Truncated importance weight pi_trainer / pi_sampler, capped here; 0 switches it off.
    importance_cap: float = Field(default=2.0, ge=0, le=100)
    # Peers' completions were sampled by other policies. When > 0, each external completion is
    # weighted by min(cap, p_ours(text) / p_sender(text)) from the sender's summed logprob
    # (sequence-level truncated importance sampling); 0 (default) trains on them as on-policy.
    external_importance_cap: float = Field(default=0.0, ge=0, le=100)
    # A peer's reply with a negative advantage (pushed down) is weighted by at most this:
    # min(cap, p_ours(text) / p_sender(text)), the sender's llama.cpp logprob compared with ours
    # corrected by our own sampler/trainer gap (TOPR, arXiv 2503.14286: pushing down text our
    # policy would not write is what destabilises shared-rollout GRPO). A peer on another model
    # gives no comparable logprob: its wrong replies are not trained on. 0: off (full weight).
    external_negative_cap: float = Field(default=1.0, ge=0, le=100)
    # Reasoning mode (reward.prefill_answer = false): a peer's reply that surprises this node's
    # policy by more than this many nats per token beyond the policy's own entropy is dropped with
    # its group before training (a payload riding on a right answer's reasoning, arXiv 2511.09780;
    # app/learning/screening.py). 0: off. With the prefill there is no free text.
    external_text_margin: float = Field(default=1.0, ge=0, le=100)
    max_grad_norm: float = Field(default=1.0, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    microbatch_tokens: int | None = Field(default=None, ge=64)
    # Per-layer activation checkpointing in the torch trainer: recompute each layer's activations
    # in the backward pass instead of keeping them (less memory, ~1.4x the training time).
    # Unset: on the CPU backend, on only when the memory limit (resources.max_memory_gb, or the
    # guest's share of a machine under ~5.6 GB) is too tight for a group's pass without it; on
    # CUDA off; the MLX trainer has none.
    activation_checkpointing: bool | None = None
    # The CPU trainer's frozen base in bf16, cast once (the LoRA weights, AdamW, the output head and
    # the log-probabilities stay fp32): ~1.6-1.9x the fp32 step where the CPU has AVX-512 BF16 or
    # AMX, 14-22x slower where it has not. "auto": on where the CPU reports them, the trainer is
    # compiled (train.cpu_compile: eager bf16 rounds the adapter's updates away, app/sizing.py) and a
    # start-up check finds it agrees with fp32 on a fixed batch (backends/bf16_check.py); "on":
    # always (the check only warns); "off": fp32. `swarmling doctor`, the backend line and `bench` say which runs.
    cpu_bf16: Literal["auto", "on", "off"] = "auto"
    # The CPU trainer's decoder layers through torch.compile (inductor writes C++ for the
    # elementwise ops between the matmuls): ~1.3x a bf16 step, 1.07-1.15x an fp32 one on 2 cores.
    # The graphs are built in the background at low priority, compiled in a child process
    # (backends/compile_process.py), while the first steps run eagerly in fp32; a step waits at
    # most for one pass that loads them, never for the compiler.
    # "auto": on where a C++ compiler is found; "on": tried anyway; "off": never. A first pass
    # that fails compiled runs again without it, which then stays off.
    cpu_compile: Literal["auto", "on", "off"] = "auto"

    @field_validator("cpu_bf16", "cpu_compile", mode="before")
    @classmethod
    def _bf16_bool(cls, value: object) -> object:
        # Earlier versions took true / false: they mean "on" / "off".
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("lora_dropout")
    @classmethod
    def _no_dropout(cls, value: float) -> float:
        if value != 0:
            raise ValueError(
                "must be 0: with dropout the trained policy is not the one that sampled (pi_old and the "
                "importance weights would compare two different networks)"
            )
        return value

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("name at least one module, e.g. ['q_proj', 'v_proj']")
        return value


class RewardSection(_Section):
    # Pre-start every reply with "<answer>" so that a tiny model answers in the scored format.
    prefill_answer: bool = True
    # Bonus for a well-formed <answer>…</answer>, scaled by (1 - the node's tag rate): it fades
    # as the format is learnt, and is never enough to make a wrong answer beat a right one.
    format_bonus: float = Field(default=0.5, ge=0, le=1)


class EvalSection(_Section):
    # The held-out score (app/learning/evaluation.py): at every start and after every N rounds; 0 = never.
    # One evaluation (240 fixed items and 96 at the node's levels: 336 prompts to prefill, 42x a
    # round's 8) costs about 11 default rounds' time (measured on 1 thread, same machine, same
    # run); every 120 rounds is ~8% of the node's time.
    every_rounds: int = Field(default=120, ge=0, le=100_000)


class CheckpointSection(_Section):
    keep: int = Field(default=3, ge=1, le=1000)


class SwarmSection(_Section):
    enabled: bool = True
    # Nodes only meet others with the same name (topics are namespaced by it).
    name: str = Field(default="main", min_length=1, max_length=64, pattern=r"^[a-z0-9_][a-z0-9_.-]*$")
    listen_host: str = "0.0.0.0"
    port: int = Field(default=38433, ge=0, le=65535)  # 0: any free port
    # /ip4|ip6|dns|dns4|dns6/<host>/tcp/<port>/p2p/<peer id> addresses (any libp2p peer on TCP;
    # names are resolved at each dial): bootstrap nodes and helpers to join through (`swarmling
    # join` adds an invite's), and static peers to stay connected to (also --peer). Peers met
    # before are remembered across restarts.
    bootstrap: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()
    mdns: bool = True  # find and join nodes on the local network
    # Bundles fetched per round are capped by this many KiB, whatever the swarm's size.
    inbound_kib_per_round: int = Field(default=256, ge=8, le=65536)

    @field_validator("bootstrap", "peers")
    @classmethod
    def _peer_addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for addr in value:
            if not PEER_ADDR.match(addr):
                raise ValueError(
                    f"{addr!r} is not a peer address; expected /ip4/<host>/tcp/<port>/p2p/<peer id> "
                    "or /dns4/<name>/tcp/<port>/p2p/<peer id> (`swarmling id` on the other node prints it)"
                )
        return value


# A time window "HH:MM-HH:MM" in local time (may wrap past midnight): resources.windows.
WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


def parse_window(text: str) -> tuple[dtime, dtime]:
    m = WINDOW.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a time window; expected HH:MM-HH:MM, e.g. 22:00-07:00")
    h1, m1, h2, m2 = map(int, m.groups())
    if (h1, m1) == (h2, m2):
        raise ValueError(f"{text!r} is an empty window")
    return dtime(h1, m1), dtime(h2, m2)


class ResourcesSection(_Section):
    """Being a good guest. CPU threads are backend.threads (default: all cores but one)."""

    # Resident memory the node may use, in GB (CPU and MLX backends): the training microbatch shrinks
    # to fit, activation checkpointing comes on (CPU) if a group's pass needs it, or the node refuses
    # to start, saying what would fit (also when generating the round needs more). Unset: a guest's
    # limit, 2.5 GB or 45% of a smaller machine's memory.
    max_memory_gb: float | None = Field(default=None, gt=0, le=4096)
    # Below this much free disk where checkpoints and logs go, the node suspends itself (and says so).
    min_free_disk_mb: int = Field(default=1024, ge=0)
    nice: int = Field(default=10, ge=0, le=19)  # CPU priority offset: the user's programs come first
    pause_on_battery: bool = True
    resume_after_plugged_s: int = Field(default=60, ge=0, le=86400)  # mains must stay connected this long
    only_when_idle: bool = False  # where the OS tells (macOS, X11 with xprintidle)
    idle_after_s: int = Field(default=300, ge=10, le=86400)
    windows: tuple[str, ...] = ()  # run only inside these local-time windows, e.g. ["22:00-07:00"]
    on_suspend: Literal["abandon", "finish"] = "abandon"  # the round in flight when a rule suspends the node
    release_memory_after_s: int = Field(default=900, ge=0)  # suspended this long: free the model (0: never)
    check_every_s: float = Field(default=15.0, ge=1, le=3600)
    # Swarm traffic cap, KiB/s averaged over a round: bundles fetched (unset: swarm.inbound_kib_per_round),
    # and the upload, half for others' announcements forwarded (unset: 64 KiB/s) and half for our
    # bundles served (unset: the upload slots alone): swarm/host/forwarding.py.
    bandwidth_kib_s: int | None = Field(default=None, ge=1)

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for window in value:
            parse_window(window)
        return value


class LoggingSection(_Section):
    # The log file in the log dir rotates at this size, keeping this many old files.
    max_mb: float = Field(default=10.0, gt=0, le=10_000)
    keep: int = Field(default=5, ge=1, le=1000)


class RunSection(_Section):
    # What Ctrl-C / SIGTERM does to the round in flight: drop it now, or finish it first.
    on_stop: Literal["abandon", "finish"] = "abandon"
    seed: int | None = Field(default=None, ge=0, lt=2**63)


class Config(_Section):
    model: ModelSection = ModelSection()
    backend: BackendSection = BackendSection()
    round: RoundSection = RoundSection()
    train: TrainSection = TrainSection()
    reward: RewardSection = RewardSection()
    eval: EvalSection = EvalSection()
    checkpoint: CheckpointSection = CheckpointSection()
    swarm: SwarmSection = SwarmSection()
    resources: ResourcesSection = ResourcesSection()
    logging: LoggingSection = LoggingSection()
    run: RunSection = RunSection()


# Keys the settings screen may change while the node runs: they apply from the next round (or
# the guest monitor's next check). Any other change waits for a restart — round.temperature too:
# the trainer's pi_old, gradient and importance weights are computed at the temperature the
# backend was built with, so sampling at another one would train on a different distribution.
LIVE_KEYS = frozenset({
    "round.questions", "round.external_groups", "round.local_groups", "round.max_groups_per_peer",
    "round.completions", "round.max_new_tokens", "run.on_stop",
    "resources.pause_on_battery", "resources.resume_after_plugged_s", "resources.only_when_idle",
    "resources.idle_after_s", "resources.windows", "resources.on_suspend", "resources.min_free_disk_mb",
    "resources.release_memory_after_s", "resources.bandwidth_kib_s", "eval.every_rounds",
})


def changed_keys(old: Config, new: Config) -> list[str]:
    """Dotted keys whose value differs between two configs."""
    a, b = old.model_dump(), new.model_dump()
    return [f"{section}.{key}" for section in b for key in b[section] if b[section][key] != a[section][key]]


class ConfigError(ValueError):
    """A message for the user: which key, where it came from, what is accepted."""
