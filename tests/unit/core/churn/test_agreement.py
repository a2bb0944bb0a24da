"""One agreed history (seedflood.core.churn.agreement): votes, quorums, ballots and commits — pure, milliseconds.

The safety argument is in the module docstring and docs/churn-design.md, One history; these tests pin its parts
one by one, and tests/unit/core/churn/test_explore.py drives the whole through every small fault schedule.
"""

from __future__ import annotations

import pytest

from seedflood.core.churn.agreement import (
    GENESIS,
    Agreement,
    Value,
    Vote,
    byzantine_quorum,
    faults,
    quorum,
    step_digest,
    tally,
)
from seedflood.core.membership.notes import VOTE
from seedflood.core.membership.roster import Change, ExcludedError, MembershipError, Roster
from seedflood.core.wire.message import FrameError, Message


def msg(o: int, s: int, scalar: float = 1.0) -> Message:
    return Message.make(o, s, 1000 + 10 * o + s, scalar)


def value(step: int, members: set[int], prev: int = GENESIS, joins=(), scalar: float = 1.0) -> Value:
    msgs = [msg(o, step, scalar) for o in sorted(members)]
    return Value(prev, frozenset(members), tuple(joins), step_digest(prev, step, msgs, joins))


def votes(step: int, ballot: int, by: dict[int, Value], inc: int = 0) -> list[Vote]:
    return [Vote(step, ballot, o, inc, v) for o, v in by.items()]


def test_the_digest_binds_the_previous_step_the_step_the_contents_and_the_joins():
    base = step_digest(GENESIS, 3, [msg(0, 3), msg(1, 3)], ())
    assert base == step_digest(GENESIS, 3, [msg(1, 3), msg(0, 3)], ())  # canonical order
    assert base != step_digest(1, 3, [msg(0, 3), msg(1, 3)], ())
    assert base != step_digest(GENESIS, 4, [msg(0, 3), msg(1, 3)], ())
    assert base != step_digest(GENESIS, 3, [msg(0, 3), msg(1, 3, 2.0)], ())
    assert base != step_digest(GENESIS, 3, [msg(0, 3), msg(1, 3)], ((1, 2),))


def test_a_vote_round_trips_through_its_note_and_a_bad_body_is_refused():
    v = Vote(7, 2, 3, 5, Value(11, frozenset({0, 3, 9}), ((9, 4),), 12345, frozenset({1})))
    note = v.note(10)
    assert note.kind == VOTE and note.value == 2 and note.id == ("vote", 3, 7, 2)
    assert Vote.of(note, 10) == v
    with pytest.raises(FrameError, match="body bytes"):
        Vote.of(note.__class__(7, VOTE, 3, 2, note.body[:10]), 10)


def test_quorums_exceed_half_so_two_of_one_ballot_always_share_a_voter():
    for n in range(1, 40):
        for b in (0, 1, 5):
            assert 2 * quorum(n, b) > n
        assert 2 * quorum(n, 0) - n >= n / 2  # two ballot-0 values need half the roster unheard


def test_a_quorum_of_equal_votes_commits_and_other_chains_never_do():
    roster = Roster(5)
    x = value(0, {0, 1, 2, 3, 4})
    t = tally(votes(0, 1, {0: x, 1: x, 2: x}), roster, GENESIS, 1)
    assert t.committed == x and t.foreign is None
    t = tally(votes(0, 0, {0: x, 1: x, 2: x}), roster, GENESIS, 0)  # ballot 0 needs 4 of 5
    assert t.committed is None and t.possible == (x,) and t.closed
    other = value(0, {0, 1, 2, 3, 4}, prev=99)
    t = tally(votes(0, 1, {0: other, 1: other, 2: other}), roster, GENESIS, 1)
    assert t.committed is None and t.foreign == other and t.possible == ()


def test_only_members_under_their_admitted_incarnation_vote_and_each_once():
    roster = Roster(4)
    roster.apply(Change(0, leave=(3,)))
    roster.apply(Change(1, join=((3, 2),)))
    x = value(2, {0, 1, 2, 3})
    stale = Vote(2, 1, 3, 1, value(2, {0, 1, 2}))  # node 3's old incarnation
    t = tally([stale, *votes(2, 1, {0: x}), Vote(2, 1, 3, 2, x)], roster, GENESIS, 1)
    assert t.heard == {0, 3} and t.committed is None
    # a second vote of one origin in one ballot is not counted (a correct voter never casts it)
    t = tally([*votes(2, 1, {0: x, 1: x}), Vote(2, 1, 1, 0, value(2, {0, 1}))], roster, GENESIS, 1)
    assert t.possible == (x,)


def test_a_ballot_closes_only_when_no_unvoted_value_can_win_it():
    roster = Roster(8)
    a, b = value(0, set(range(8))), value(0, set(range(7)))
    t = tally(votes(0, 1, {0: a, 1: a, 2: b}), roster, GENESIS, 1)
    assert not t.closed  # 5 unheard could still elect anything
    t = tally(votes(0, 1, {0: a, 1: a, 2: a, 3: b, 4: b}), roster, GENESIS, 1)
    assert t.closed and t.possible == (a, b)  # 3 + 3 and 2 + 3 both reach 5: no move yet
    t = tally(votes(0, 1, {0: a, 1: a, 2: a, 3: b, 4: b, 5: b}), roster, GENESIS, 1)
    assert t.closed and t.possible == (a, b)
    t = tally(votes(0, 1, {0: a, 1: a, 2: a, 3: a, 4: b, 5: b}), roster, GENESIS, 1)
    assert t.possible == (a,)  # b cannot reach 5 any more: a voter moving on is forced to a


def test_a_client_commits_from_a_quorum_and_its_roster_follows():
    ag = Agreement(0, 4, 1)
    x = value(0, {0, 1, 2})
    held = {0: x, 1: x, 2: x}
    commits, out = ag.review(lambda s: votes(s, 0, held) if s == 0 else [], lambda s: None)
    assert commits == [(0, Change(0, leave=(3,)))] and out == []
    assert ag.through == 0 and ag.prev == x.digest and ag.roster.members == {0, 1, 2}
    assert ag.pending == {0: x} and ag.digests == {0: x.digest}


def test_a_client_left_out_of_a_committed_step_is_excluded():
    ag = Agreement(3, 4, 1)
    x = value(0, {0, 1, 2})
    with pytest.raises(ExcludedError, match="node 3: the others committed step 0 without this client"):
        ag.review(lambda s: votes(s, 0, {0: x, 1: x, 2: x}) if s == 0 else [], lambda s: None)


def test_a_restarted_process_is_not_excluded_by_its_earlier_lifes_leave_before_its_join_step():
    """A restart of node 3 caught up through a step before the one that commits its old life's
    leave (committed at the sponsor, not yet applied, so not in the catch-up): committing that
    leave itself, it must not stop as if excluded (a compose test saw the restarted attach node
    stop so, and its restart's restart join). From its JOIN step on, being left out is its own
    exclusion again."""
    x = value(0, {0, 1, 2})
    ag = Agreement(3, 4, 1, rejoins_at=5)
    commits, _ = ag.review(lambda s: votes(s, 0, {0: x, 1: x, 2: x}) if s == 0 else [], lambda s: None)
    assert [s for s, _ in commits] == [0] and ag.roster.members == {0, 1, 2}
    ag = Agreement(3, 4, 1, rejoins_at=0)  # a process in its first life (or past its JOIN step)
    with pytest.raises(ExcludedError):
        ag.review(lambda s: votes(s, 0, {0: x, 1: x, 2: x}) if s == 0 else [], lambda s: None)


def test_a_client_whose_history_differs_stops_instead_of_applying_another():
    ag = Agreement(0, 4, 1)
    ag.extend(0, [msg(o, 0) for o in range(4)], None)
    theirs = value(1, {0, 1, 2, 3}, prev=4242)  # a majority voted on a chain this client lacks
    with pytest.raises(MembershipError, match="does not hold"):
        ag.review(lambda s: votes(s, 1, {1: theirs, 2: theirs, 3: theirs}) if s == 1 else [], lambda s: None)


def test_after_a_closed_quiet_ballot_a_client_votes_the_one_possible_value_or_a_fresh_one():
    ag = Agreement(0, 5, 1, quiet=3)
    a, b = value(0, {0, 1, 2, 3, 4}), value(0, {0, 1, 3, 4})
    ballot0 = {0: b, 1: a, 3: b}  # 2 and 4 unheard: a (1 + 2 < 4) cannot win ballot 0, b can
    ag.mine[0] = Vote(0, 0, 0, 0, b)
    fresh = value(0, {0, 1, 2, 3, 4})

    def held(s):
        return votes(s, 0, ballot0) if s == 0 else []

    assert ag.review(held, lambda s: fresh, now=10) == ([], [])  # the view just changed: wait
    assert ag.review(held, lambda s: fresh, now=12) == ([], [])
    _, (note,) = ag.review(held, lambda s: fresh, now=13)
    assert Vote.of(note, 5) == Vote(0, 1, 0, 0, b)  # forced: b may have won ballot 0 elsewhere
    # with nothing possible, the fresh proposal
    ag = Agreement(0, 5, 1, quiet=0)
    ag.mine[0] = Vote(0, 0, 0, 0, b)
    split = {0: b, 1: a, 2: a, 3: b}  # 1 unheard: neither reaches 4
    _, (note,) = ag.review(lambda s: votes(s, 0, split) if s == 0 else [], lambda s: fresh, now=1)
    assert Vote.of(note, 5) == Vote(0, 1, 0, 0, fresh)


def test_once_a_value_is_committed_every_later_ballot_votes_it():
    """The heart of the safety argument: a client leaving a ballot in which x has a quorum (as
    votes or unheard voters) can only be forced to x, whatever else it holds."""
    x, y = value(0, {0, 1, 2, 3, 4}), value(0, {0, 1, 2, 3})
    for seen in ({0: x, 1: x, 2: x}, {0: x, 3: y, 4: y}, {1: x, 2: x, 3: y, 4: y}):
        # x committed in ballot 1 by voters 0, 1, 2; this client saw `seen` of ballot 1
        ag = Agreement(4, 5, 1)
        ag.mine[0] = Vote(0, 1, 4, 0, y)
        _, out = ag.review(lambda s, seen=seen: votes(s, 1, seen) if s == 0 else [], lambda s: y, now=1)
        for note in out:
            assert Vote.of(note, 5).value == x


def test_a_pipelined_vote_on_a_guess_that_lost_is_void_and_the_client_votes_again():
    ag = Agreement(0, 3, 1)
    guess = value(0, {0, 1, 2})
    ag.mine[0] = Vote(0, 0, 0, 0, guess)
    nxt = value(1, {0, 1, 2}, prev=guess.digest)
    ag.mine[1] = Vote(1, 0, 0, 0, nxt)
    won = value(0, {0, 1})  # step 0 committed without node 2
    fresh = value(1, {0, 1}, prev=won.digest)

    def held(s):
        return {0: votes(0, 1, {1: won, 2: won}), 1: [Vote(1, 0, 0, 0, nxt)]}.get(s, [])

    commits, out = ag.review(held, lambda s: fresh if s == 1 else None, now=1)
    assert [s for s, _ in commits] == [0] and ag.roster.members == {0, 1}
    # ballot 0 of step 1 holds only this client's void vote, and 1 of 2 voters is unheard:
    # closed (no unvoted value reaches 2 of 2), nothing possible -> a fresh vote in ballot 1
    assert [Vote.of(n, 3) for n in out] == [Vote(1, 1, 0, 0, fresh)]


def test_a_quorum_of_void_guesses_after_a_leave_is_not_another_history():
    """Both members left after node 2's leave guessed step 0 with node 2 in it and pipelined a
    vote for step 1 on that guess; step 0 committed without node 2 in ballot 1. Their two void
    votes are a quorum of the 2 members of R_1, on the guess's digest: not a chain some majority
    committed (the explorer's line of 3 whose cut healed before the leave stopped every client
    so). The client votes again on the committed step; a digest nobody voted for step 0 is
    still another history."""
    guess, won = value(0, {0, 1, 2}), value(0, {0, 1})
    nxt, fresh = value(1, {0, 1}, prev=guess.digest), value(1, {0, 1}, prev=won.digest)

    def client() -> Agreement:
        ag = Agreement(0, 3, 1)
        ag.mine[0], ag.mine[1] = Vote(0, 1, 0, 0, won), Vote(1, 0, 0, 0, nxt)
        return ag

    step0 = votes(0, 0, {0: guess, 1: guess}) + votes(0, 1, {0: won, 1: won})
    held = {0: step0, 1: votes(1, 0, {0: nxt, 1: nxt})}
    ag = client()
    commits, out = ag.review(lambda s: held.get(s, []), lambda s: fresh if s == 1 else None, now=1)
    assert [s for s, _ in commits] == [0] and ag.roster.members == {0, 1}
    assert [Vote.of(n, 3) for n in out] == [Vote(1, 1, 0, 0, fresh)]
    other = value(1, {0, 1}, prev=4242)  # built on nothing anyone voted for step 0
    held[1] = votes(1, 0, {0: other, 1: other})
    with pytest.raises(MembershipError, match="does not hold"):
        client().review(lambda s: held.get(s, []), lambda s: fresh if s == 1 else None, now=1)


def test_a_held_copy_that_hashes_to_another_digest_waits_for_the_committed_copy_or_stops_the_client():
    """A client whose copy of a committed step hashes to another digest never applies it: it
    waits (the committed copy may still come, as a COPY note) and, if it never does, `stuck`
    names the differing copy. Once the committed copy is here it applies that one."""
    import networkx as nx

    import explorer
    from seedflood.core.churn.voter import Voter
    from seedflood.core.flood.flooding import Flood
    from seedflood.core.membership.notes import copy_note

    p = explorer.protocol_for(nx.complete_graph(3), steps=2)
    flood = Flood(0, [1, 2], range(3), tolerate_conflicts=True)
    ag = Agreement(0, 3, 1)
    voter = Voter(p, flood, ag, lambda _: None)
    flood.receive(1, [msg(o, 0) for o in range(3)])
    assert voter.take(0) is None  # not committed yet
    committed = value(0, {0, 1, 2}, scalar=2.0)  # a quorum committed other scalars
    ag.pending[0] = committed
    assert voter.take(0) is None  # waits: nothing it holds hashes to the committed digest
    line = str(voter.stuck(0, 9))
    assert "its copy of step 0 differs from the one a majority committed" in line and "within 9 extra hops" in line
    flood.receive(2, [copy_note(msg(o, 0, scalar=2.0)) for o in range(3)])  # the other copies arrive
    taken = voter.take(0)
    assert taken == [msg(o, 0, scalar=2.0) for o in range(3)] and 0 not in voter.differs
    assert sorted(flood.conflicts) == [0, 1, 2]  # and each origin is named for its two copies


def test_a_client_stuck_on_a_step_says_whether_it_was_committed_or_only_short_of_votes():
    import networkx as nx

    import explorer
    from seedflood.core.churn.voter import Voter
    from seedflood.core.flood.flooding import Flood

    p = explorer.protocol_for(nx.complete_graph(3), steps=2)
    flood = Flood(0, [1, 2], range(3), tolerate_conflicts=True)
    ag = Agreement(0, 3, 1)
    voter = Voter(p, flood, ag, lambda _: None)
    flood.receive(1, [msg(0, 0)])
    assert "step 0 was not committed within 7 extra hops (votes from 0 of 3" in str(voter.stuck(0, 7))
    ag.pending[0] = value(0, {0, 1, 2})  # committed by the others; two messages never came
    assert voter.take(0) is None
    line = str(voter.stuck(0, 7))
    assert "step 0 was committed but 2 of its messages did not reach this client within 7 extra hops" in line
    assert "\n" not in line


# -- signed votes: f < n/3 lying voters ------------------------------------------------------------
def test_byzantine_quorums_share_an_honest_voter_and_the_honest_alone_reach_them_after_ballot_0():
    for n in range(1, 40):
        f = faults(n)
        assert n >= 3 * f + 1 and n < 3 * (f + 1) + 1  # the largest f the roster tolerates
        for b in (0, 1, 5):
            q = byzantine_quorum(n, b)
            assert 2 * q - n >= f + 1  # two quorums of a ballot share more than f voters
            assert q >= quorum(n, b)  # never below the crash quorum: f = 0 is the crash rule
        assert byzantine_quorum(n, 1) <= n - f  # the honest can commit a later ballot by themselves
    assert [byzantine_quorum(n, 1) for n in (4, 5, 6, 7)] == [3, 4, 4, 5]


def test_a_double_voter_counts_for_each_value_it_signed_and_is_named():
    roster = Roster(4)  # f = 1, q = 3
    x, y = value(0, {0, 1, 2, 3}), value(0, {0, 1, 2})
    held = [*votes(0, 1, {0: x, 1: x, 2: y}), Vote(0, 1, 3, 0, x), Vote(0, 1, 3, 0, y)]
    t = tally(held, roster, GENESIS, 1, byzantine=True)
    # its x vote is signed: a client that held only that one counted 3 for x and committed it,
    # so every client holding the same signed votes commits x too (a commit is a proof)
    assert t.committed == x and t.doubled == {3} and t.heard == {0, 1, 2, 3}
    assert tally(held, roster, GENESIS, 1).doubled == frozenset()  # unsigned: not a proof, first vote wins


def test_with_signed_votes_a_value_is_possible_while_its_honest_voters_could_have_made_a_quorum():
    """x committed by 0, 1 and liar 3 (q = 3 of 4); 3 showed client 2 another value y. Counted as
    honest (the crash rule) x looks lost to 2 (2 + 0 unheard < 3): it would vote a fresh value.
    With f = 1 a value is possible at q − f = 2: x is, and client 2 is forced to it."""
    roster = Roster(4)
    x, y, w = value(0, {0, 1, 2, 3}), value(0, {0, 1, 2}), value(0, {0, 1, 3})
    seen = votes(0, 1, {0: x, 1: x, 2: w, 3: y})
    assert tally(seen, roster, GENESIS, 1).possible == ()
    t = tally(seen, roster, GENESIS, 1, byzantine=True)
    assert t.closed and t.possible == (x,) and t.leavable
    for byzantine, want in ((False, w), (True, x)):
        ag = Agreement(2, 4, 1, byzantine=byzantine)
        ag.mine[0] = Vote(0, 1, 2, 0, w)
        _, out = ag.review(lambda s: seen if s == 0 else [], lambda s: w, now=1)
        assert [Vote.of(n, 4).value for n in out] == [want]
    # a view that cannot tell: x and y each have 2 votes, one of them may be the liar's
    t = tally(votes(0, 1, {0: x, 1: x, 2: y, 3: y}), roster, GENESIS, 1, byzantine=True)
    assert t.possible == (x, y) and not t.leavable


def test_proof_against_a_voter_leaves_its_vote_out_of_what_is_possible_and_a_commit_stays_possible():
    """4 signed voters split 2–2 in ballot 0: 0 and 3 propose x without origin 2 (they recomputed
    one of its scalars: proof that it lies), 1 and 2 propose y with it. Counted as anyone's, both
    stay possible for good (q − f = 2 each: either could have won with a liar's vote) and every
    client stops, as an in-process signed liar run did. A view that holds the proof leaves 2's
    vote out: only x is possible and it leaves the ballot forced to x. Safety: a value committed
    with the liar's vote has q − f = 2 honest votes besides, which a view with the proof still
    shows, so it stays possible there and is forced."""
    roster = Roster(4)  # f = 1, q = 3 in every ballot
    x, y = value(0, {0, 1, 3}), value(0, {0, 1, 2, 3})
    seen = votes(0, 0, {0: x, 3: x, 1: y, 2: y})
    t = tally(seen, roster, GENESIS, 0, byzantine=True)
    assert set(t.possible) == {x, y} and not t.leavable
    t = tally(seen, roster, GENESIS, 0, byzantine=True, proven=frozenset({2}))
    assert t.closed and t.possible == (x,) and t.support == (2,) and t.leavable
    ag = Agreement(0, 4, 1, byzantine=True, proven=frozenset({2}))
    ag.mine[0] = Vote(0, 0, 0, 0, x)
    _, out = ag.review(lambda s: seen if s == 0 else [], lambda s: x, now=1)
    assert [(Vote.of(n, 4).ballot, Vote.of(n, 4).value) for n in out] == [(1, x)]
    # y committed by 0, 1 and the liar, which showed this client x: still possible, and forced
    committed_y = votes(0, 0, {0: y, 1: y, 2: x, 3: x})
    t = tally(committed_y, roster, GENESIS, 0, byzantine=True, proven=frozenset({2}))
    assert t.possible == (y,) and t.leavable
    # unsigned votes have no proof: the crash rule counts every vote as before
    assert tally(seen, roster, GENESIS, 1, proven=frozenset({2})) == tally(seen, roster, GENESIS, 1)


def test_a_value_only_liars_voted_is_never_forced():
    roster = Roster(7)  # f = 2, q = 5, possible at 3
    z, x, w = value(0, set(range(7))), value(0, {0, 1, 2, 3, 4, 5}), value(0, {0, 1, 2, 3, 4})
    seen = votes(0, 1, {5: z, 6: z, 0: x, 1: w})  # liars 5 and 6 vote z; 3 unheard
    t = tally(seen, roster, GENESIS, 1, byzantine=True)
    assert not t.closed
    a, b = value(0, {0, 1, 2, 3}), value(0, {0, 1, 2, 3, 5})
    seen = votes(0, 1, {5: z, 6: z, 0: x, 1: w, 2: a, 3: b})  # 1 unheard: z 2 + 1 = 3 possible, alone
    t = tally(seen, roster, GENESIS, 1, byzantine=True)
    assert t.closed and t.possible == (z,) and t.support == (2,)
    assert not t.leavable  # 2 votes, both possibly liars': wait rather than be forced to it
