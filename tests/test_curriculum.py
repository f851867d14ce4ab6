"""The curriculum as a state machine: a dataset's level moves on the outcomes of its recent groups
(all right, all wrong, mixed), picks favour datasets that give mixed groups, a share of questions
replays the levels below, and the state survives a checkpoint (an older version's too)."""

from __future__ import annotations

import numpy as np
import pytest

from swarmling.app.learning.curriculum import (
    ALL_RIGHT,
    ALL_WRONG,
    MIN_GROUPS,
    MIXED,
    REPLAY_SHARE,
    WEIGHT_FLOOR,
    Curriculum,
    group_outcome,
)
from swarmling.app.learning.tasks import load_preset

RIGHT, WRONG, HALF = [1.0] * 4, [0.0] * 4, [1.0, 0.0, 1.0, 0.0]


def fresh() -> Curriculum:
    return Curriculum(load_preset("starter"))


def feed(cur: Curriculum, dataset: str, groups) -> None:
    for strict in groups:
        cur.record(dataset, cur.progress[dataset].level, strict)


def test_a_group_is_all_right_all_wrong_or_mixed():
    assert (group_outcome(RIGHT), group_outcome(WRONG), group_outcome(HALF)) == (ALL_RIGHT, ALL_WRONG, MIXED)
    assert group_outcome([0.5, 0.5]) == ALL_WRONG  # equal partial credit: nothing to learn from either


@pytest.mark.parametrize("outcomes, moves", [
    ([RIGHT] * MIN_GROUPS, +1),  # too easy
    ([WRONG] * MIN_GROUPS, 0),  # too hard, but level 0 is the floor
    ([HALF] * 20, 0),  # the band it aims for: stays
    ([RIGHT, HALF, RIGHT, HALF], +1),  # half all right: up
    ([RIGHT, HALF, HALF, HALF, HALF, HALF, HALF, RIGHT], 0),  # a quarter all right: stays
])
def test_moves_from_level_0(outcomes, moves):
    cur = fresh()
    feed(cur, "chain_sum", outcomes)
    assert cur.progress["chain_sum"].level == moves


def test_from_a_higher_level_most_groups_all_wrong_step_down_and_a_move_starts_a_new_window():
    cur = fresh()
    feed(cur, "chain_sum", [RIGHT] * MIN_GROUPS)
    feed(cur, "chain_sum", [RIGHT] * MIN_GROUPS)
    assert cur.progress["chain_sum"].level == 2 and cur.progress["chain_sum"].recent == []
    feed(cur, "chain_sum", [WRONG, WRONG, HALF])
    assert cur.progress["chain_sum"].level == 2  # fewer than MIN_GROUPS yet
    feed(cur, "chain_sum", [WRONG])
    assert cur.progress["chain_sum"].level == 1  # 3 of 4 all wrong
    feed(cur, "chain_sum", [WRONG, WRONG, HALF, HALF])
    assert cur.progress["chain_sum"].level == 1  # half all wrong: stays


def test_groups_from_another_level_do_not_move_this_one():
    cur = fresh()
    feed(cur, "chain_sum", [RIGHT] * MIN_GROUPS)
    before = (cur.progress["chain_sum"].groups, list(cur.progress["chain_sum"].recent))
    for _ in range(10):
        cur.record("chain_sum", 0, WRONG)  # replays of level 0
        cur.record("chain_sum", 99, RIGHT)  # stale
    assert (cur.progress["chain_sum"].groups, cur.progress["chain_sum"].recent) == before


def test_picks_favour_datasets_with_mixed_groups_and_starve_none():
    cur = fresh()
    feed(cur, "letter_counting", [HALF] * 6)
    feed(cur, "leg_counting", [WRONG, WRONG, WRONG, HALF])  # level 0: cannot step down
    w = dict(zip(cur.preset.datasets, cur.weights()))
    assert w["letter_counting"] == max(w.values())
    assert w["leg_counting"] >= WEIGHT_FLOOR / sum(WEIGHT_FLOOR + 1 for _ in w)  # never starved
    picks = cur.pick(np.random.default_rng(0), 600)
    share = sum(d == "letter_counting" for d, _ in picks) / len(picks)
    assert share > 1.5 / len(w)


def test_a_new_level_is_explored_as_one_at_the_edge():
    cur = fresh()
    for name in cur.preset.datasets:
        feed(cur, name, [HALF, WRONG, HALF, WRONG])  # all at the edge: half mixed
    feed(cur, "chain_sum", [RIGHT] * MIN_GROUPS)
    assert cur.progress["chain_sum"].level == 1
    w = dict(zip(cur.preset.datasets, cur.weights()))
    assert w["chain_sum"] >= max(w.values()) - 1e-12  # unknown difficulty: explored first, not last


def test_a_replay_share_of_questions_comes_from_the_levels_below():
    cur = fresh()
    cur.progress["chain_sum"].level = 3
    picks = [level for d, level in cur.pick(np.random.default_rng(1), 4000) if d == "chain_sum"]
    below = [level for level in picks if level < 3]
    assert abs(len(below) / len(picks) - REPLAY_SHARE) < 0.06
    assert set(below) == {0, 1, 2}
    assert all(level == 0 for d, level in cur.pick(np.random.default_rng(1), 200) if d == "leg_counting")


def test_picks_are_reproducible_from_the_rng():
    cur = fresh()
    cur.progress["basic_arithmetic"].level = 2
    assert cur.pick(np.random.default_rng(5), 8) == cur.pick(np.random.default_rng(5), 8)


def test_format_bonus_fades_and_state_round_trips():
    cur = fresh()
    assert cur.format_bonus(0.5) == 0.5
    for _ in range(30):
        cur.record_tag_rate(1.0)
    assert cur.format_bonus(0.5) < 0.01
    cur.record("leg_counting", 0, HALF)
    again = Curriculum.from_dict(load_preset("starter"), cur.to_dict())
    assert again.to_dict() == cur.to_dict()
    assert Curriculum.from_dict(load_preset("sapo9"), cur.to_dict()).tag_rate == 0.0  # other preset: fresh


def test_an_earlier_versions_state_keeps_its_levels_and_judges_them_afresh():
    old = {"preset": "starter", "tag_rate": 0.9,
           "progress": {"chain_sum": {"level": 3, "success": 0.02, "groups": 40}}}
    cur = Curriculum.from_dict(load_preset("starter"), old)
    assert cur.progress["chain_sum"].level == 3 and cur.tag_rate == 0.9
    cur.record("chain_sum", 3, WRONG)
    assert cur.progress["chain_sum"].level == 3  # one group is not a verdict, whatever came before


def test_a_focus_draws_only_its_datasets_and_holds_its_levels():
    cur = fresh().focus(("chain_sum", "leg_counting"), {"chain_sum": 2, "leg_counting": 0})
    assert list(cur.weights()) == [0.5, 0.5]  # all held: picked uniformly, the curriculum off
    feed(cur, "chain_sum", [RIGHT] * 8)
    feed(cur, "leg_counting", [WRONG] * 8)
    assert cur.levels()["chain_sum"] == 2 and cur.levels()["leg_counting"] == 0
    picks = cur.pick(np.random.default_rng(0), 400)
    assert {p for p in picks} == {("chain_sum", 2), ("leg_counting", 0)}  # no replay from below a held level
    with pytest.raises(ValueError, match="not in preset"):
        fresh().focus(("no_such_dataset",))
    with pytest.raises(ValueError, match="levels 0-"):
        fresh().focus(levels={"chain_sum": 9})
