"""The security wiring of a rendered deploy/helm/tandem, checked against its values: API keys,
the cluster and KV secrets, TLS (the generated certificate with openssl) and every
NetworkPolicy edge in and out. Used by helm_security_test.py for every values file."""
import base64
import hashlib
import os
import re
import subprocess
import tempfile

from deploylib import check
from helmlib import arg, component, container, pod_labels, pod_spec, selects


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


def component_policy(r, role):
    (policy,) = [p for p in r.of("NetworkPolicy")
                 if selects(p["spec"]["podSelector"]["matchLabels"],
                            pod_labels(r.by_component()[role]))]
    return policy["spec"]
