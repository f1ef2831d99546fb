#!/usr/bin/python3
"""Static checks of the Grafana dashboards and Prometheus rules (no server needed):

- the committed dashboards equal deploy/grafana/generate.py's output;
- each dashboard has a Prometheus data-source variable that every panel and query uses, unique
  panel ids, a grid layout inside 24 columns, units, and only known Grafana variables;
- every panel expression parses as PromQL (promtool check rules on a generated rules file);
- every recording rule a dashboard reads exists, and every alert is covered by a firing case
  in tests/deploy/prometheus/tandem_rules_test.yaml and has a runbook in docs/operations.md.
"""
import os
import re
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploylib  # noqa: E402
from deploylib import check  # noqa: E402


def check_generated():
    sys.path.insert(0, deploylib.GRAFANA_DIR)
    import generate  # noqa: E402
    for name, text in generate.render().items():
        path = os.path.join(deploylib.GRAFANA_DIR, name)
        check(os.path.exists(path), f"{name} missing: run deploy/grafana/generate.py")
        check(open(path).read() == text, f"{name} differs from generate.py: run it and commit")
    print(f"ok: {len(generate.render())} dashboards match generate.py")


def check_structure():
    uids = set()
    for name, d in deploylib.dashboards().items():
        check(d["uid"] not in uids and len(d["uid"]) <= 40, f"{name}: uid {d['uid']}")
        uids.add(d["uid"])
        variables = {v["name"]: v for v in d["templating"]["list"]}
        ds = variables.get("datasource")
        check(ds is not None and ds["type"] == "datasource" and ds["query"] == "prometheus",
              f"{name}: needs a Prometheus datasource variable")
        ids = set()
        for p in deploylib.panels(d):
            where = f"{name} panel {p.get('title')!r}"
            check(p["id"] not in ids, f"{where}: duplicate id")
            ids.add(p["id"])
            g = p["gridPos"]
            check(0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, f"{where}: gridPos {g}")
            if p["type"] == "row":
                continue
            check(p["type"] in ("timeseries", "stat"), f"{where}: type {p['type']}")
            check(p["datasource"] == {"type": "prometheus", "uid": "${datasource}"},
                  f"{where}: datasource must be the variable")
            check(p["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit")
            check(p.get("description"), f"{where}: no description")
            check(p["targets"], f"{where}: no query")
            for t in p["targets"]:
                check(t["datasource"] == p["datasource"], f"{where}: target datasource")
                for var in re.findall(r"\$\{?(\w+)", t["expr"]):
                    check(var in variables or var in ("__rate_interval", "__interval"),
                          f"{where}: unknown variable ${var}")
        # No overlapping panels.
        cells = set()
        for p in deploylib.panels(d):
            g = p["gridPos"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    check((x, y) not in cells, f"{name}: panel {p['title']!r} overlaps another")
                    cells.add((x, y))
    print(f"ok: structure of {len(uids)} dashboards")


def check_promql_parses():
    queries = deploylib.dashboard_queries()
    rules = {"groups": [{"name": "panels", "rules": [
        {"record": f"panel:check:q{i}", "expr": deploylib.substitute(q.expr)}
        for i, q in enumerate(queries)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(rules, f)
        f.flush()
        r = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
    if r.returncode != 0:
        # Map promtool's complaint back to the panel.
        for i, q in enumerate(queries):
            if f"q{i}" in r.stdout + r.stderr:
                print(f"bad query: {q.key}: {q.expr}")
        raise AssertionError(f"promtool check rules failed:\n{r.stdout}\n{r.stderr}")
    print(f"ok: {len(queries)} panel queries parse")


def check_rules():
    recorded = {name for name, _, _ in deploylib.recording_rules()}
    used = set()
    for q in deploylib.dashboard_queries():
        for name in deploylib.recorded_names_in(q.expr):
            check(name in recorded, f"{q.key} reads {name}, which no rule records")
            used.add(name)
    alerts = deploylib.alerting_rules()
    for a in alerts:
        used |= deploylib.recorded_names_in(a["expr"])
    unused = recorded - used
    check(not unused, f"recording rules no dashboard or alert reads: {sorted(unused)}")

    tests = yaml.safe_load(open(os.path.join(deploylib.ROOT, "tests", "deploy", "prometheus",
                                             "tandem_rules_test.yaml")))
    fired = {c["alertname"] for t in tests["tests"] for c in t.get("alert_rule_test", [])
             if c.get("exp_alerts")}
    doc = open(os.path.join(deploylib.ROOT, "docs", "operations.md")).read()
    for a in alerts:
        name = a["alert"]
        check(name in fired, f"alert {name} has no firing case in tandem_rules_test.yaml")
        check(a["labels"]["severity"] in ("warning", "critical"), f"{name}: severity")
        check(a["annotations"].get("summary") and a["annotations"].get("description"),
              f"{name}: summary and description")
        anchor = name.lower()
        check(f"#{anchor}" in a["annotations"]["description"], f"{name}: runbook link")
        check(re.search(rf"^###+ {name}\s*$", doc, re.M), f"docs/operations.md: no '### {name}'")
    print(f"ok: {len(recorded)} recording rules used, {len(alerts)} alerts tested and documented")


def main():
    check_generated()
    check_structure()
    check_promql_parses()
    check_rules()
    print("PASS")


if __name__ == "__main__":
    main()
