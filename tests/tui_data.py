"""Fixed events for the TUI's snapshot and view tests, and a control that records what the app
asked of the node (pure UI logic: the real node is driven in test_tui_pilot.py)."""

from __future__ import annotations

from swarmling.app.config import Config
from swarmling.app.learning.round_record import RoundRecord
from swarmling.app.sizing import RoundShape
from swarmling.app.events import (
    CompletionView,
    GroupView,
    NodeStarted,
    Notice,
    PeerView,
    PhaseChanged,
    Progress,
    RoundFinished,
    RoundRollouts,
    StateChanged,
    SwarmUpdated,
)

PEER_A = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"
PEER_B = "12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"
ME = "12D3KooWBmwXN8r7zTg8m4vTXvVTLvRZ1mbNxgPg3Dz7Tt7G1eHa"
DATASETS = ("basic_arithmetic", "chain_sum", "leg_counting")


def metrics(round_no: int) -> RoundRecord:
    reward = min(0.9, 0.1 + 0.06 * round_no)
    return RoundRecord(
        round=round_no,
        reward_mean=reward,
        shaped_reward_mean=reward + 0.1,
        format_bonus=0.05,
        questions=8,
        completions=64,
        solved=min(8, round_no // 2 + 1),
        signal_share=0.75,
        learnable_groups=5,
        tag_rate=0.9,
        local_groups=4,
        external_groups=2,
        external_available=5,
        external_reward_mean=reward * 0.8 if round_no > 2 else None,
        trained_samples=48,
        generated_tokens=700,
        prefill_tokens=560,
        tokens_per_s=410.0,
        wall_seconds=31.0,
        seconds={"tasks": 0.1, "generate": 9.8, "score": 0.2, "share": 0.01, "sample": 0.3, "train": 19.5,
                 "hand-off": 0.4},
        per_dataset={d: min(1.0, reward + 0.1 * i) for i, d in enumerate(DATASETS)},
        levels={d: round_no // 4 + i for i, d in enumerate(DATASETS)},
        external_advantage_share=0.3,
        **({"eval_accuracy": min(0.6, 0.08 + 0.04 * round_no), "eval_of_round": round_no if round_no > 1 else 0,
            "eval_per_dataset": {d: 0.1 for d in DATASETS}, "eval_seconds": 6.0}
           if round_no == 1 or round_no % 4 == 0 else {}),
    )


def group(round_no: int, source: str, i: int) -> GroupView:
    return GroupView(
        round=round_no,
        source=source,
        dataset=DATASETS[i % 3],
        level=1,
        question=f"What is {round_no} + {i} * 7? Give only the number.",
        completions=(
            CompletionView(f"{round_no + i * 7}</answer>", 1.5, 1.0),
            CompletionView("I think it is 12</answer>", 0.5, 0.0),
            CompletionView("", 0.0, 0.0),
        ),
        trained=i % 2 == 0,
    )


def events(rounds: int = 12) -> list:
    out = [
        NodeStarted("cpu", "llama.cpp + torch, 2 threads", "smollm2-135m", "starter", "no GPU found", 0,
                    RoundShape(questions=8, completions=8, max_new_tokens=24, local_groups=4), ME, "main"),
        StateChanged("running"),
        Notice("info", f"swarm 'main': peer {ME}, listening on /ip4/127.0.0.1/tcp/38433"),
    ]
    for r in range(1, rounds + 1):
        out += [PhaseChanged(r, "generate"), RoundFinished(metrics(r)),
                RoundRollouts(r, (group(r, "local", 0), group(r, "local", 1), group(r, PEER_A, 2)))]
    out += [
        SwarmUpdated(ME, ("/ip4/192.168.1.20/tcp/38433/p2p/" + ME,),
                     (PeerView(PEER_A, f"/ip4/192.168.1.21/tcp/38433/p2p/{PEER_A}", True, 0.07, 14, 6, 0, 0.0),
                      PeerView(PEER_B, "", True, 0.31, 9, 3, 2, -10.0)), 1_234_567, 987_654),
        Notice("warning", f"refused from a peer: {PEER_B[:16]}: answer does not match the regenerated task"),
        PhaseChanged(rounds + 1, "tasks"),
        PhaseChanged(rounds + 1, "generate"),
        Progress(rounds + 1, "generate", 40, 64, 412.0),
    ]
    return out


class ReplayControl:
    """Feeds fixed events at start and records the calls the app makes."""

    def __init__(self, queue, evs: list | None = None) -> None:
        self.queue = queue
        self.evs = events() if evs is None else evs
        self.config = Config()
        self.calls: list = []
        self.paused = False
        self.alive = True
        self.saved: list[dict] = []

    def start(self) -> None:
        for e in self.evs:
            self.queue(e)

    def pause(self) -> None:
        self.calls.append("pause")
        self.paused = True

    def finish_then_pause(self) -> None:
        self.calls.append("finish")
        self.paused = True

    def resume(self) -> None:
        self.calls.append("resume")
        self.paused = False

    def stop(self) -> None:
        self.calls.append("stop")
        self.alive = False

    def save_settings(self, changes):
        self.saved.append(dict(changes))
        return ["round.preset"] if changes.get("round.preset") != self.config.round.preset else [], []
