#!/usr/bin/python3
"""deploy/helm/tandem is locked down by default, checked offline on rendered manifests:

- the routers require API keys: a Secret mounted read-only and passed as --api-keys, by default
  a chart-made key file holding the digest of one generated key, kept across upgrades;
- TLS on every listener, by default from a chart-made CA (checked with openssl) whose private
  key is nowhere;
- every prefill and decode worker gets the KV secret (--kv-secret-file, read-only), none
  --allow-unauthenticated-kv unless the KV secret is turned off;
- every Secret the chart generates (API key, cluster secret, TLS, KV secret) is kept across
  upgrades (`lookup` of the previous release's objects, helm-render -lookup) and annotated
  helm.sh/resource-policy: keep;
- /metrics admits only the named namespace and label; every component has an egress policy
  (routers: workers' gRPC port and DNS; prefill: decode pods' KV port and DNS; decode:
  nothing; prefill <-> decode on every TCP port where NCCL may run);
- values-insecure.yaml turns off exactly those (each setting commented with what it turns off
  and the risk) and changes nothing else;
- for every values file (defaults, values-insecure.yaml, tests/deploy/helm/*.yaml) the
  secrets, TLS and the NetworkPolicies (every edge, in and out) are wired as the values say;
- bad security values fail rendering with a message saying what to set.

Each check runs on its own and every failure is listed, so running this against an older chart
(TANDEM_HELM_CHART=DIR) shows which of its defaults fall short.

Usage: helm_security_test.py BUILD_DIR
"""
import base64
import hashlib
import json
import os
import re
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploylib import check  # noqa: E402
from helmlib import (CHART, VALUES_DIR, Rendered, RenderError, arg,  # noqa: E402
                     build_renderer, component, container, load_values, render)
from helmsecurity import (check_api_keys_wiring, check_cluster_secret_wiring,  # noqa: E402
                          check_generated_certificate, check_kv_secret_wiring,
                          check_policy_wiring, check_tls_wiring, component_policy, metrics_peer,
                          parse_key_file, policy_edges, secret_data)

FULL = "prod-tandem"  # the resource prefix of release `prod` (helmlib's) with default values


class Context:
    """Renders on demand, each once."""

    def __init__(self, renderer):
        self.renderer = renderer
        self.cache = {}

    def render(self, files=(), sets=(), existing=None):
        key = (tuple(files), tuple(sets), repr(existing))
        if key not in self.cache:
            self.cache[key] = Rendered(render(self.renderer, files, sets, existing=existing))
        return self.cache[key]

    def default(self):
        return self.render()




INSECURE = os.path.join(CHART, "values-insecure.yaml")


def values_cases():
    return [("defaults", []), ("values-insecure.yaml", [INSECURE])] + [
        (f, [os.path.join(VALUES_DIR, f)]) for f in sorted(os.listdir(VALUES_DIR))
        if f.endswith(".yaml")]


def check_every_values_file(ctx):
    for name, files in values_cases():
        r, v = ctx.render(files), load_values(files)
        for wiring in (check_api_keys_wiring, check_cluster_secret_wiring, check_kv_secret_wiring,
                       check_tls_wiring, check_policy_wiring):
            wiring(r, v, name)


# ---- The defaults: locked down ----------------------------------------------------------

def check_default_api_keys(ctx):
    """The router never runs keyless by default: a generated key whose digest is mounted."""
    r = ctx.default()
    router = container(r.by_component()["router"])
    check(arg(router, "--api-keys") == "/etc/tandem/api-keys/api-keys",
          f"default router args lack --api-keys: {router['args']}")
    made = r.find("Secret", f"{FULL}-api-keys")
    check(made is not None, "no API key Secret by default")
    check_api_keys_wiring(r, load_values([]), "defaults")
    notes = render(ctx.renderer, notes=True)
    check(f"secret {FULL}-api-keys" in notes and "admin-key" in notes,
          f"NOTES.txt does not say how to read the generated key:\n{notes}")


def check_api_keys_values(ctx):
    """apiKeys.file lines join the generated key; existingSecret replaces the chart's Secret."""
    digest = hashlib.sha256(b"sk-tenant-a").hexdigest()
    lines = f"tenant acme requests_per_minute=60\ntenant admin\nkey {digest} acme"
    sets = ["apiKeys.file=" + lines]
    r = ctx.render(sets=sets)
    check_api_keys_wiring(r, load_values([], sets), "apiKeys.file")
    tenants, keys = parse_key_file(secret_data(r.get("Secret", f"{FULL}-api-keys"), "api-keys"))
    check(set(tenants) == {"acme", "admin"} and len(keys) == 2 and
          (digest, "acme", "scopes=generate") in keys, f"apiKeys.file: {tenants} {keys}")
    sets = ["apiKeys.file=" + lines, "apiKeys.generatedKey.enabled=false"]
    r = ctx.render(sets=sets)
    check_api_keys_wiring(r, load_values([], sets), "no generated key")
    sets = ["apiKeys.existingSecret=my-keys"]
    r = ctx.render(sets=sets)
    check_api_keys_wiring(r, load_values([], sets), "apiKeys.existingSecret")
    # Annotated so that a change of the key file's source rolls the routers.
    a = r.by_component()["router"]["spec"]["template"]["metadata"]["annotations"]
    b = ctx.default().by_component()["router"]["spec"]["template"]["metadata"]["annotations"]
    check(a.get("checksum/api-keys") and a["checksum/api-keys"] != b.get("checksum/api-keys"),
          "a change of apiKeys does not roll the routers")


def check_default_tls(ctx):
    """TLS on every listener by default, from a chart-made CA whose key is nowhere."""
    r = ctx.default()
    for w in r.workloads():
        c = container(w)
        check(arg(c, "--tls-cert") and arg(c, "--tls-key") and arg(c, "--tls-ca"),
              f"{component(w)}: no TLS flags by default: {c['args']}")
    check_tls_wiring(r, load_values([]), "defaults")
    check_generated_certificate(r.get("Secret", f"{FULL}-tls"), FULL)
    keys = [m for m in r.of("Secret") if "PRIVATE KEY" in json.dumps(
        {k: base64.b64decode(x).decode(errors="replace") for k, x in m["data"].items()})]
    check(not any("PRIVATE KEY" in json.dumps(m) for m in r.docs if m["kind"] != "Secret"),
          "a private key outside a Secret")
    check([m["metadata"]["name"] for m in keys] == [f"{FULL}-tls"] and
          "PRIVATE KEY" in secret_data(keys[0], "tls.key") and
          "PRIVATE KEY" not in secret_data(keys[0], "ca.crt") + secret_data(keys[0], "tls.crt"),
          "a private key besides the certificate's (the CA's must be discarded)")
    notes = render(ctx.renderer, notes=True)
    check("ca.crt" in notes and "-cacert ca.crt" in notes and "-plaintext" not in notes,
          f"NOTES.txt does not show a TLS call:\n{notes}")
    # The ServiceMonitor scrapes over https, verifying the name the certificate carries.
    sets = ["metrics.serviceMonitor.enabled=true"]
    check_tls_wiring(ctx.render(sets=sets), load_values([], sets), "serviceMonitor")


def check_tls_sources(ctx):
    """cert-manager or a given Secret replace the generated certificate."""
    for sets in (["tls.certManager.enabled=true", "tls.certManager.issuerRef.name=ca"],
                 ["tls.secretName=mine"],
                 ["tls.secretName=mine", "tls.workerServerName=tandem-worker",
                  "metrics.serviceMonitor.enabled=true"],
                 ["tls.generated.enabled=false", "tls.secretName=mine"]):
        check_tls_wiring(ctx.render(sets=sets), load_values([], sets), f"--set {sets}")


def check_default_kv_secret(ctx):
    """Every prefill and decode worker gets the KV secret by default, none runs without it."""
    r = ctx.default()
    workers = [w for w in r.workloads() if component(w) != "router"]
    check(len(workers) == 2, f"workers: {[w['metadata']['name'] for w in workers]}")
    for w in workers:
        c = container(w)
        check(arg(c, "--kv-secret-file") == "/etc/tandem/kv/kv-secret",
              f"{component(w)}: no --kv-secret-file by default: {c['args']}")
        check("--allow-unauthenticated-kv" not in c["args"], f"{component(w)}: unauthenticated")
    check_kv_secret_wiring(r, load_values([]), "defaults")
    for sets in (["kvSecret.existingSecret=kv"], ["kvSecret.create=false"],
                 ["prefill.kvTransport=nccl"]):
        check_kv_secret_wiring(ctx.render(sets=sets), load_values([], sets), f"--set {sets}")


def check_default_metrics_ingress(ctx):
    """By default /metrics admits only pods with the named label in the named namespace, and
    the API clients' ingress is as before (anyone: the router checks keys)."""
    r = ctx.default()
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    for role in r.by_component():
        spec = component_policy(r, role)
        rules = [rule for rule in spec["ingress"]
                 if any(p.get("port") == 9400 for p in rule.get("ports", []))]
        check(len(rules) == 1 and rules[0].get("from") == [peer],
              f"{role}: /metrics from {[x.get('from') for x in rules]}, not {peer}")
        if role == "router":
            api = [rule for rule in spec["ingress"]
                   if any(p.get("port") == 50051 for p in rule["ports"])]
            check(api == [{"ports": [{"port": 50051, "protocol": "TCP"}]}],
                  f"router: the API clients' ingress changed: {api}")
    # Another namespace and label: exactly those.
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write("networkPolicy: {metrics: {namespace: obs, podLabels: {app: prom}}}\n")
        f.flush()
        r2, v2 = ctx.render([f.name]), load_values([f.name])
        labels = {"app": "prom", "app.kubernetes.io/name": "prometheus"}  # Helm merges maps
        check(metrics_peer(v2) == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}},
            "podSelector": {"matchLabels": labels}}, "values merge")
        check_policy_wiring(r2, v2, "metrics: obs, app=prom")


def check_default_egress(ctx):
    """Every component has an egress policy: routers to workers' gRPC port and DNS, prefill pods
    to decode pods (KV port; every TCP port where NCCL may run) and DNS, decode pods nowhere but
    prefill pods for NCCL."""
    r = ctx.default()
    v = load_values([])
    ws = r.by_component()
    dns = {("dns", "53/UDP"), ("dns", "53/TCP")}
    worker, kv = "50061/TCP", "50062/TCP"
    for role in ws:
        spec = component_policy(r, role)
        check(spec["policyTypes"] == ["Ingress", "Egress"] and "egress" in spec,
              f"{role}: no egress policy: {spec['policyTypes']}")
        out = policy_edges(spec["egress"], "to", ws, v, role)
        # The cuda image with kvTransport auto may pick nccl: prefill <-> decode on every port.
        want = {"router": {("decode", worker), ("prefill", worker)} | dns,
                "prefill": {("decode", "TCP")} | dns,
                "decode": {("prefill", "TCP")}}[role]
        check(out == want, f"{role}: egress {sorted(out)} != {sorted(want)}")
        check(all(rule.get("to") for rule in spec["egress"]), f"{role}: egress to anywhere")
    check_policy_wiring(r, v, "defaults")
    # Without NCCL (the cpu image, tcp, cuda-ipc): prefill -> decode on the KV port only, and
    # decode pods connect nowhere.
    for sets in (["image.flavor=cpu"], ["prefill.kvTransport=tcp"],
                 ["prefill.kvTransport=cuda-ipc", "cudaIpc.hostIPC=true"]):
        r2 = ctx.render(sets=sets)
        v2 = load_values([], sets)
        check_policy_wiring(r2, v2, f"--set {sets}")
        check(component_policy(r2, "decode")["egress"] == [], f"{sets}: decode egress")
        check(policy_edges(component_policy(r2, "prefill")["egress"], "to", r2.by_component(),
                           v2, "prefill") == {("decode", kv)} | dns, f"{sets}: prefill egress")


# What values-insecure.yaml turns off, as its comments say.
INSECURE_FLAGS = ("--api-keys", "--tls-cert", "--tls-key", "--tls-ca", "--tls-server-name",
                  "--kv-secret-file", "--allow-unauthenticated-kv")
INSECURE_VOLUMES = ("api-keys", "tls", "kv-secret")
INSECURE_SECRETS = ("api-keys", "tls", "kv-secret")


def without_insecure_differences(r):
    """The render with everything values-insecure.yaml may change taken out."""
    out = []
    for m in r.docs:
        m = json.loads(json.dumps(m))
        name = m["metadata"]["name"]
        if m["kind"] == "Secret":
            if any(name.endswith("-" + s) for s in INSECURE_SECRETS):
                continue
            m["data"] = sorted(m["data"])  # random per install
        if m["kind"] in ("Deployment", "StatefulSet"):
            t = m["spec"]["template"]
            t["metadata"]["annotations"].pop("checksum/api-keys", None)
            t["metadata"]["annotations"].pop("prometheus.io/scheme", None)
            spec = t["spec"]
            spec["volumes"] = [x for x in spec["volumes"] if x["name"] not in INSECURE_VOLUMES]
            for c in spec["containers"]:
                c["args"] = [a for a in c["args"] if a.split("=")[0] not in INSECURE_FLAGS]
                c["volumeMounts"] = [x for x in c["volumeMounts"]
                                     if x["name"] not in INSECURE_VOLUMES]
                for p in ("startupProbe", "livenessProbe", "readinessProbe"):
                    c[p] = {k: x for k, x in c[p].items() if k not in ("grpc", "tcpSocket")}
        if m["kind"] == "NetworkPolicy":
            m["spec"].pop("egress", None)
            m["spec"].pop("policyTypes")
            for rule in m["spec"]["ingress"]:
                for peer in rule.get("from", []):
                    peer.pop("namespaceSelector", None)
        out.append(m)
    return sorted(out, key=lambda m: (m["kind"], m["metadata"]["name"]))


def check_insecure_values(ctx):
    """values-insecure.yaml turns off exactly what its comments say, each setting commented
    with what it turns off and the risk, and the render differs from the defaults only there."""
    lines = open(INSECURE).read().splitlines()
    settings = 0
    for i, line in enumerate(lines):
        if re.match(r"^\s*[\w.-]+:\s*\S", line) and not line.lstrip().startswith("#"):
            settings += 1
            block = []
            j = i - 1
            while j >= 0 and lines[j].lstrip().startswith("#"):
                block.insert(0, lines[j])
                j -= 1
            text = " ".join(block)
            check("Turns off:" in text and "Risk:" in text,
                  f"values-insecure.yaml line {i + 1} ({line.strip()}): no 'Turns off:'/'Risk:'")
    check(settings == 5, f"values-insecure.yaml sets {settings} values, its comments say 5")
    r = ctx.render([INSECURE])
    v = load_values([INSECURE])
    ws = r.by_component()
    router = container(ws["router"])
    check(arg(router, "--api-keys") is None, "insecure: the router still needs keys")
    for role, w in ws.items():
        c = container(w)
        check(not any(a.startswith("--tls") for a in c["args"]), f"insecure: {role}: TLS")
        if role != "router":
            check("--allow-unauthenticated-kv" in c["args"] and
                  arg(c, "--kv-secret-file") is None, f"insecure: {role}: KV secret")
        spec = component_policy(r, role)
        check(spec["policyTypes"] == ["Ingress"] and "egress" not in spec,
              f"insecure: {role}: egress policy")
        metrics = [rule["from"] for rule in spec["ingress"]
                   if any(p.get("port") == 9400 for p in rule["ports"])]
        check(metrics == [[{"namespaceSelector": {},
                            "podSelector": {"matchLabels": {"app.kubernetes.io/name":
                                                            "prometheus"}}}]],
              f"insecure: {role}: /metrics from {metrics}")
    check(not any(r.find("Secret", f"{FULL}-{s}") for s in INSECURE_SECRETS),
          "insecure: a chart-made API key, TLS or KV Secret")
    check(r.find("Secret", f"{FULL}-cluster-secret"), "insecure: the cluster secret is kept")
    for wiring in (check_api_keys_wiring, check_kv_secret_wiring, check_tls_wiring,
                   check_policy_wiring):
        wiring(r, v, "values-insecure.yaml")
    # Nothing else differs from the defaults.
    a, b = without_insecure_differences(ctx.default()), without_insecure_differences(r)
    check(a == b, "values-insecure.yaml changes more than it says: " + next(
        (f"{x['kind']}/{x['metadata']['name']}" for x, y in zip(a, b) if x != y), "count"))
    notes = render(ctx.renderer, [INSECURE], notes=True)
    check(all(w in notes for w in ("API keys: OFF", "TLS: OFF", "KV secret: OFF",
                                   "ANY namespace", "Egress NetworkPolicies: OFF")),
          f"insecure: NOTES.txt does not warn:\n{notes}")


GENERATED = [("Secret", f"{FULL}-api-keys"), ("Secret", f"{FULL}-cluster-secret"),
             ("Secret", f"{FULL}-tls"), ("Secret", f"{FULL}-kv-secret")]


def check_upgrade_keeps_generated(ctx):
    """Everything the chart generates is read back on upgrade (lookup) and kept on uninstall;
    without the previous objects (a first install) it is fresh."""
    first = ctx.default()
    objects = []
    for kind, name in GENERATED:
        obj = first.find(kind, name)
        check(obj is not None, f"no {kind}/{name} by default")
        check(obj["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep",
              f"{kind}/{name} is not kept on uninstall")
        objects.append(dict(obj, metadata=dict(obj["metadata"], namespace="serving")))
    upgraded = ctx.render(existing=objects)
    again = ctx.render(sets=["router.replicas=3"])  # another first install
    for kind, name in GENERATED:
        check(upgraded.get(kind, name)["data"] == first.get(kind, name)["data"],
              f"an upgrade changed {kind}/{name}")
        check(again.get(kind, name)["data"] != first.get(kind, name)["data"],
              f"{kind}/{name} is not random per install")


# ---- Bad values ----------------------------------------------------------------------------

FAILURES = [
    (["apiKeys.generatedKey.enabled=false"], "apiKeys: no keys"),
    (["apiKeys.file=tenant a\nkey sk-raw-key a"], "apiKeys.file line 2: a key line is"),
    (["tls.generated.enabled=false"], "tls.enabled needs a certificate: set tls.certManager"),
    (["tls.certManager.enabled=true"], "tls.certManager.issuerRef.name is required"),
    (["kvSecret.secretName=kv"], "kvSecret.secretName is now kvSecret.existingSecret"),
    (["networkPolicy.metrics.namespace="], "networkPolicy.metrics.namespace is required"),
    (["networkPolicy.metrics.podLabels=null"], "networkPolicy.metrics.podLabels is required"),
    (["networkPolicy.metricsFrom.x=y"], "networkPolicy.metricsFrom is now networkPolicy.metrics"),
]


def check_failures(ctx):
    for sets, message in FAILURES:
        try:
            render(ctx.renderer, sets=sets)
            raise AssertionError(f"--set {sets} rendered, expected: {message}")
        except RenderError as e:
            check(message in str(e), f"--set {sets}: {e}")


CHECKS = [
    check_default_api_keys,
    check_api_keys_values,
    check_default_tls,
    check_tls_sources,
    check_default_kv_secret,
    check_default_metrics_ingress,
    check_default_egress,
    check_insecure_values,
    check_upgrade_keeps_generated,
    check_every_values_file,
    check_failures,
]


def main():
    ctx = Context(build_renderer(sys.argv[1]))
    failed = 0
    for fn in CHECKS:
        try:
            fn(ctx)
            print(f"ok: {fn.__name__}")
        except Exception as e:  # noqa: B902 (an older chart lacks values: KeyError and such)
            failed += 1
            detail = str(e) if isinstance(e, (AssertionError, RenderError)) else \
                traceback.format_exc(limit=-1)
            print(f"FAIL: {fn.__name__}: {detail}")
    print(f"{'FAIL' if failed else 'PASS'}: {failed} of {len(CHECKS)} checks failed ({CHART})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
