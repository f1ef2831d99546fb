#!/usr/bin/env node
// Validates rendered Kubernetes manifests against the schemas of the npm package
// `kubernetes-models` (and `@kubernetes-models/prometheus-operator` for ServiceMonitor and
// PrometheusRule, `@kubernetes-models/cert-manager` for Certificate). Besides the schemas' own checks (types, required fields, formats such as
// resource quantities) it rejects fields the schema does not know, which the schemas allow:
// each object is wrapped in a Proxy while the compiled validator runs, and any key of a
// non-map object that the validator never looked at is unknown. It also checks object names
// and label syntax like the API server.
//
// Usage: node validate.js MANIFESTS.json...   (helm-render -output json: [{source, manifest}])
// Prints "FILE: SOURCE: KIND/NAME: problem" per problem and a summary line per file; exits 1 if
// there is any problem.
"use strict";
const fs = require("fs");

const KINDS = {
  "v1/ConfigMap": ["kubernetes-models/v1/ConfigMap", "ConfigMap"],
  "v1/Service": ["kubernetes-models/v1/Service", "Service"],
  "v1/ServiceAccount": ["kubernetes-models/v1/ServiceAccount", "ServiceAccount"],
  "v1/Secret": ["kubernetes-models/v1/Secret", "Secret"],
  "v1/PersistentVolumeClaim": ["kubernetes-models/v1/PersistentVolumeClaim", "PersistentVolumeClaim"],
  "apps/v1/Deployment": ["kubernetes-models/apps/v1/Deployment", "Deployment"],
  "apps/v1/StatefulSet": ["kubernetes-models/apps/v1/StatefulSet", "StatefulSet"],
  "policy/v1/PodDisruptionBudget": ["kubernetes-models/policy/v1/PodDisruptionBudget", "PodDisruptionBudget"],
  "autoscaling/v2/HorizontalPodAutoscaler": [
    "kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler", "HorizontalPodAutoscaler"],
  "networking.k8s.io/v1/NetworkPolicy": [
    "kubernetes-models/networking.k8s.io/v1/NetworkPolicy", "NetworkPolicy"],
  "cert-manager.io/v1/Certificate": [
    "@kubernetes-models/cert-manager/cert-manager.io/v1/Certificate", "Certificate"],
  "monitoring.coreos.com/v1/ServiceMonitor": [
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor", "ServiceMonitor"],
  "monitoring.coreos.com/v1/PrometheusRule": [
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule", "PrometheusRule"],
};

// Wraps `root` so that reads are recorded; unknown() lists keys nobody read.
function track(root) {
  const info = new Map();
  const cache = new WeakMap();
  function wrap(value, path) {
    if (value === null || typeof value !== "object") return value;
    if (cache.has(value)) return cache.get(value);
    const rec = { read: new Set(), enumerated: false, path };
    info.set(value, rec);
    const proxy = new Proxy(value, {
      get(t, k, r) {
        const v = Reflect.get(t, k, r);
        if (typeof k !== "string") return v;
        rec.read.add(k);
        return wrap(v, `${path}/${k}`);
      },
      has(t, k) {
        if (typeof k === "string") rec.read.add(k);
        return Reflect.has(t, k);
      },
      // A validator that enumerates keys treats the object as a map (labels, resources, ...).
      ownKeys(t) {
        rec.enumerated = true;
        return Reflect.ownKeys(t);
      },
      getOwnPropertyDescriptor(t, k) {
        rec.enumerated = true;
        return Reflect.getOwnPropertyDescriptor(t, k);
      },
    });
    cache.set(value, proxy);
    return proxy;
  }
  return {
    wrap,
    unknown() {
      const out = [];
      for (const [target, rec] of info) {
        if (Array.isArray(target) || rec.enumerated) continue;
        for (const k of Object.keys(target)) if (!rec.read.has(k)) out.push(`${rec.path}/${k}`);
      }
      return out;
    },
  };
}

const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const LABEL_NAME = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;

function checkMeta(m, problems) {
  const name = (m.metadata || {}).name || "";
  const labelName = m.kind === "Service" || m.kind === "StatefulSet";  // DNS labels
  if (labelName ? !(DNS1123_LABEL.test(name) && name.length <= 63)
                : !(DNS1123_SUBDOMAIN.test(name) && name.length <= 253)) {
    problems.push(`metadata.name ${JSON.stringify(name)} is not a valid ${m.kind} name`);
  }
  const labelSets = [["metadata.labels", (m.metadata || {}).labels]];
  const tpl = ((m.spec || {}).template || {}).metadata;
  if (tpl) labelSets.push(["spec.template.metadata.labels", tpl.labels]);
  for (const [where, labels] of labelSets) {
    for (const [k, v] of Object.entries(labels || {})) {
      if (!LABEL_NAME.test(k)) problems.push(`${where}: bad label name ${k}`);
      if (typeof v !== "string" || v.length > 63 || !LABEL_VALUE.test(v)) {
        problems.push(`${where}: bad label value ${k}=${JSON.stringify(v)}`);
      }
    }
  }
}

function validate(manifest) {
  const problems = [];
  const key = `${manifest.apiVersion}/${manifest.kind}`;
  const entry = KINDS[key];
  if (!entry) return [`no schema for ${key} (add it to KINDS)`];
  const Model = require(entry[0])[entry[1]];
  const model = new Model(manifest);
  const t = track(model);
  for (const k of Object.keys(model)) model[k] = t.wrap(model[k], "");
  try {
    model.validate();
  } catch (e) {
    problems.push(String(e.message || e));
  }
  for (const path of t.unknown()) problems.push(`unknown field ${path}`);
  for (const k of Object.keys(manifest)) {
    if (!["apiVersion", "kind", "metadata", "spec", "data", "binaryData", "stringData", "type",
          "immutable", "automountServiceAccountToken", "imagePullSecrets", "secrets"].includes(k)) {
      problems.push(`unknown top-level field ${k}`);
    }
  }
  checkMeta(manifest, problems);
  return problems;
}

function main() {
  let bad = 0;
  for (const file of process.argv.slice(2)) {
    const docs = JSON.parse(fs.readFileSync(file, "utf8"));
    const kinds = {};
    let problems = 0;
    for (const { source, manifest } of docs) {
      kinds[manifest.kind] = (kinds[manifest.kind] || 0) + 1;
      for (const p of validate(manifest)) {
        console.log(`${file}: ${source}: ${manifest.kind}/${(manifest.metadata || {}).name}: ${p}`);
        problems++;
      }
    }
    const summary = Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(", ");
    console.log(`${file}: ${problems === 0 ? `valid: ${summary}` : `${problems} problem(s)`}`);
    bad += problems;
  }
  process.exit(bad === 0 ? 0 : 1);
}

main();
