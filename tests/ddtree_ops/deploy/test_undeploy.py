"""Which services undeploy removes from which hosts (decided before any host is touched)."""

from __future__ import annotations

import pytest

from ddtree_ops.config import parse_project
from ddtree_ops.exceptions import ConfigError
from ddtree_ops.deploy.undeploy import plan_undeploy

PROJECT = parse_project(
    {
        "hosts": [{"name": "a", "address": "10.0.0.1"}, {"name": "b", "address": "10.0.0.2"}],
        "engine": {"target": "lab", "draft": "lab"},
        "services": [
            {"name": "baseline", "algorithm": "dflash", "port": 30000},
            {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30001, "hosts": ["b"]},
        ],
    }
)


def names(pairs):
    return {host.name: services for host, services in pairs}


def test_by_default_every_service_where_the_project_puts_it():
    assert names(plan_undeploy(PROJECT, None, None)) == {"a": ["baseline"], "b": ["baseline", "tree"]}


def test_a_service_taken_out_of_the_project_file_can_still_be_removed_everywhere():
    assert names(plan_undeploy(PROJECT, ["old-tree"], ["a"])) == {"a": ["old-tree"]}


def test_bad_names_are_refused_before_any_host_is_touched():
    with pytest.raises(ConfigError, match="not a service name"):
        plan_undeploy(PROJECT, ["Tree;rm"], None)
    with pytest.raises(ConfigError, match="unknown host"):
        plan_undeploy(PROJECT, None, ["c"])
    with pytest.raises(ConfigError, match="nothing to undeploy"):
        plan_undeploy(PROJECT, ["tree"], ["a"])
