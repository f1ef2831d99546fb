"""Shared helpers of the Helm chart tests (helm_chart_test.py, helm_security_test.py): build the
offline renderer (deploy/helm/render) and the schema validator (k8s-validate/), render the chart,
and read the rendered objects.

TANDEM_HELM_CHART names another chart directory to test (e.g. an older copy of
deploy/helm/tandem, to show which checks fail on it)."""
import json
import os
import subprocess
import tempfile

import yaml

import deploylib
from deploylib import check

ROOT = deploylib.ROOT
CHART = os.environ.get("TANDEM_HELM_CHART") or os.path.join(ROOT, "deploy", "helm", "tandem")
VALUES_DIR = os.path.join(ROOT, "tests", "deploy", "helm")
VALIDATOR = os.path.join(ROOT, "tests", "deploy", "k8s-validate")
NAMESPACE = "serving"


def build_renderer(build_dir):
    out = os.path.join(build_dir, "helm-render")
    subprocess.run([os.path.join(ROOT, "deploy", "helm", "render", "build.sh"), out], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([os.path.join(VALIDATOR, "install.sh")], check=True)
    return os.path.join(out, "helm-render")


class RenderError(Exception):
    pass


def render(renderer, values_files=(), sets=(), output="json", notes=False, existing=None):
    """Renders the chart as release `prod` in NAMESPACE; `existing`: objects that `lookup` finds
    (an upgrade of a release that made them)."""
    cmd = [renderer, "-strict", "-name", "prod", "-namespace", NAMESPACE, "-output", output]
    for f in values_files:
        cmd += ["-f", f]
    for s in sets:
        cmd += ["-set", s]
    if notes:
        cmd.append("-notes")
    with tempfile.NamedTemporaryFile("w", suffix=".json") as lookup:
        if existing is not None:
            json.dump(existing, lookup)
            lookup.flush()
            cmd += ["-lookup", lookup.name]
        r = subprocess.run(cmd + [CHART], capture_output=True, text=True)
    if r.returncode != 0:
        raise RenderError(r.stderr.strip())
    return json.loads(r.stdout) if output == "json" and not notes else r.stdout


def validate_schemas(doc_sets):
    """Validates several renders in one node run; returns (rc, {index: output lines})."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, docs in enumerate(doc_sets):
            paths.append(os.path.join(tmp, f"{i}.json"))
            json.dump(docs, open(paths[-1], "w"))
        r = subprocess.run(["node", os.path.join(VALIDATOR, "validate.js")] + paths,
                           capture_output=True, text=True)
        out = {i: [ln[len(p) + 2:] for ln in r.stdout.splitlines() if ln.startswith(p + ": ")]
               for i, p in enumerate(paths)}
    check(not r.stderr.strip() or r.returncode != 0, r.stderr)
    if r.stderr.strip():
        out[-1] = [r.stderr.strip()]
    return r.returncode, out


def load_values(files, sets=()):
    """The chart's values.yaml with `files` merged over it (and simple `a.b=v` sets)."""
    values = yaml.safe_load(open(os.path.join(CHART, "values.yaml")))

    def merge(dst, src):
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(dst.get(k), dict):
                merge(dst[k], v)
            else:
                dst[k] = v
    for f in files:
        merge(values, yaml.safe_load(open(f)))
    for s in sets:
        key, raw = s.split("=", 1)
        *path, last = key.split(".")
        d = values
        for k in path:
            d = d.setdefault(k, {})
        d[last] = {"true": True, "false": False}.get(raw, int(raw) if raw.isdigit() else raw)
    return values


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


class Rendered:
    def __init__(self, docs):
        self.docs = [d["manifest"] for d in docs]

    def of(self, kind):
        return [m for m in self.docs if m["kind"] == kind]

    def get(self, kind, name):
        found = [m for m in self.of(kind) if m["metadata"]["name"] == name]
        check(len(found) == 1, f"expected one {kind}/{name}, found {len(found)}")
        return found[0]

    def find(self, kind, name):
        found = [m for m in self.of(kind) if m["metadata"]["name"] == name]
        return found[0] if found else None

    def workloads(self):
        return self.of("Deployment") + self.of("StatefulSet")

    def by_component(self):
        return {component(w): w for w in self.workloads()}


def pod_spec(w):
    return w["spec"]["template"]["spec"]


def pod_labels(w):
    return w["spec"]["template"]["metadata"]["labels"]


def component(w):
    return pod_labels(w)["app.kubernetes.io/component"]


def container(w):
    return pod_spec(w)["containers"][0]


def arg(container, flag):
    values = [a.split("=", 1)[1] for a in container["args"] if a.startswith(flag + "=")]
    return values[0] if len(values) == 1 else None
