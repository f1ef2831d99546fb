#!/usr/bin/python3
"""deploy/helm/tandem is locked down by default (issue 41), checked offline on rendered manifests:

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
import subprocess
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploylib import check  # noqa: E402
from helmlib import (CHART, VALUES_DIR, Rendered, RenderError, arg,  # noqa: E402
                     build_renderer, component, container, load_values, pod_labels, pod_spec,
                     render, selects)

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


def secret_data(secret, key):
    return base64.b64decode(secret["data"][key]).decode()


def volumes_of(w):
    return {vol["name"]: vol for vol in pod_spec(w)["volumes"]}


def mount(c, volume):
    found = [m for m in c["volumeMounts"] if m["name"] == volume]
    return found[0] if found else None


def parse_key_file(text):
    """A Python reading of router/access_control.h's format: ({tenant: limits}, [(digest,
    tenant, scopes)]); raises AssertionError on what the router would refuse."""
    tenants, keys = {}, []
    for n, line in enumerate(text.splitlines(), 1):
        f = line.split("#", 1)[0].split()
        if not f:
            continue
        if f[0] == "tenant":
            check(len(f) >= 2 and re.fullmatch(r"[A-Za-z0-9._-]+", f[1]), f"line {n}: {line}")
            check(f[1] not in tenants, f"line {n}: tenant {f[1]} declared twice")
            tenants[f[1]] = f[2:]
        else:
            check(f[0] == "key" and len(f) in (3, 4), f"line {n}: {line}")
            check(re.fullmatch(r"[0-9a-fA-F]{64}", f[1]), f"line {n}: not a SHA-256 digest")
            keys.append((f[1].lower(), f[2], f[3] if len(f) == 4 else "scopes=generate"))
    for digest, tenant, _ in keys:
        check(tenant in tenants, f"key {digest[:8]}: no tenant {tenant}")
    check(len({k[0] for k in keys}) == len(keys), "the same key twice")
    return tenants, keys


# ---- Per values file: the secrets and TLS wired as the values say --------------------------

def full_name(r):
    return r.by_component()["router"]["metadata"]["name"].removesuffix("-router")


def check_api_keys_wiring(r, v, name):
    ws = r.by_component()
    ak = v["apiKeys"]
    secret = (ak["existingSecret"] or f"{full_name(r)}-api-keys") if ak["enabled"] else ""
    made = r.find("Secret", f"{full_name(r)}-api-keys")
    check(bool(made) == bool(ak["enabled"] and not ak["existingSecret"]),
          f"{name}: the chart makes the API key Secret iff keys are on and none is given")
    for role, w in ws.items():
        c = container(w)
        flag = arg(c, "--api-keys")
        if role == "router" and secret:
            check(flag == f"{ak['mountPath']}/api-keys", f"{name}: router --api-keys={flag}")
            vol = volumes_of(w)["api-keys"]["secret"]
            check(vol["secretName"] == secret, f"{name}: the key file's Secret {vol}")
            # Only the key file is mounted, never the generated key itself.
            check(vol["items"] == [{"key": ak["key"], "path": "api-keys"}],
                  f"{name}: the api-keys volume mounts only the key file: {vol['items']}")
            m = mount(c, "api-keys")
            check(m and m["readOnly"] and m["mountPath"] == ak["mountPath"],
                  f"{name}: api-keys mounted read-only: {m}")
        else:
            check(flag is None and "api-keys" not in volumes_of(w),
                  f"{name}: {role}: no API keys ({flag})")
    if made:
        check(made["metadata"]["annotations"].get("helm.sh/resource-policy") == "keep",
              f"{name}: the API key Secret is kept on uninstall")
        tenants, keys = parse_key_file(secret_data(made, ak["key"]))
        gen = ak["generatedKey"]
        if gen["enabled"]:
            key = secret_data(made, "admin-key")
            check(re.fullmatch(r"sk-[A-Za-z0-9]{43}", key), f"{name}: generated key {key!r}")
            mine = [k for k in keys if k[0] == hashlib.sha256(key.encode()).hexdigest()]
            check(mine == [(mine[0][0], gen["tenant"], f"scopes={gen['scopes']}")] if mine else
                  False, f"{name}: the file holds the generated key's digest: {keys}")
            check(key not in secret_data(made, ak["key"]), f"{name}: the raw key in the file")
        else:
            check("admin-key" not in made["data"], f"{name}: no generated key")
        for line in ak["file"].splitlines():
            check(line in secret_data(made, ak["key"]).splitlines(),
                  f"{name}: apiKeys.file line {line!r} missing")


def check_cluster_secret_wiring(r, v, name):
    cs = v["clusterSecret"]
    full = full_name(r)
    secret_name = cs["existingSecret"] or (f"{full}-cluster-secret" if cs["create"] else "")
    made = r.find("Secret", f"{full}-cluster-secret")
    check(bool(made) == bool(cs["create"] and not cs["existingSecret"]),
          f"{name}: cluster Secret created: {bool(made)}")
    if made:
        raw = base64.b64decode(made["data"][cs["key"]])
        check(len(raw) >= 32, f"{name}: the cluster secret has {len(raw)} bytes")
    for w in r.workloads():
        volumes = volumes_of(w)
        c = container(w)
        f = arg(c, "--cluster-secret-file")
        if secret_name:
            check(f == f"{cs['mountPath']}/cluster-secret",
                  f"{name}: {component(w)}: --cluster-secret-file={f}")
            check(volumes["cluster-secret"]["secret"]["secretName"] == secret_name,
                  f"{name}: {component(w)}: cluster secret volume")
            check(mount(c, "cluster-secret")["readOnly"], f"{name}: cluster secret mount")
        else:
            check(f is None, f"{name}: no --cluster-secret-file without a secret")


def check_kv_secret_wiring(r, v, name):
    """Prefill and decode workers prove the KV secret to each other, or (without one) run with
    --allow-unauthenticated-kv, which they require from the command line then."""
    kv = v["kvSecret"]
    full = full_name(r)
    secret = kv["existingSecret"] or (f"{full}-kv-secret" if kv["create"] else "")
    made = r.find("Secret", f"{full}-kv-secret")
    check(bool(made) == bool(kv["create"] and not kv["existingSecret"]),
          f"{name}: KV Secret created: {bool(made)}")
    if made:
        check(len(base64.b64decode(made["data"][kv["key"]])) >= 32,
              f"{name}: the KV secret is short")
        check(made["metadata"]["annotations"].get("helm.sh/resource-policy") == "keep",
              f"{name}: the KV Secret is not kept on uninstall")
    for w in r.workloads():
        role, c = component(w), container(w)
        where = f"{name}: {role}"
        kv_file = arg(c, "--kv-secret-file")
        allow = "--allow-unauthenticated-kv" in c["args"]
        if role == "router":
            check(kv_file is None and not allow and "kv-secret" not in volumes_of(w),
                  f"{where}: the router holds no KV secret")
        elif secret:
            check(kv_file == f"{kv['mountPath']}/kv-secret", f"{where}: --kv-secret-file={kv_file}")
            check(not allow, f"{where}: --allow-unauthenticated-kv with a KV secret")
            vol = volumes_of(w)["kv-secret"]["secret"]
            check(vol["secretName"] == secret and
                  vol["items"] == [{"key": kv["key"], "path": "kv-secret"}],
                  f"{where}: kv secret volume {vol}")
            check(mount(c, "kv-secret")["readOnly"] and
                  mount(c, "kv-secret")["mountPath"] == kv["mountPath"], f"{where}: kv mount")
        else:
            check(kv_file is None and allow, f"{where}: no KV secret needs "
                  f"--allow-unauthenticated-kv: {c['args']}")


def tls_secret_name(r, v):
    """The Secret the pods' certificate is in, as values.yaml says."""
    tls = v["tls"]
    if tls["certManager"]["enabled"] or not tls["secretName"]:
        return tls["secretName"] or f"{full_name(r)}-tls"
    return tls["secretName"]


def check_tls_wiring(r, v, name):
    ws = r.by_component()
    tls = v["tls"]
    secret = tls_secret_name(r, v)
    chart_cert = tls["certManager"]["enabled"] or not tls["secretName"]
    server_name = f"{full_name(r)}-worker" if chart_cert else tls["workerServerName"]
    for w in r.workloads():
        c = container(w)
        where = f"{name}: {component(w)}"
        annotations = w["spec"]["template"]["metadata"]["annotations"]
        if tls["enabled"]:
            for flag, file in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key"),
                               ("--tls-ca", "ca.crt")):
                check(arg(c, flag) == f"{tls['mountPath']}/{file}", f"{where}: {flag}")
            check(("--tls-client-auth" in c["args"]) == tls["mutual"], f"{where}: mTLS")
            check(volumes_of(w)["tls"]["secret"]["secretName"] == secret, f"{where}: tls secret")
            check(mount(c, "tls")["readOnly"], f"{where}: tls mount")
            # The kubelet speaks no TLS to gRPC health: the probes connect over TCP instead.
            check(all("tcpSocket" in c[p] for p in ("startupProbe", "livenessProbe",
                                                    "readinessProbe")), f"{where}: probes")
            if v["metrics"]["enabled"]:
                check(annotations.get("prometheus.io/scheme") == "https",
                      f"{where}: /metrics is scraped over https")
        else:
            check(not any(a.startswith("--tls") for a in c["args"]) and
                  "tls" not in volumes_of(w), f"{where}: no TLS")
    router = container(ws["router"])
    check(arg(router, "--tls-server-name") == (server_name if tls["enabled"] and server_name
                                               else None),
          f"{name}: router --tls-server-name={arg(router, '--tls-server-name')}")
    for sm in r.of("ServiceMonitor"):
        for ep in sm["spec"]["endpoints"]:
            if tls["enabled"]:
                tc = ep.get("tlsConfig", {})
                check(ep.get("scheme") == "https" and
                      tc.get("ca", {}).get("secret", {}).get("name") == secret,
                      f"{name}: ServiceMonitor scrapes https with the release's CA")
                check(("keySecret" in tc) == tls["mutual"],
                      f"{name}: ServiceMonitor client certificate under mTLS")
                want = v["metrics"]["serviceMonitor"]["tlsServerName"] or server_name
                check(tc.get("serverName") == (want or None),
                      f"{name}: ServiceMonitor serverName {tc.get('serverName')} != {want}")
            else:
                check(ep.get("scheme", "http") == "http", f"{name}: ServiceMonitor scheme")
    certs = r.of("Certificate")
    made = r.find("Secret", f"{full_name(r)}-tls")
    cm = tls["enabled"] and tls["certManager"]["enabled"]
    check(len(certs) == int(cm), f"{name}: {len(certs)} Certificates")
    check(bool(made) == bool(tls["enabled"] and not cm and not tls["secretName"]),
          f"{name}: the chart generates a certificate iff TLS is on and nothing else gives one")
    for cert in certs:
        check(cert["spec"]["secretName"] == secret, f"{name}: Certificate -> the tls volume")
        check({"server auth", "client auth"} <= set(cert["spec"]["usages"]), f"{name}: usages")
        router_dns = arg(router, "--decode-dns").split(":")[0]
        check(f"*.{router_dns}" in cert["spec"]["dnsNames"], f"{name}: names the decode pods")
        check(server_name in cert["spec"]["dnsNames"],
              f"{name}: the router verifies workers by a name the certificate carries")


def openssl(*args, stdin=None):
    r = subprocess.run(["openssl", *args], input=stdin, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def check_generated_certificate(secret, full, namespace="serving"):
    """The chart's generated CA and certificate, checked with openssl."""
    check(secret["type"] == "kubernetes.io/tls" and
          set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"},
          f"generated TLS Secret: {secret['type']} {sorted(secret['data'])}")
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for key in secret["data"]:
            files[key] = os.path.join(tmp, key)
            open(files[key], "w").write(secret_data(secret, key))
        for purpose in ("sslserver", "sslclient"):
            rc, out = openssl("verify", "-purpose", purpose, "-CAfile", files["ca.crt"],
                              files["tls.crt"])
            check(rc == 0, f"the certificate does not verify as {purpose} against ca.crt: {out}")
        rc, out = openssl("x509", "-in", files["tls.crt"], "-noout", "-ext", "subjectAltName")
        check(rc == 0, out)
        names = set(re.findall(r"DNS:([^,\s]+)", out))
        suffix = f"{namespace}.svc.cluster.local"
        want = {f"{full}-worker", f"{full}-router", f"{full}-router.{suffix}",
                f"*.{full}-decode-headless.{suffix}", f"*.{full}-prefill-headless.{suffix}"}
        check(want <= names, f"the certificate lacks names {sorted(want - names)}")
        # The key matches the certificate.
        _, pub_cert = openssl("x509", "-in", files["tls.crt"], "-noout", "-pubkey")
        _, pub_key = openssl("pkey", "-in", files["tls.key"], "-pubout")
        check(pub_cert == pub_key, "tls.key is not the certificate's key")
        rc, out = openssl("x509", "-in", files["ca.crt"], "-noout", "-ext", "basicConstraints")
        check("CA:TRUE" in out, f"ca.crt is not a CA: {out}")


def nccl_possible(v):
    return v["image"]["flavor"] == "cuda" and v["prefill"]["kvTransport"] in ("auto", "nccl") \
        and v["prefill"]["enabled"]


def metrics_peer(v):
    m = v["networkPolicy"]["metrics"]
    return {"namespaceSelector": {} if m["anyNamespace"] else
            {"matchLabels": {"kubernetes.io/metadata.name": m["namespace"]}},
            "podSelector": {"matchLabels": m["podLabels"]}}


def policy_edges(rules, direction, ws, v, where):
    """A policy's rules as a set of (peer, port): peer is a component of this release (pods of
    the namespace whose labels select exactly its pods), "metrics", "dns", "clients" or "any";
    port is "50061/TCP", "TCP" (every TCP port) or "all"."""
    np = v["networkPolicy"]
    edges = set()
    for rule in rules:
        peers = rule.get(direction)
        names = []
        for peer in peers if peers is not None else [None]:
            if peer is None:
                names.append("any")
            elif peer == metrics_peer(v):
                names.append("metrics")
            elif peer in np["egress"]["dns"]["to"] and direction == "to":
                names.append("dns")
            elif peer in np["clientsFrom"] and direction == "from":
                names.append("clients")
            else:
                hit = [c for c, w in ws.items()
                       if set(peer) == {"podSelector"} and
                       selects(peer["podSelector"].get("matchLabels", {}), pod_labels(w))]
                check(len(hit) == 1, f"{where}: a peer that is not one component: {peer}")
                names.append(hit[0])
        ports = rule.get("ports")
        for p in ports if ports is not None else [None]:
            port = "all" if p is None else \
                (f"{p['port']}/{p['protocol']}" if "port" in p else p["protocol"])
            edges |= {(n, port) for n in names}
    return edges


def expected_edges(v, ws):
    """What the values ask for: {component: (ingress edges, egress edges)}."""
    ports = {k: f"{p}/TCP" for k, p in v["ports"].items()}
    np = v["networkPolicy"]
    metrics = {("metrics", ports["metrics"])} if v["metrics"]["enabled"] else set()
    dns = {("dns", f"{p['port']}/{p['protocol']}") for p in np["egress"]["dns"]["ports"]}
    nccl = nccl_possible(v)
    prefill = "prefill" in ws
    out = {
        "router": ({("clients" if np["clientsFrom"] else "any", ports["router"])} | metrics,
                   {(c, ports["worker"]) for c in ws if c != "router"} | dns),
        "decode": ({("router", ports["worker"])} | metrics |
                   ({("prefill", "TCP" if nccl else ports["kv"])} if prefill else set()),
                   {("prefill", "TCP")} if nccl else set()),
    }
    if prefill:
        out["prefill"] = ({("router", ports["worker"])} | metrics |
                          ({("decode", "TCP")} if nccl else set()),
                          {("decode", "TCP" if nccl else ports["kv"])} | dns)
    return out


def check_policy_wiring(r, v, name):
    """Each component's NetworkPolicy admits exactly the edges the values ask for, in and out,
    and opens only ports its pods listen on."""
    ws = r.by_component()
    policies = r.of("NetworkPolicy")
    np = v["networkPolicy"]
    if not np["enabled"]:
        check(not policies, f"{name}: NetworkPolicies disabled")
        return
    check(len(policies) == len(ws), f"{name}: one NetworkPolicy per component")
    want = expected_edges(v, ws)
    for role, w in ws.items():
        where = f"{name}: {role}"
        mine = [p for p in policies if selects(p["spec"]["podSelector"]["matchLabels"],
                                               pod_labels(w))]
        check(len(mine) == 1, f"{where}: pods under {len(mine)} NetworkPolicies")
        spec = mine[0]["spec"]
        egress = np["egress"]["enabled"]
        check(spec["policyTypes"] == (["Ingress", "Egress"] if egress else ["Ingress"]),
              f"{where}: policyTypes {spec['policyTypes']}")
        ingress = policy_edges(spec["ingress"], "from", ws, v, where)
        check(ingress == want[role][0], f"{where}: ingress {sorted(ingress)} != "
              f"{sorted(want[role][0])}")
        if egress:
            check("egress" in spec, f"{where}: no egress rules (allows everything)")
            out = policy_edges(spec["egress"], "to", ws, v, where)
            check(out == want[role][1], f"{where}: egress {sorted(out)} != "
                  f"{sorted(want[role][1])}")
        else:
            check("egress" not in spec, f"{where}: egress rules without Egress")
        listening = {f"{cp['containerPort']}/TCP" for cp in container(w).get("ports", [])}
        opened = {port for _, port in ingress if "/" in port}
        check(opened <= listening, f"{where}: policy opens {sorted(opened - listening)}")


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


def component_policy(r, role):
    (policy,) = [p for p in r.of("NetworkPolicy")
                 if selects(p["spec"]["podSelector"]["matchLabels"],
                            pod_labels(r.by_component()[role]))]
    return policy["spec"]


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
        check(metrics_peer(v2) == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}},
            "podSelector": {"matchLabels": {"app": "prom", "app.kubernetes.io/name": "prometheus"}}},
            "values merge")
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
