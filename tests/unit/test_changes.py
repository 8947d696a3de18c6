"""What the domain hands to writers: a node changed by heartbeats alone is
marked so (writers then update two columns, not the whole row); any other
change to it in the same batch makes it a whole row again."""

from __future__ import annotations

from ledger.domain import Cluster
from ledger.model import Fact


def _cluster_with(*names: str) -> Cluster:
    """Ready nodes, their rows written."""
    cluster = Cluster()
    for position, name in enumerate(names, 1):
        cluster.apply({"type": "node-registered", "node": name, "slots": 1}, Fact(position, "t0"))
        cluster.apply({"type": "heartbeat", "node": name}, Fact(position + 100, "t0"))
    assert [(node.node, node.status) for node in cluster.take_changes().nodes] == [
        (name, "ready") for name in names]
    return cluster


def test_a_heartbeat_alone_marks_its_node_as_a_beat():
    cluster = _cluster_with("n1", "n2")
    cluster.apply({"type": "heartbeat", "node": "n1"}, Fact(3, "t1"))

    changes = cluster.take_changes()

    assert [n.node for n in changes.nodes] == ["n1"]
    assert changes.beats == {"n1"}
    assert changes.nodes[0].last_heartbeat_position == 3


def test_a_status_change_with_the_heartbeat_writes_the_whole_row():
    cluster = _cluster_with("n1")
    cluster.apply({"type": "node-down", "node": "n1"}, Fact(2, "t1"))
    cluster.take_changes()

    cluster.apply({"type": "heartbeat", "node": "n1"}, Fact(3, "t2"))  # down -> ready

    changes = cluster.take_changes()
    assert [(n.node, n.status, n.last_heartbeat_position) for n in changes.nodes] == [
        ("n1", "ready", 3)]
    assert changes.beats == set()  # the whole row, not only its heartbeat columns


def test_another_change_after_a_heartbeat_in_the_same_batch_writes_the_whole_row():
    cluster = _cluster_with("n1")
    cluster.apply({"type": "heartbeat", "node": "n1"}, Fact(2, "t1"))
    cluster.apply({"type": "node-suspected", "node": "n1", "reason": "disk"}, Fact(3, "t2"))

    changes = cluster.take_changes()

    assert changes.beats == set()
    assert changes.nodes[0].health == "suspect"


def test_a_heartbeat_after_registering_in_the_same_batch_writes_the_whole_row():
    cluster = Cluster()
    cluster.apply({"type": "node-registered", "node": "n1", "slots": 1}, Fact(1, "t0"))
    cluster.apply({"type": "heartbeat", "node": "n1"}, Fact(2, "t1"))

    changes = cluster.take_changes()

    assert changes.beats == set()
    assert changes.nodes[0].last_heartbeat_position == 2
