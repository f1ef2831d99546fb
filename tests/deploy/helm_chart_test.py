#!/usr/bin/python3
"""deploy/helm/tandem renders and deploys correctly, checked without a cluster:

1. helm-render (deploy/helm/render/main.go, built here from Debian's Go, Sprig and yaml
   packages) renders the chart with default values and with values files that switch every
   option on or pick the other alternatives (tests/deploy/helm/*.yaml), in strict mode (a
   reference to a value that does not exist fails);
2. every rendered manifest validates against the Kubernetes schemas of the npm package
   kubernetes-models (and prometheus-operator's for ServiceMonitor/PrometheusRule), with unknown
   fields rejected (tests/deploy/k8s-validate/validate.js);
3. the wiring holds: Service selectors match pod labels and their target ports exist, probes
   use existing ports, the StatefulSet's serviceName is the decode headless Service, the
   router's --decode-dns/--prefill-dns resolve to the headless Services, every $(VAR) in args
   is defined, volumes, claims, HPA targets, PDB selectors, the ServiceMonitor, the dashboard
   ConfigMaps and the PrometheusRule match what they point at (TLS, API keys, secrets and
   NetworkPolicies: helm_security_test.py);
4. bad values fail with a clear message, and the validator itself catches planted mistakes.

Usage: helm_chart_test.py BUILD_DIR
"""
import copy
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploylib  # noqa: E402
from deploylib import check  # noqa: E402

from helmlib import (CHART, NAMESPACE, VALUES_DIR, Rendered, RenderError, arg,  # noqa: E402
                     build_renderer, component, load_values, pod_labels, pod_spec, render,
                     selects, validate_schemas)


def check_wiring(r, values, name):
    v = values
    ws = {component(w): w for w in r.workloads()}
    expected = {"router", "decode"} | ({"prefill"} if v["prefill"]["enabled"] else set())
    check(set(ws) == expected, f"{name}: workloads {sorted(ws)} != {sorted(expected)}")
    check(ws["decode"]["kind"] == "StatefulSet", f"{name}: decode is a StatefulSet")
    configmaps = {m["metadata"]["name"]: m for m in r.of("ConfigMap")}

    # Services select pods and target existing ports.
    services = r.of("Service")
    for s in services:
        sel = s["spec"]["selector"]
        matched = [w for w in r.workloads() if selects(sel, pod_labels(w))]
        check(matched, f"{name}: Service {s['metadata']['name']} selects no pods")
        for p in s["spec"]["ports"]:
            for w in matched:
                ports = [cp for c in pod_spec(w)["containers"] for cp in c.get("ports", [])]
                tp = p["targetPort"]
                check(any(cp.get("name") == tp or cp["containerPort"] == tp for cp in ports),
                      f"{name}: Service {s['metadata']['name']} port {p['name']} targets {tp}, "
                      f"missing in {w['metadata']['name']}")

    # The decode StatefulSet's governing Service is headless and selects it.
    decode = ws["decode"]
    headless = r.get("Service", decode["spec"]["serviceName"])
    check(headless["spec"].get("clusterIP") == "None", f"{name}: decode Service is headless")
    check(selects(headless["spec"]["selector"], pod_labels(decode)), f"{name}: headless selector")

    # The router's discovery names resolve to the headless Services of decode/prefill pods.
    router = pod_spec(ws["router"])["containers"][0]
    for role in ("decode", "prefill"):
        dns = arg(router, f"--{role}-dns")
        if role not in ws:
            check(dns is None, f"{name}: no --prefill-dns without prefill workers")
            continue
        m = re.fullmatch(r"([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)", dns or "")
        check(m, f"{name}: --{role}-dns={dns!r}")
        svc = r.get("Service", m.group(1))
        check(m.group(2) == NAMESPACE, f"{name}: --{role}-dns namespace {m.group(2)}")
        check(svc["spec"].get("clusterIP") == "None", f"{name}: {svc['metadata']['name']} headless")
        check(selects(svc["spec"]["selector"], pod_labels(ws[role])),
              f"{name}: --{role}-dns Service does not select the {role} pods")
        grpc = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
        check(grpc and grpc[0]["port"] == int(m.group(3)), f"{name}: --{role}-dns port")
        worker = pod_spec(ws[role])["containers"][0]
        check(arg(worker, "--port") == m.group(3), f"{name}: {role} listens on the DNS port")

    for w in r.workloads():
        spec = pod_spec(w)
        wname = w["metadata"]["name"]
        check(spec["securityContext"]["runAsNonRoot"] is True, f"{wname}: runAsNonRoot")
        volumes = {vol["name"]: vol for vol in spec["volumes"]}
        for c in spec["containers"]:
            where = f"{name}: {wname}/{c['name']}"
            check(c["args"][0] == component(w), f"{where}: subcommand {c['args'][0]}")
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            check(arg(c, "--port") == str(ports["grpc"]), f"{where}: --port is the grpc port")
            # Probes: all three, on an existing port.
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                pr = c.get(probe)
                check(pr, f"{where}: {probe} missing")
                if v["tls"]["enabled"]:
                    check(pr["tcpSocket"]["port"] in ports, f"{where}: {probe} port")
                else:
                    check(pr["grpc"]["port"] in ports.values(), f"{where}: {probe} grpc port")
            # Metrics port and flag agree; annotation-based scraping points at it.
            annotations = w["spec"]["template"]["metadata"]["annotations"]
            if v["metrics"]["enabled"]:
                check(arg(c, "--metrics-port") == str(ports["metrics"]), f"{where}: metrics")
                check(annotations["prometheus.io/port"] == str(ports["metrics"]),
                      f"{where}: scrape annotation")
            else:
                check("metrics" not in ports and arg(c, "--metrics-port") is None,
                      f"{where}: metrics disabled")
            # Every $(VAR) in the args is defined by env or the envFrom ConfigMap.
            defined = {e["name"] for e in c.get("env", [])}
            for ef in c.get("envFrom", []):
                cm = configmaps.get(ef["configMapRef"]["name"])
                check(cm is not None, f"{where}: envFrom ConfigMap missing")
                defined |= set(cm["data"])
            for a in c["args"]:
                for var in re.findall(r"\$\((\w+)\)", a):
                    check(var in defined, f"{where}: {a} uses undefined ${var}")
            # Mounts refer to volumes; read-only root needs a writable /tmp.
            for mnt in c["volumeMounts"]:
                check(mnt["name"] in volumes, f"{where}: volumeMount {mnt['name']}")
            check(c["securityContext"]["allowPrivilegeEscalation"] is False, f"{where}: escalation")
            check(any(mnt["mountPath"] == "/tmp" for mnt in c["volumeMounts"]), f"{where}: /tmp")
            model = arg(c, "--model")
            if v["model"]["source"] == "bundled":
                check(model == "/usr/local/share/tandem/models/stories260k", f"{where}: bundled model path")
            else:
                check(model == f"{v['model']['mountPath']}/{v['model']['path']}", f"{where}: --model")
                check(any(mnt["name"] == "model" and model.startswith(mnt["mountPath"])
                          for mnt in c["volumeMounts"]), f"{where}: model mount")
            # GPUs.
            role = component(w)
            gpus = v[role]["gpus"] if role != "router" else 0
            limits = c["resources"].get("limits", {})
            check(limits.get("nvidia.com/gpu", 0) == gpus, f"{where}: {gpus} GPUs")
            # Engine switches of workers.
            if role != "router":
                check(("--mmap-weights" in c["args"]) == v["config"]["mmapWeights"],
                      f"{where}: --mmap-weights")
                check(("--no-prefix-cache" in c["args"]) != v["config"]["prefixCache"],
                      f"{where}: --no-prefix-cache")
            # TLS, API keys and the KV secret: helm_security_test.py.
            if role == "decode":
                check(arg(c, "--kv-port") == str(ports["kv"]), f"{where}: kv port")
                check(arg(c, "--kv-host") == "$(POD_IP)", f"{where}: kv host")
        # Claims.
        if v["model"]["source"] == "pvc":
            claim = volumes["model"]["persistentVolumeClaim"]["claimName"]
            if v["model"]["pvc"]["existingClaim"]:
                check(claim == v["model"]["pvc"]["existingClaim"], f"{wname}: existing claim")
                check(not r.of("PersistentVolumeClaim"), f"{name}: no PVC with existingClaim")
            else:
                r.get("PersistentVolumeClaim", claim)
        # HPA replaces replicas.
        hpas = [h for h in r.of("HorizontalPodAutoscaler")
                if h["spec"]["scaleTargetRef"]["name"] == wname]
        check(len(hpas) == int(v[component(w)]["autoscaling"]["enabled"]), f"{wname}: HPA")
        for h in hpas:
            check(h["spec"]["scaleTargetRef"]["kind"] == w["kind"], f"{wname}: HPA kind")
            check("replicas" not in w["spec"], f"{wname}: replicas set under an HPA")
        if not hpas:
            check(w["spec"]["replicas"] == v[component(w)]["replicas"], f"{wname}: replicas")

    # The same config checksum on every pod.
    sums = {w["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for w in r.workloads()}
    check(len(sums) == 1, f"{name}: config checksums differ")

    for pdb in r.of("PodDisruptionBudget"):
        matched = [w for w in r.workloads()
                   if selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(w))]
        check(len(matched) == 1, f"{name}: PDB {pdb['metadata']['name']} matches {len(matched)}")
    for h in r.of("HorizontalPodAutoscaler"):
        check(any(w["metadata"]["name"] == h["spec"]["scaleTargetRef"]["name"]
                  for w in r.workloads()), f"{name}: HPA target")

    for sm in r.of("ServiceMonitor"):
        sel = sm["spec"]["selector"]["matchLabels"]
        matched = [s for s in services if selects(sel, s["metadata"]["labels"])]
        check({s["metadata"]["labels"]["app.kubernetes.io/component"] for s in matched}
              == set(ws), f"{name}: ServiceMonitor selects every component's Service")
        for ep in sm["spec"]["endpoints"]:  # its TLS: helm_security_test.py
            for s in matched:
                check(any(p["name"] == ep["port"] for p in s["spec"]["ports"]),
                      f"{name}: ServiceMonitor port {ep['port']} on {s['metadata']['name']}")
    check(bool(r.of("ServiceMonitor")) == v["metrics"]["serviceMonitor"]["enabled"],
          f"{name}: ServiceMonitor")

    rules = r.of("PrometheusRule")
    check(len(rules) == int(v["metrics"]["prometheusRule"]["enabled"]), f"{name}: PrometheusRule")
    for pr in rules:
        check(pr["spec"]["groups"] == deploylib.rule_groups(), f"{name}: PrometheusRule groups")

    dashboards = [cm for cm in configmaps.values()
                  if cm["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    if v["grafana"]["dashboards"]["enabled"]:
        files = deploylib.dashboards()
        check(len(dashboards) == len(files), f"{name}: {len(dashboards)} dashboard ConfigMaps")
        for cm in dashboards:
            ((key, text),) = cm["data"].items()
            check(json.loads(text) == files[key], f"{name}: dashboard {key} content")
            check(cm["metadata"]["namespace"] == (v["grafana"]["dashboards"]["namespace"]
                                                  or NAMESPACE), f"{name}: dashboard namespace")
    else:
        check(not dashboards, f"{name}: dashboards disabled")


def check_failures(renderer):
    cases = [
        (["model.source=nfs"], "model.source must be pvc, hostPath or bundled"),
        (["image.flavor=rocm"], "image.flavor must be cuda or cpu"),
        (["prefill.kvTransport=rdma"], "prefill.kvTransport must be auto, tcp, nccl or cuda-ipc"),
        (["prefill.kvTransport=cuda-ipc"], "cuda-ipc needs cudaIpc.hostIPC=true"),
        (["model.source=hostPath", "model.hostPath.path="], "model.hostPath.path is required"),
        (["router.replica=3"], None),  # a typo'd key is merely unused, like Helm
    ]
    for sets, message in cases:
        try:
            render(renderer, sets=sets)
            check(message is None, f"--set {sets} rendered, expected: {message}")
        except RenderError as e:
            check(message is not None and message in str(e), f"--set {sets}: {e}")
    # Strict mode: a template reading a value that does not exist fails (Helm's --strict lint).
    try:
        render(renderer, sets=["router.replicas=null"])
        raise AssertionError("rendering without router.replicas should fail in strict mode")
    except RenderError as e:
        check('no entry for key "replicas"' in str(e), str(e))
    print("ok: bad values fail with clear messages")


def check_validator_catches(docs):
    sts = next(d for d in docs if d["manifest"]["kind"] == "StatefulSet")
    plants = [
        ("unknown field", lambda m: m["spec"]["template"]["spec"]["containers"][0]
         .__setitem__("readinessProbes", {}), "unknown field"),
        ("wrong type", lambda m: m["spec"].__setitem__("replicas", "2"), "must be integer"),
        ("bad quantity", lambda m: m["spec"]["template"]["spec"]["containers"][0]["resources"]
         ["limits"].__setitem__("memory", "lots"), "quantity"),
        ("bad name", lambda m: m["metadata"].__setitem__("name", "Decode_Workers"), "name"),
        ("missing field", lambda m: m["spec"]["template"]["spec"]["containers"][0]
         .pop("name"), "required property"),
    ]
    sets = []
    for _, plant, _ in plants:
        bad = copy.deepcopy(sts)
        plant(bad["manifest"])
        sets.append([bad])
    rc, out = validate_schemas(sets)
    check(rc != 0, "the validator passed planted mistakes")
    for i, (what, _, expect) in enumerate(plants):
        check(any(expect in ln for ln in out[i]), f"validator missed a planted {what}: {out[i]}")
    print(f"ok: the validator catches {len(plants)} planted mistakes")


def main():
    renderer = build_renderer(sys.argv[1])
    cases = [("defaults", []),
             ("values-insecure.yaml", [os.path.join(CHART, "values-insecure.yaml")])] + [
        (f, [os.path.join(VALUES_DIR, f)]) for f in sorted(os.listdir(VALUES_DIR))
        if f.endswith(".yaml")]
    renders = [render(renderer, files) for _, files in cases]
    default_docs = renders[0]
    rc, out = validate_schemas(renders)
    for i, (name, files) in enumerate(cases):
        docs = renders[i]
        check(rc == 0, f"{name}: schema validation failed:\n" + "\n".join(out.get(i, [])
                                                                           + out.get(-1, [])))
        check_wiring(Rendered(docs), load_values(files), name)
        text = render(renderer, files, output="yaml")
        check(text.count("\n---\n") + 1 == len(docs), f"{name}: yaml and json disagree")
        notes = render(renderer, files, notes=True)
        check("prod-tandem-router" in notes or "llm-router" in notes, f"{name}: NOTES")
        print(f"ok: {name}: {len(docs)} manifests valid and wired ({out[i][-1]})")

    # A config change changes the pods' checksum (so they roll).
    a = Rendered(default_docs).workloads()[0]["spec"]["template"]["metadata"]["annotations"]
    b = Rendered(render(renderer, sets=["config.maxNumSeqs=8"])).workloads()[0]
    check(a["checksum/config"] != b["spec"]["template"]["metadata"]["annotations"]
          ["checksum/config"], "config change must change the checksum")
    # cuda-ipc: every worker pod in the host's IPC namespace with the transport; none otherwise.
    ipc = Rendered(render(renderer, sets=["prefill.kvTransport=cuda-ipc", "cudaIpc.hostIPC=true"]))
    workers = [w for w in ipc.workloads() if component(w) in ("prefill", "decode")]
    check(len(workers) == 2 and all(pod_spec(w).get("hostIPC") is True and
                                    arg(pod_spec(w)["containers"][0], "--kv-transport") ==
                                    "cuda-ipc" for w in workers),
          "cuda-ipc: both worker pods run cuda-ipc with hostIPC")
    check(not any(pod_spec(w).get("hostIPC") for w in Rendered(default_docs).workloads()),
          "no pod shares the host's IPC namespace by default")
    check_failures(renderer)
    check_validator_catches(default_docs)
    print("PASS")


if __name__ == "__main__":
    main()
