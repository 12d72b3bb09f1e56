"""A follower's recorded progress (nsqx.cluster.replication.LeaderProgress) only moves
forward within one session of that follower, and the high watermark never falls (issue 31:
a fetch at a lower offset made ``acked_end`` in /nsqx/cluster/state fall from 3 to 0)."""

from __future__ import annotations

import pytest

from nsqx.cluster.replication import LeaderProgress, Regressed


def test_a_lower_fetch_in_the_same_session_is_refused_and_changes_nothing() -> None:
    p = LeaderProgress({"L", "F"})
    p.on_fetch("F", 3, 5, 1.0, session=7)
    assert p.acked_end(5, "L") == 3
    with pytest.raises(Regressed, match="below 3"):
        p.on_fetch("F", 0, 5, 2.0, session=7)
    assert p.followers["F"].end == 3 and p.acked_end(5, "L") == 3
    p.on_fetch("F", 3, 5, 3.0, session=7)  # the same offset again is an ordinary fetch
    p.on_fetch("F", 5, 5, 4.0, session=7)
    assert p.acked_end(5, "L") == 5


def test_a_new_session_starts_from_its_fetch_but_the_watermark_stays() -> None:
    p = LeaderProgress({"L", "F"})
    p.on_fetch("F", 4, 4, 1.0, session=7)
    assert p.acked_end(4, "L") == 4
    p.on_fetch("F", 2, 6, 2.0, session=8)  # restarted, an unsynced tail lost
    assert p.followers["F"].end == 2 and p.followers["F"].caught_up_at == 1.0
    assert p.acked_end(6, "L") == 4  # acknowledged once, acknowledged for good
    p.on_fetch("F", 6, 6, 3.0, session=8)
    assert p.acked_end(6, "L") == 6
