#!/usr/bin/python3
"""Writes Tandem's Grafana dashboards (deploy/grafana/*.json) from the panel lists below.

Run after editing:  deploy/grafana/generate.py   (tests/deploy/dashboards_test.py checks that
the committed JSON equals this script's output). Every dashboard takes a Prometheus data-source
variable `datasource` and a `job` variable (multi-select, "All" = every job exporting
tandem_build_info); every query names only metrics from common/metrics/ or recording rules from
deploy/prometheus/tandem-rules.yaml. Grafana 9.4+ (timeseries, stat, $__rate_interval).
"""
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
J = 'job=~"$job"'
RI = "$__rate_interval"


def target(expr, legend="", ref="A"):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "range": True, "refId": ref}


def timeseries(title, description, unit, *targets, stack=False, min0=True):
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
              "spanNulls": False}
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    defaults = {"unit": unit, "custom": custom}
    if min0:
        defaults["min"] = 0
    return {"type": "timeseries", "title": title, "description": description,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "targets": [dict(t, refId=chr(ord("A") + i)) for i, t in enumerate(targets)],
            "_w": 12, "_h": 8}


def stat(title, description, unit, expr, legend="", thresholds=None):
    steps = [{"color": "green", "value": None}]
    for value, color in thresholds or []:
        steps.append({"color": color, "value": value})
    return {"type": "stat", "title": title, "description": description,
            "fieldConfig": {"defaults": {"unit": unit,
                                         "thresholds": {"mode": "absolute", "steps": steps}},
                            "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "justifyMode": "auto",
                        "orientation": "auto", "textMode": "auto"},
            "targets": [target(expr, legend)], "_w": 6, "_h": 4}


def row(title):
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_w": 24, "_h": 1}


def quantiles(record):
    """The recorded p50/p90/p99 of a router histogram, one series per quantile."""
    return target(f"max by (quantile) ({record}{{{J}}})", "p{{quantile}}")


def layout(panels):
    x = y = 0
    row_h = 0
    out = []
    for i, p in enumerate(panels, start=1):
        w, h = p.pop("_w"), p.pop("_h")
        if p["type"] == "row" or x + w > 24:
            if x > 0:
                y += row_h
            x, row_h = 0, 0
        p = dict(p, id=i, gridPos={"h": h, "w": w, "x": x, "y": y})
        if p["type"] != "row":
            p["datasource"] = DS
        out.append(p)
        x += w
        row_h = max(row_h, h)
        if p["type"] == "row":
            y += h
            x, row_h = 0, 0
    return out


def dashboard(uid, title, description, panels):
    return {
        "title": title, "uid": uid, "description": description,
        "tags": ["tandem", "llm-serving"], "timezone": "browser", "editable": True,
        "graphTooltip": 1, "refresh": "30s", "schemaVersion": 39, "version": 1,
        "time": {"from": "now-1h", "to": "now"}, "fiscalYearStartMonth": 0, "liveNow": False,
        "links": [{"title": "Tandem dashboards", "type": "dashboards", "tags": ["tandem"],
                   "asDropdown": True, "includeVars": True, "keepTime": True}],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "includeAll": False,
             "multi": False, "options": [], "refresh": 1, "regex": "", "skipUrlSync": False},
            {"name": "job", "label": "Job", "type": "query", "datasource": DS,
             "definition": "label_values(tandem_build_info, job)",
             "query": {"query": "label_values(tandem_build_info, job)", "refId": "job"},
             "includeAll": True, "allValue": ".+", "multi": True,
             "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
             "hide": 0, "options": [], "refresh": 2, "regex": "", "skipUrlSync": False,
             "sort": 1},
        ]},
        "panels": layout(panels),
    }


OVERVIEW = dashboard("tandem-overview", "Tandem / Cluster overview",
                     "Requests, latency percentiles, throughput and errors of a Tandem cluster.", [
    row("Traffic"),
    stat("Request rate", "Finished client requests per second (5m).", "reqps",
         f"sum(job:tandem_router_requests:rate5m{{{J}}})"),
    stat("Error ratio", "Requests ending in an internal error or deadline (5m).", "percentunit",
         f"max(job:tandem_router_request_errors:ratio_rate5m{{{J}}})",
         thresholds=[(0.01, "orange"), (0.05, "red")]),
    stat("Requests in flight", "Client streams open at the routers.", "short",
         f"sum(tandem_router_requests_in_flight{{{J}}})"),
    stat("Generated tokens/s", "Tokens generated per second, all engines (5m).", "short",
         f"sum(job:tandem_engine_generation_tokens:rate5m{{{J}}})"),
    timeseries("Requests by outcome", "Finished client requests per second by outcome.", "reqps",
               target(f"sum by (outcome) (rate(tandem_router_requests_total{{{J}}}[{RI}]))",
                      "{{outcome}}"), stack=True),
    timeseries("Finish reasons", "Successful requests per second by the reason they ended.",
               "reqps",
               target(f'sum by (finish_reason) (rate(tandem_router_requests_total{{{J}, '
                      f'outcome="ok"}}[{RI}]))', "{{finish_reason}}"), stack=True),
    timeseries("Errors", "Failed requests per second by outcome (everything but ok).", "reqps",
               target(f'sum by (outcome) (rate(tandem_router_requests_total{{{J}, '
                      f'outcome!="ok"}}[{RI}]))', "{{outcome}}"), stack=True),
    timeseries("Error and rejection ratio", "Share of finished requests that failed (error, "
               "timeout) or were refused (capacity, draining), 5m.", "percentunit",
               target(f"max(job:tandem_router_request_errors:ratio_rate5m{{{J}}})", "errors"),
               target(f"max(job:tandem_router_request_rejections:ratio_rate5m{{{J}}})",
                      "rejections")),
    row("Latency (measured at the router)"),
    timeseries("Time to first token", "p50/p90/p99 from arrival at the router to the first "
               "token (5m).", "s",
               quantiles("job_quantile:tandem_router_time_to_first_token_seconds:"
                         "histogram_quantile_5m")),
    timeseries("Inter-token latency", "p50/p90/p99 time between consecutive tokens of a sample "
               "(5m).", "s",
               quantiles("job_quantile:tandem_router_inter_token_latency_seconds:"
                         "histogram_quantile_5m")),
    timeseries("End-to-end latency", "p50/p90/p99 from arrival to the end of the request (5m).",
               "s",
               quantiles("job_quantile:tandem_router_e2e_request_latency_seconds:"
                         "histogram_quantile_5m")),
    timeseries("Time to first token split", "p99 of the engine-side parts of TTFT by role: "
               "queueing and prefill (5m).", "s",
               target(f"max by (role) (job_role_quantile:tandem_engine_queue_time_seconds:"
                      f"histogram_quantile_5m{{{J}}})", "queue {{role}}"),
               target(f"max by (role) (job_role_quantile:tandem_engine_prefill_time_seconds:"
                      f"histogram_quantile_5m{{{J}}})", "prefill {{role}}")),
    row("Throughput"),
    timeseries("Tokens per second", "Prompt tokens admitted and tokens generated per second.",
               "short",
               target(f"sum(rate(tandem_engine_prompt_tokens_total{{{J}}}[{RI}]))", "prompt"),
               target(f"sum(rate(tandem_engine_generation_tokens_total{{{J}}}[{RI}]))",
                      "generated")),
    timeseries("Running and waiting sequences", "Sequences in the engines' batches and queues, "
               "by role.", "short",
               target(f"sum by (role) (tandem_engine_requests_running{{{J}}})",
                      "running {{role}}"),
               target(f"sum by (role) (tandem_engine_requests_waiting{{{J}}})",
                      "waiting {{role}}")),
    timeseries("Request sizes", "Median prompt and generated tokens per request.", "short",
               target(f"histogram_quantile(0.5, sum by (le) (rate("
                      f"tandem_router_request_prompt_tokens_bucket{{{J}}}[{RI}])))",
                      "prompt p50"),
               target(f"histogram_quantile(0.5, sum by (le) (rate("
                      f"tandem_router_request_generation_tokens_bucket{{{J}}}[{RI}])))",
                      "generated p50")),
    timeseries("Engine step time", "p50/p99 wall time of one engine iteration, by role.", "s",
               target(f"histogram_quantile(0.5, sum by (role, le) (rate("
                      f"tandem_engine_step_duration_seconds_bucket{{{J}}}[{RI}])))",
                      "p50 {{role}}"),
               target(f"histogram_quantile(0.99, sum by (role, le) (rate("
                      f"tandem_engine_step_duration_seconds_bucket{{{J}}}[{RI}])))",
                      "p99 {{role}}")),
    timeseries("Scrape targets up", "Tandem processes Prometheus can scrape, by job.", "short",
               target(f"sum by (job) (up{{{J}}})", "{{job}}")),
    row("HTTP API"),
    timeseries("HTTP connections", "Open connections of the OpenAI-compatible HTTP API, by "
               "instance.", "short",
               target(f"sum by (instance) (tandem_http_connections_open{{{J}}})",
                      "{{instance}}")),
    timeseries("HTTP refusals and timeouts", "Connections or requests the HTTP API turned "
               "away by reason, and connections it closed for a time or space limit by kind "
               "(per second).", "short",
               target(f"sum by (reason) (rate(tandem_http_rejected_total{{{J}}}[{RI}]))",
                      "rejected {{reason}}"),
               target(f"sum by (kind) (rate(tandem_http_timeouts_total{{{J}}}[{RI}]))",
                      "timeout {{kind}}")),
    row("LoRA adapters"),
    timeseries("LoRA adapters", "Adapters loaded, adapters with admitted requests (at most "
               "--max-loras) and requests waiting for an adapter slot, by instance.", "short",
               target(f"sum by (instance, state) (tandem_lora_adapters{{{J}}})",
                      "{{instance}} {{state}}")),
    timeseries("Tokens per adapter", "Generated tokens per second by LoRA adapter (the first 64 "
               "adapter names; the rest as other).", "short",
               target(f"sum by (lora_adapter) "
                      f"(rate(tandem_lora_generation_tokens_total{{{J}}}[{RI}]))",
                      "{{lora_adapter}}"), stack=True),
    timeseries("Requests per adapter", "Sequences finished per second by LoRA adapter.", "short",
               target(f"sum by (lora_adapter) "
                      f"(rate(tandem_lora_sequences_finished_total{{{J}}}[{RI}]))",
                      "{{lora_adapter}}"), stack=True),
    timeseries("Latency per adapter (p90)", "90th percentile of arrival to finish at the "
               "engine, by LoRA adapter.", "s",
               target(f"histogram_quantile(0.9, sum by (lora_adapter, le) "
                      f"(rate(tandem_lora_e2e_seconds_bucket{{{J}}}[{RI}])))",
                      "{{lora_adapter}}")),
])

KV = dashboard("tandem-kv-cache", "Tandem / KV cache",
               "Paged KV cache usage, prefix cache hit rate, evictions and preemptions, and the "
               "tiers below the pool (host memory, local disk).", [
    row("Usage"),
    stat("KV usage (max)", "Highest share of KV blocks referenced by sequences on any engine.",
         "percentunit", f"max(instance:tandem_engine_kv_usage:ratio{{{J}}})",
         thresholds=[(0.8, "orange"), (0.95, "red")]),
    stat("Prefix cache hit rate", "Prompt tokens found in the prefix cache among those looked "
         "up (5m).", "percentunit",
         f"max(job:tandem_engine_prefix_cache_hits:ratio_rate5m{{{J}}})"),
    stat("Preemptions/s", "Sequences preempted for lack of KV blocks, all engines.", "short",
         f"sum(rate(tandem_engine_preemptions_total{{{J}}}[{RI}]))",
         thresholds=[(0.1, "orange"), (1, "red")]),
    stat("Evictions/s", "Prefix-cache blocks evicted, all engines.", "short",
         f"sum(rate(tandem_engine_kv_evictions_total{{{J}}}[{RI}]))"),
    timeseries("KV usage per engine", "Share of each engine's KV blocks referenced by "
               "sequences.", "percentunit",
               target(f"instance:tandem_engine_kv_usage:ratio{{{J}}}", "{{instance}} {{role}}")),
    timeseries("KV blocks", "Blocks referenced, holding prefix-cache entries, and in the pool, "
               "by role.", "short",
               target(f"sum by (role) (tandem_engine_kv_blocks_used{{{J}}})", "used {{role}}"),
               target(f"sum by (role) (tandem_engine_kv_blocks_cached{{{J}}})",
                      "cached {{role}}"),
               target(f"sum by (role) (tandem_engine_kv_blocks_capacity{{{J}}})",
                      "capacity {{role}}")),
    row("Prefix cache"),
    timeseries("Prefix cache hit rate", "Prompt tokens found in the prefix cache among those "
               "looked up (5m).", "percentunit",
               target(f"job:tandem_engine_prefix_cache_hits:ratio_rate5m{{{J}}}", "{{job}}")),
    timeseries("Prefix cache tokens", "Prompt tokens looked up, found, and served from cache "
               "per second.", "short",
               target(f"sum(rate(tandem_engine_prefix_cache_queries_total{{{J}}}[{RI}]))",
                      "queried"),
               target(f"sum(rate(tandem_engine_prefix_cache_hits_total{{{J}}}[{RI}]))", "hit"),
               target(f"sum(rate(tandem_engine_prompt_tokens_cached_total{{{J}}}[{RI}]))",
                      "served from cache")),
    row("Pressure"),
    timeseries("Preemptions and evictions", "Sequences preempted and prefix-cache blocks "
               "evicted per second, by role.", "short",
               target(f"sum by (role) (rate(tandem_engine_preemptions_total{{{J}}}[{RI}]))",
                      "preemptions {{role}}"),
               target(f"sum by (role) (rate(tandem_engine_kv_evictions_total{{{J}}}[{RI}]))",
                      "evictions {{role}}")),
    timeseries("Queue time", "p50/p99 time from arrival at the engine to first being "
               "scheduled, by role.", "s",
               target(f"histogram_quantile(0.5, sum by (role, le) (rate("
                      f"tandem_engine_queue_time_seconds_bucket{{{J}}}[{RI}])))", "p50 {{role}}"),
               target(f"histogram_quantile(0.99, sum by (role, le) (rate("
                      f"tandem_engine_queue_time_seconds_bucket{{{J}}}[{RI}])))",
                      "p99 {{role}}")),
    timeseries("Waiting sequences", "Sequences queued for KV blocks or a batch slot, per "
               "engine.", "short",
               target(f"sum by (instance, role) (tandem_engine_requests_waiting{{{J}}})",
                      "{{instance}} {{role}}")),
    timeseries("Sequences finished by reason", "Engine-side ends of sequences per second.",
               "short",
               target(f"sum by (finish_reason) (rate("
                      f"tandem_engine_sequences_finished_total{{{J}}}[{RI}]))",
                      "{{finish_reason}}"), stack=True),
    row("Tiers below the pool (host memory, local disk)"),
    stat("Tier hit rate", "Blocks loads found in a tier (host or disk) among those looked up "
         "(5m); a request stops looking at its first miss.", "percentunit",
         f"sum(rate(tandem_kv_tier_hits_total{{{J}}}[5m])) / clamp_min(sum(rate("
         f"tandem_kv_tier_hits_total{{{J}}}[5m])) + sum(rate("
         f"tandem_kv_tier_misses_total{{{J}}}[5m])), 1e-9)"),
    stat("Blocks loaded/s", "KV blocks loaded back from the tiers into pools instead of "
         "recomputed, all engines.", "short",
         f"sum(rate(tandem_kv_tier_loaded_blocks_total{{{J}}}[{RI}]))"),
    stat("Write-behind drops/s", "Evicted blocks not written to disk because the write-behind "
         "queue was full (raise --kv-offload-queue or --kv-offload-write-bandwidth).", "short",
         f"sum(rate(tandem_kv_tier_write_drops_total{{{J}}}[{RI}]))",
         thresholds=[(1, "orange"), (100, "red")]),
    stat("Tiers turned off", "Tiers that turned themselves off (disk full, read-only, refused "
         "writes; the worker's log has the reason) on some engine.", "short",
         f"sum(max by (instance, role, tier) (tandem_kv_tier_capacity_bytes{{{J}}} > bool 0)"
         f" * on (instance, role, tier) (1 - max by (instance, role, tier) ("
         f"tandem_kv_tier_enabled{{{J}}})))",
         thresholds=[(1, "red")]),
    timeseries("Tier usage", "Bytes each tier holds against its capacity, all engines.",
               "percentunit",
               target(f"sum by (tier) (tandem_kv_tier_usage_bytes{{{J}}}) / clamp_min(sum by "
                      f"(tier) (tandem_kv_tier_capacity_bytes{{{J}}}), 1)", "{{tier}}")),
    timeseries("Tier hits and misses", "Blocks loads found and did not find (or found "
               "corrupt) per second, by tier.", "short",
               target(f"sum by (tier) (rate(tandem_kv_tier_hits_total{{{J}}}[{RI}]))",
                      "hits {{tier}}"),
               target(f"sum by (tier) (rate(tandem_kv_tier_misses_total{{{J}}}[{RI}]))",
                      "misses {{tier}}"),
               target(f"sum by (tier) (rate(tandem_kv_tier_corrupt_blocks_total{{{J}}}[{RI}]))",
                      "corrupt {{tier}}")),
    timeseries("Tier bytes in and out", "Bytes written into and read from each tier per "
               "second.", "Bps",
               target(f"sum by (tier) (rate(tandem_kv_tier_written_bytes_total{{{J}}}[{RI}]))",
                      "in {{tier}}"),
               target(f"sum by (tier) (rate(tandem_kv_tier_read_bytes_total{{{J}}}[{RI}]))",
                      "out {{tier}}")),
    timeseries("Tier load latency", "p50/p99 time from a request's load being queued to its "
               "blocks being ready, by role.", "s",
               target(f"histogram_quantile(0.5, sum by (role, le) (rate("
                      f"tandem_kv_tier_load_duration_seconds_bucket{{{J}}}[{RI}])))",
                      "p50 {{role}}"),
               target(f"histogram_quantile(0.99, sum by (role, le) (rate("
                      f"tandem_kv_tier_load_duration_seconds_bucket{{{J}}}[{RI}])))",
                      "p99 {{role}}")),
    timeseries("Write-behind queue", "Bytes queued for the disk tier, per engine.", "bytes",
               target(f"sum by (instance, role) (tandem_kv_tier_write_queue_bytes{{{J}}})",
                      "{{instance}} {{role}}")),
    timeseries("Requests waiting for loads", "Requests held while their blocks load from the "
               "tiers, and loaded blocks pinned until their request is admitted, per engine.",
               "short",
               target(f"sum by (instance, role) (tandem_kv_tier_loads_in_flight{{{J}}})",
                      "loading {{instance}} {{role}}"),
               target(f"sum by (instance, role) (tandem_kv_tier_pinned_blocks{{{J}}})",
                      "pinned blocks {{instance}} {{role}}")),
])

DISAGG = dashboard("tandem-disaggregation", "Tandem / Disaggregation",
                   "Prefill-to-decode KV transfers, queue depths per role, routing decisions "
                   "and worker health.", [
    row("KV transfer"),
    timeseries("KV transfer latency", "p50/p99 time to move one request's KV, by transport "
               "(5m).", "s",
               target(f"max by (transport, quantile) (job_transport_quantile:"
                      f"tandem_kv_transfer_duration_seconds:histogram_quantile_5m{{{J}}})",
                      "{{transport}} p{{quantile}}")),
    timeseries("KV transfer throughput", "Bytes of KV moved per second, by transport and "
               "direction.", "Bps",
               target(f"sum by (transport, direction) (rate("
                      f"tandem_kv_transfer_size_bytes_sum{{{J}}}[{RI}]))",
                      "{{transport}} {{direction}}")),
    timeseries("Bytes per transfer", "p50/p99 KV bytes moved per request.", "bytes",
               target(f"histogram_quantile(0.5, sum by (transport, le) (rate("
                      f"tandem_kv_transfer_size_bytes_bucket{{{J}}}[{RI}])))",
                      "{{transport}} p50"),
               target(f"histogram_quantile(0.99, sum by (transport, le) (rate("
                      f"tandem_kv_transfer_size_bytes_bucket{{{J}}}[{RI}])))",
                      "{{transport}} p99")),
    timeseries("Transfers and failures", "Transfers finished, in flight, and failed per "
               "second by reason.", "short",
               target(f"sum by (direction) (rate("
                      f"tandem_kv_transfer_duration_seconds_count{{{J}}}[{RI}]))",
                      "done/s {{direction}}"),
               target(f"sum by (direction) (tandem_kv_transfers_in_flight{{{J}}})",
                      "in flight {{direction}}"),
               target(f"sum by (reason) (rate(tandem_kv_transfer_failures_total{{{J}}}[{RI}]))",
                      "failed/s {{reason}}")),
    row("Queues per role"),
    timeseries("Waiting sequences per role", "Sequences queued in prefill, decode (and "
               "monolithic) engines.", "short",
               target(f"sum by (role) (tandem_engine_requests_waiting{{{J}}})", "{{role}}")),
    timeseries("Running sequences per role", "Sequences in the engines' batches.", "short",
               target(f"sum by (role) (tandem_engine_requests_running{{{J}}})", "{{role}}")),
    timeseries("Prefill and queue time per role", "p99 queue and prefill time by role (5m).",
               "s",
               target(f"max by (role) (job_role_quantile:tandem_engine_queue_time_seconds:"
                      f"histogram_quantile_5m{{{J}}})", "queue {{role}}"),
               target(f"max by (role) (job_role_quantile:tandem_engine_prefill_time_seconds:"
                      f"histogram_quantile_5m{{{J}}})", "prefill {{role}}")),
    timeseries("Worker streams", "Worker API streams open, by role.", "short",
               target(f"sum by (role) (tandem_worker_streams_active{{{J}}})", "{{role}}")),
    row("Routing"),
    timeseries("Routing decisions", "Placements per second by policy and the reason the "
               "chosen worker won.", "short",
               target(f"sum by (policy, reason) (rate("
                      f"tandem_router_routing_decisions_total{{{J}}}[{RI}]))",
                      "{{policy}}: {{reason}}"), stack=True),
    timeseries("Retries and migrations", "Requests re-sent after a worker failure (by role of "
               "the failed worker) and streams migrated between decode workers, per second.",
               "short",
               target(f"sum by (role) (rate(tandem_router_retries_total{{{J}}}[{RI}]))",
                      "retries {{role}}"),
               target(f"sum(rate(tandem_router_migrations_total{{{J}}}[{RI}]))",
                      "migrations")),
    timeseries("Healthy workers per role", "Workers the routers consider healthy.", "short",
               target(f"sum by (role) (tandem_router_worker_healthy{{{J}}})", "{{role}}")),
    timeseries("Unhealthy workers", "Workers a router marks unhealthy (1 = unhealthy).",
               "short",
               target(f"max by (worker, role) (1 - tandem_router_worker_healthy{{{J}}})",
                      "{{role}} {{worker}}")),
])

SPEC = dashboard("tandem-speculative", "Tandem / Speculative decoding",
                 "Acceptance rate and length of speculative proposals, by proposer.", [
    stat("Acceptance rate", "Proposed tokens the target accepted (5m).", "percentunit",
         f"max(job_proposer:tandem_spec_acceptance:ratio_rate5m{{{J}}})"),
    stat("Mean acceptance length", "Tokens accepted per verification (5m); each verification "
         "adds one token of the target's own.", "short",
         f"max(job_proposer:tandem_spec_acceptance_length:mean_rate5m{{{J}}})"),
    timeseries("Acceptance rate", "Proposed tokens the target accepted, by proposer (5m).",
               "percentunit",
               target(f"job_proposer:tandem_spec_acceptance:ratio_rate5m{{{J}}}",
                      "{{proposer}} {{job}}")),
    timeseries("Mean acceptance length", "Tokens accepted per verification, by proposer (5m).",
               "short",
               target(f"job_proposer:tandem_spec_acceptance_length:mean_rate5m{{{J}}}",
                      "{{proposer}} {{job}}")),
    timeseries("Drafted and accepted tokens", "Speculative tokens proposed and accepted per "
               "second.", "short",
               target(f"sum by (proposer) (rate(tandem_spec_draft_tokens_total{{{J}}}[{RI}]))",
                      "drafted {{proposer}}"),
               target(f"sum by (proposer) (rate(tandem_spec_accepted_tokens_total{{{J}}}[{RI}]))",
                      "accepted {{proposer}}")),
    timeseries("Acceptance length distribution", "p50/p90 tokens accepted per verification.",
               "short",
               target(f"histogram_quantile(0.5, sum by (proposer, le) (rate("
                      f"tandem_spec_acceptance_length_bucket{{{J}}}[{RI}])))",
                      "p50 {{proposer}}"),
               target(f"histogram_quantile(0.9, sum by (proposer, le) (rate("
                      f"tandem_spec_acceptance_length_bucket{{{J}}}[{RI}])))",
                      "p90 {{proposer}}")),
])

DASHBOARDS = {"tandem-overview.json": OVERVIEW, "tandem-kv-cache.json": KV,
              "tandem-disaggregation.json": DISAGG, "tandem-speculative.json": SPEC}


def render():
    return {name: json.dumps(d, indent=2, sort_keys=True) + "\n" for name, d in DASHBOARDS.items()}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, text in render().items():
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(text)
        print(f"wrote {os.path.join(out_dir, name)}")


if __name__ == "__main__":
    main()
