"""Cluster membership: topic ownership by rendezvous hashing (stable, balanced, minimal
movement), and the check that this broker is a member."""

from __future__ import annotations

import os
import socket
from collections import Counter

import pytest

from mop.membership import Membership, MembershipError, score
from mop.node import node_instance_id

A, B, C, D = (f"pulsar://127.0.0.1:{port}" for port in (6650, 6651, 6652, 6653))
TOPICS = [f"persistent://public/default/t-{n}" for n in range(3000)]


def test_single_member_or_empty_cluster_owns_everything() -> None:
    for members in ((), (A,)):
        ownership = Membership(members, A)
        assert not ownership.clustered
        assert all(ownership.owns(topic) for topic in TOPICS[:50])
        assert ownership.owner(TOPICS[0]) == A
    # Even when the one member is not this broker's URL: there is nobody else to own a topic.
    assert Membership((B,), A).owns(TOPICS[0])


def test_every_member_agrees_whatever_the_order_of_its_list() -> None:
    views = [Membership((A, B, C), A), Membership((C, A, B), B), Membership((B, C, A), C)]
    for topic in TOPICS[:500]:
        owners = {view.owner(topic) for view in views}
        assert len(owners) == 1
        assert sum(view.owns(topic) for view in views) == 1


def test_the_hash_is_stable_across_processes() -> None:
    # A fixed value: Python's salted hash() would change it from one process to the next.
    assert score(A, "persistent://public/default/x") == score(A, "persistent://public/default/x")
    assert score(A, "persistent://public/default/x") != score(B, "persistent://public/default/x")
    assert score(A, "t") == 0xDDC293D9327C9B6D


def test_urls_compare_without_a_trailing_slash() -> None:
    ownership = Membership((A + "/", B), A)
    assert ownership.members == (A, B)
    assert ownership.peers() == (B,)


def test_topics_spread_evenly() -> None:
    ownership = Membership((A, B, C), A)
    counts = Counter(ownership.owner(topic) for topic in TOPICS)
    assert set(counts) == {A, B, C}
    for count in counts.values():
        assert abs(count - len(TOPICS) / 3) < len(TOPICS) * 0.05


def test_adding_a_member_moves_only_the_topics_it_takes() -> None:
    before = Membership((A, B, C), A)
    after = Membership((A, B, C, D), A)
    moved = [topic for topic in TOPICS if before.owner(topic) != after.owner(topic)]
    # Every topic that moved went to the new member, and it took about a quarter of them.
    assert all(after.owner(topic) == D for topic in moved)
    assert abs(len(moved) - len(TOPICS) / 4) < len(TOPICS) * 0.05


def test_removing_a_member_moves_only_its_topics() -> None:
    before = Membership((A, B, C), A)
    after = Membership((A, B), A)
    for topic in TOPICS:
        if before.owner(topic) != C:
            assert after.owner(topic) == before.owner(topic)


def test_this_broker_must_be_a_member_of_a_cluster_of_several() -> None:
    Membership((A, B), A + "/").check()
    Membership((), D).check()  # alone: nothing to check
    with pytest.raises(MembershipError, match=r"^cluster.advertised_url .* cluster.brokers"):
        Membership((A, B), D).check()


def test_a_broker_alone_has_no_peers() -> None:
    assert Membership((B,), A).peers() == ()


def test_advertise_changes_the_url_it_owns_under() -> None:
    membership = Membership((), "pulsar://127.0.0.1:0")
    membership.advertise(A + "/")
    assert (membership.advertised_url, membership.url) == (A + "/", A)
    assert membership.owner(TOPICS[0]) == A


def test_each_node_of_a_process_has_its_own_instance_id() -> None:
    first, second = node_instance_id(), node_instance_id()
    assert first != second
    assert first.split("/")[0] == second.split("/")[0] == f"{socket.gethostname()}:{os.getpid()}"
