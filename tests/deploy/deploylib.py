"""Shared helpers for the deployment tests (tests/deploy/) and the observability integration
test (tests/integration/observability/): the dashboards' queries, the Prometheus rules, and
Grafana variable substitution."""
import glob
import json
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRAFANA_DIR = os.path.join(ROOT, "deploy", "grafana")
RULES_FILE = os.path.join(ROOT, "deploy", "prometheus", "tandem-rules.yaml")


class Query:
    """One PromQL expression of one dashboard panel (a panel may have several)."""

    def __init__(self, dashboard, uid, panel, ref, expr):
        self.dashboard, self.uid, self.panel, self.ref, self.expr = dashboard, uid, panel, ref, expr

    @property
    def key(self):
        return f"{self.uid} / {self.panel} / {self.ref}"


def dashboards():
    """{file name: parsed dashboard JSON} for deploy/grafana/*.json."""
    return {os.path.basename(p): json.load(open(p))
            for p in sorted(glob.glob(os.path.join(GRAFANA_DIR, "*.json")))}


def panels(dashboard):
    for p in dashboard["panels"]:
        yield p
        for inner in p.get("panels", []):  # collapsed rows hold their panels
            yield inner


def dashboard_queries():
    out = []
    for name, d in dashboards().items():
        for p in panels(d):
            for t in p.get("targets", []):
                out.append(Query(name, d["uid"], p["title"], t["refId"], t["expr"]))
    return out


def substitute(expr, rate_interval="1m", job=".+"):
    """Replaces the Grafana variables the dashboards use with concrete values."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("${__rate_interval}",
                                                                   rate_interval)
    expr = expr.replace("$__interval", "15s")
    expr = re.sub(r"\$\{?job\}?", job, expr)
    if "$" in expr:
        raise ValueError(f"unsubstituted variable in {expr!r}")
    return expr


def rule_groups():
    return yaml.safe_load(open(RULES_FILE))["groups"]


def recording_rules():
    """[(record name, expr, static labels)] in file order."""
    return [(r["record"], r["expr"], r.get("labels", {}))
            for g in rule_groups() for r in g["rules"] if "record" in r]


def alerting_rules():
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


def recorded_names_in(expr):
    """Recording-rule names (level:metric:operation) an expression reads."""
    return set(re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", expr))


def check(condition, message):
    if not condition:
        raise AssertionError(message)
