from __future__ import annotations

import numpy as np

from swarmling.app.learning.curriculum import Curriculum
from swarmling.app.learning.tasks import load_preset


def test_levels_follow_success():
    cur = Curriculum(load_preset("starter"))
    for _ in range(6):
        cur.record("chain_sum", cur.progress["chain_sum"].level, 0.9)
    assert cur.progress["chain_sum"].level >= 1
    level = cur.progress["chain_sum"].level
    for _ in range(20):
        cur.record("chain_sum", cur.progress["chain_sum"].level, 0.0)
    assert cur.progress["chain_sum"].level < level
    # stale groups from an older level do not move the new one
    before = cur.progress["chain_sum"].groups
    cur.record("chain_sum", 99, 1.0)
    assert cur.progress["chain_sum"].groups == before


def test_picks_favour_tasks_at_the_edge_of_ability():
    cur = Curriculum(load_preset("starter"))
    cur.progress["letter_counting"].success = 0.5
    w = dict(zip(cur.preset.datasets, cur.weights()))
    assert w["letter_counting"] == max(w.values()) and min(w.values()) > 0
    picks = cur.pick(np.random.default_rng(0), 200)
    assert sum(d == "letter_counting" for d, _ in picks) > 200 / len(w)


def test_format_bonus_fades_and_state_round_trips():
    cur = Curriculum(load_preset("starter"))
    assert cur.format_bonus(0.5) == 0.5
    for _ in range(30):
        cur.record_tag_rate(1.0)
    assert cur.format_bonus(0.5) < 0.01
    cur.record("leg_counting", 0, 0.4)
    again = Curriculum.from_dict(load_preset("starter"), cur.to_dict())
    assert again.to_dict() == cur.to_dict()
    assert Curriculum.from_dict(load_preset("sapo9"), cur.to_dict()).tag_rate == 0.0  # other preset: fresh


def test_a_new_level_is_not_starved_by_its_fresh_start():
    cur = Curriculum(load_preset("starter"))
    for name in cur.preset.datasets:
        cur.progress[name].success = 0.3  # all at the edge of ability
    while cur.progress["chain_sum"].level == 0:
        cur.record("chain_sum", 0, 0.9)
    assert cur.progress["chain_sum"].level == 1 and cur.progress["chain_sum"].groups == 0
    w = dict(zip(cur.preset.datasets, cur.weights()))
    assert w["chain_sum"] >= max(w.values()) - 1e-12  # unknown difficulty: explored first, not last
