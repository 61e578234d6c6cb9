"""conf/prometheus/: ``promtool check rules`` and ``promtool test rules`` on the alert rules,
``promtool check config`` on the example configuration, and the Grafana dashboard's structure
(every panel's PromQL parses, as a rule Prometheus' own checker loads, and names only metrics
the exporter serves)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rocketstore.pipeline.tools.metricfamilies import FAMILIES
from tests.kit.promkit import PROMTOOL, SKIP_REASON

CONF = Path(__file__).resolve().parent.parent / "conf" / "prometheus"
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason=SKIP_REASON)


def promtool(*argv: str, cwd: Path = CONF) -> str:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, *argv], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def exported() -> set[str]:
    """Sample names the exporter can serve (a counter's with _total)."""
    return {f"{n}_total" if kind == "counter" else n for n, (kind, _, _) in FAMILIES.items()}


@needs_promtool
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    assert "SUCCESS: 10 rules found" in promtool("check", "rules", "rocketstore-rules.yml")
    assert "SUCCESS" in promtool("test", "rules", "rocketstore-rules.test.yml")
    assert "is valid prometheus config file syntax" in promtool("check", "config", "prometheus.yml")


@needs_promtool
def test_a_broken_rule_is_refused(tmp_path: Path) -> None:
    """The check can fail: a rule with a PromQL syntax error."""
    (tmp_path / "bad.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "sum(("}]}]})
    )
    done = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(tmp_path / "bad.yml")], capture_output=True
    )
    assert done.returncode != 0


def metric_names(expr: str) -> set[str]:
    words = set(re.findall(r"\b(rocket(?:mq|store)_[a-z_]+)\b", expr))
    return words


def test_the_rules_name_only_exported_metrics() -> None:
    rules = yaml.safe_load((CONF / "rocketstore-rules.yml").read_text())
    used = {n for g in rules["groups"] for r in g["rules"] for n in metric_names(r["expr"])}
    assert used and used <= exported(), used - exported()


def dashboard() -> dict[str, Any]:
    found: dict[str, Any] = json.loads((CONF / "rocketstore-dashboard.json").read_text())
    return found


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    d = dashboard()
    assert d["uid"] == "rocketstore" and isinstance(d["schemaVersion"], int)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        assert p["type"] in ("timeseries", "stat")
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0
        cell = (g["x"], g["y"])
        assert cell not in cells, f"panels overlap at {cell}"
        cells.add(cell)
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs))
        for t in p["targets"]:
            assert metric_names(t["expr"]) <= exported(), t["expr"]
            assert 'job=~"$job"' in t["expr"], t["expr"]


def panel_exprs() -> list[str]:
    """Every target's PromQL with Grafana's variables given values, as Grafana sends it."""
    return [
        t["expr"].replace("$job", ".*").replace("$__rate_interval", "1m")
        for p in dashboard()["panels"]
        for t in p["targets"]
    ]


@needs_promtool
def test_every_panel_query_parses(tmp_path: Path) -> None:
    exprs = panel_exprs()
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"panel:q{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    (tmp_path / "panels.yml").write_text(yaml.safe_dump(rules))
    assert f"SUCCESS: {len(exprs)} rules found" in promtool(
        "check", "rules", str(tmp_path / "panels.yml"), cwd=tmp_path
    )


def test_every_metric_is_documented() -> None:
    text = (CONF.parent.parent / "docs" / "monitoring.md").read_text()
    missing = sorted(n for n in exported() if f"`{n}`" not in text)
    assert not missing, missing
