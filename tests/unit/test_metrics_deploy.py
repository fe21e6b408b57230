"""deploy/'s Prometheus configuration, alerting rules and Grafana dashboard are valid and ask
only for metrics the nodes export (as docs/metrics.md lists them).

promtool (Debian package `prometheus`) parses the configuration, the rules and every
dashboard query (each written as a recording rule, with Grafana's variables filled in);
without it those checks skip.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana-dashboard.json"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not found: apt-get install prometheus (Debian package; .ci/run does it)",
)


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def documented_metrics() -> set[str]:
    return set(re.findall(r"`(raftlog_[a-z_]+)", (ROOT / "docs" / "metrics.md").read_text()))


def exported_name(name: str) -> str:
    """The documented family a sample name belongs to (histogram series end in _bucket...)."""
    return re.sub(r"_(bucket|count|sum)$", "", name)


@pytest.mark.parametrize("source", ["grafana-dashboard.json", "alerts.yml"])
def test_deploy_files_ask_only_for_documented_metrics(source: str) -> None:
    used = set(re.findall(r"\braftlog_[a-z_]+", (DEPLOY / source).read_text()))
    documented = documented_metrics()
    assert used, source
    unknown = {name for name in used if exported_name(name) not in documented}
    assert not unknown, f"{source} uses metrics docs/metrics.md does not list: {unknown}"


def test_the_dashboard_covers_what_operators_watch() -> None:
    queries = "\n".join(dashboard_queries())
    for needed in (
        "raftlog_produce_bytes_total",  # throughput
        "raftlog_request_duration_seconds_bucket",  # latency
        "raftlog_partitions_under_replicated",
        "raftlog_raft_groups_led",  # leaders per node
        "raftlog_consumer_group_committed_offset",  # consumer lag
    ):
        assert needed in queries, needed


@needs_promtool
def test_promtool_accepts_the_configuration_and_rules() -> None:
    for command in (
        ["promtool", "check", "config", str(DEPLOY / "prometheus.yml")],
        ["promtool", "check", "rules", str(DEPLOY / "alerts.yml")],
    ):
        checked = subprocess.run(command, capture_output=True, timeout=60)
        assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()


@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query_{i}", "expr": _filled(query)}
        for i, query in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()


def _filled(query: str) -> str:
    """A dashboard query with Grafana's variables as a dashboard would fill them."""
    return query.replace("$__rate_interval", "1m").replace("$job", ".*")
