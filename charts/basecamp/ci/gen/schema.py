"""Writes charts/basecamp/values.schema.json (or the file named as the first
argument). Edit this, not the JSON: scripts/chart-lint.sh fails when the
committed schema differs from what this writes."""
import json
import os
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "values.schema.json")
def obj(props, required=None, desc=None, addl=False):
    d = {"type": "object", "additionalProperties": addl, "properties": props}
    if required: d["required"] = required
    if desc: d["description"] = desc
    return d
def s(desc=None, **kw):
    d = {"type": "string", **kw}
    if desc: d["description"] = desc
    return d
def b(desc=None):
    d = {"type": "boolean"}
    if desc: d["description"] = desc
    return d
def i(desc=None, **kw):
    d = {"type": "integer", **kw}
    if desc: d["description"] = desc
    return d
def arr(items=None, desc=None, **kw):
    d = {"type": "array", **kw}
    if items is not None: d["items"] = items
    if desc: d["description"] = desc
    return d
strmap = {"type": "object", "additionalProperties": {"type": "string"}}
# Kubernetes' int32 fields, and the operator's i32 flags: a larger value
# passes Helm and is refused later, by the API server or by the operator at
# start (a crash loop).
INT32_MAX = 2147483647
anyobj = {"type": "object"}
k8s_name = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
duration = {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$",
            "description": "a Prometheus duration such as 30s, 5m or 1h30m"}
severity = {"type": "string", "enum": ["critical", "warning", "info", "none"]}
probe = obj({
    "enabled": b("Whether the probe is set"),
    "initialDelaySeconds": i(minimum=0, maximum=INT32_MAX), "periodSeconds": i(minimum=1, maximum=INT32_MAX),
    "timeoutSeconds": i(minimum=1, maximum=INT32_MAX), "failureThreshold": i(minimum=1, maximum=INT32_MAX)})
image_ref = lambda desc: obj({
    "repository": s(desc, pattern="^$|^[a-z0-9]+([._/:-][a-z0-9]+)*$"),
    # A string only: YAML reads `tag: 1.10` as the number 1.1 and `tag:
    # 20240101` as one Helm prints 2.0240101e+07, so a number would render
    # another image's tag. Quoted ("1.10") it is kept as written.
    "tag": s('Image tag, quoted when it looks like a number ("1.10"); empty: the default',
             pattern="^$|^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"),
    "digest": s("Image digest, wins over the tag", pattern="^$|^sha256:[a-f0-9]{64}$")})
op_image = image_ref("Image repository, e.g. ghcr.io/org/basecamp")
op_image["properties"]["repository"]["minLength"] = 1
op_image["properties"]["repository"]["pattern"] = "^[a-z0-9]+([._/:-][a-z0-9]+)*$"
op_image["properties"]["pullPolicy"] = s("Image pull policy", enum=["Always", "IfNotPresent", "Never"])
op_image["required"] = ["repository", "pullPolicy"]

def alert(extra=None):
    p = {"for": duration, "severity": severity}
    p.update(extra or {})
    return obj(p, required=["for", "severity"])

monitor_common = {
    "enabled": b(), "namespace": s("Namespace of the object; empty: the release namespace"),
    "labels": strmap, "annotations": strmap, "interval": duration, "scrapeTimeout": duration,
    "relabelings": arr(anyobj), "metricRelabelings": arr(anyobj)}
label_key = {"type": "string", "pattern": "^$|^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"}
# IPv4 and IPv6 addresses as Rust's and Go's parsers take them (no leading
# zeros, no zone).
_octet = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_ipv4 = f"({_octet}\\.){{3}}{_octet}"
_h = "[0-9A-Fa-f]{1,4}"
_ipv6 = "|".join([f"({_h}:){{7}}{_h}", f"({_h}:){{1,7}}:", f"({_h}:){{1,6}}:{_h}",
                  f"({_h}:){{1,5}}(:{_h}){{1,2}}", f"({_h}:){{1,4}}(:{_h}){{1,3}}",
                  f"({_h}:){{1,3}}(:{_h}){{1,4}}", f"({_h}:){{1,2}}(:{_h}){{1,5}}",
                  f"{_h}:(:{_h}){{1,6}}", f":((:{_h}){{1,7}}|:)", f"::([Ff]{{4}}(:0{{1,4}})?:)?{_ipv4}",
                  f"({_h}:){{1,4}}:{_ipv4}", f"({_h}:){{6}}{_ipv4}"])
# What the operator's CIDR check takes: an address, a slash, and a prefix
# length that fits it.
cidr = s("An IPv4 or IPv6 CIDR such as 10.0.0.0/8 or fd00::/8",
         pattern=f"^({_ipv4}/(3[0-2]|[12]?[0-9])|({_ipv6})/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))$")
# A LabelSelectorRequirement: In/NotIn need values, Exists/DoesNotExist take
# none (the API server's rule, checked on each task's NetworkPolicy).
requirement = obj({"key": s(minLength=1), "operator": s(enum=["In", "NotIn", "Exists", "DoesNotExist"]),
                   "values": arr({"type": "string"})}, required=["key", "operator"])
requirement["allOf"] = [
    {"if": {"properties": {"operator": {"enum": ["In", "NotIn"]}}},
     "then": {"required": ["values"], "properties": {"values": {"minItems": 1}}}},
    {"if": {"properties": {"operator": {"enum": ["Exists", "DoesNotExist"]}}},
     "then": {"properties": {"values": {"maxItems": 0}}}}]
selector = obj({"matchLabels": strmap, "matchExpressions": arr(requirement)})
# A NetworkPolicyPeer the operator passes on (--sandbox-metrics-from): the
# operator refuses unknown fields and empty peers at start-up, so refuse them
# here already, at helm install, rather than in a crash-looping operator.
# ipBlock excludes the selectors (the API server refuses the mix): a peer is
# either an ipBlock alone or one or both selectors. `false` makes the error
# name the selector that is too many.
peer = obj({"podSelector": selector, "namespaceSelector": selector,
            "ipBlock": obj({"cidr": cidr, "except": arr(cidr)}, required=["cidr"])})
peer["minProperties"] = 1
peer["if"] = {"required": ["ipBlock"]}
peer["then"] = {"description": "ipBlock cannot be combined with podSelector or namespaceSelector: make them two peers",
                "properties": {"podSelector": False, "namespaceSelector": False}}

schema = {
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "Values of the Basecamp Helm chart",
  "type": "object",
  "additionalProperties": False,
  "properties": {
    "global": {"type": "object", "description": "Set by a parent chart"},
    "nameOverride": s(maxLength=63),
    "fullnameOverride": s(maxLength=63),
    "commonLabels": strmap,
    "image": op_image,
    "imagePullSecrets": arr(obj({"name": s(minLength=1)}, required=["name"])),
    "operator": obj({
      "replicas": i("Operator pods; more than 1 needs leaderElection.enabled", minimum=0, maximum=INT32_MAX),
      "logLevel": s("RUST_LOG filter, e.g. info or info,basecamp_operator=debug", minLength=1,
                    pattern="^[A-Za-z0-9_:=,.\\[\\]{}\"-]+$"),
      "logFormat": s("Log line format", enum=["json", "text"]),
      "metricsPort": i(minimum=1, maximum=65535),
      "metricsBindAddress": s("Address of /metrics, /healthz and /readyz (--metrics-addr): 0.0.0.0, or :: "
                              "on an IPv6-only cluster", pattern=f"^({_ipv4}|{_ipv6})$"),
      "extraArgs": arr({"type": "string"}),
      "extraEnv": arr(obj({"name": s(minLength=1)}, required=["name"], addl=True)),
      "extraEnvFrom": arr(anyobj),
      "extraVolumes": arr(obj({"name": s(minLength=1)}, required=["name"], addl=True)),
      "extraVolumeMounts": arr(obj({"name": s(minLength=1), "mountPath": s(minLength=1)},
                                   required=["name", "mountPath"], addl=True)),
      "resources": obj({"requests": anyobj, "limits": anyobj, "claims": arr(anyobj)}),
      "livenessProbe": probe, "readinessProbe": probe,
      "podSecurityContext": anyobj, "securityContext": anyobj,
      "priorityClassName": s(),
      "nodeSelector": strmap,
      "tolerations": arr(anyobj),
      "affinity": anyobj,
      "topologySpreadConstraints": arr(anyobj),
      "podAnnotations": strmap, "podLabels": strmap, "annotations": strmap,
      "terminationGracePeriodSeconds": i(minimum=0),
      "revisionHistoryLimit": i(minimum=0, maximum=INT32_MAX),
      "strategy": obj({"type": s(enum=["RollingUpdate", "Recreate"]), "rollingUpdate": anyobj}),
      "podDisruptionBudget": obj({"enabled": b(), "minAvailable": {"type": ["integer", "string"]}}),
    }, required=["replicas", "logLevel", "logFormat", "metricsPort", "metricsBindAddress"]),
    "networkPolicy": obj({"enabled": b("A NetworkPolicy for the operator pods"),
                          "metricsFrom": arr(anyobj, "NetworkPolicyPeers allowed to scrape; empty: any"),
                          "egress": arr(anyobj, "NetworkPolicyEgressRules; empty: all egress")}),
    "leaderElection": obj({"enabled": b("Pass --leader-elect (a Lease in the release namespace)")}),
    "watchNamespaces": arr(k8s_name, "Namespaces to watch; empty: all", uniqueItems=True),
    "sandbox": obj({"image": image_ref("Sandbox image repository; empty: image.repository"),
                    "s3Secret": {"type": "string", "pattern": "^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                                 "description": "Secret in each task namespace with the pods' S3 credentials"},
                    "jobTtlSeconds": i("ttlSecondsAfterFinished of sandbox Jobs (--job-ttl-seconds, an i32)",
                                       minimum=0, maximum=INT32_MAX),
                    "shardRetries": i("backoffLimitPerIndex of sandbox Jobs", minimum=0, maximum=100)},
                   required=["jobTtlSeconds", "shardRetries"]),
    "s3": obj({
      "endpoint": s("S3 endpoint URL (AWS_ENDPOINT_URL_S3); empty: AWS S3", pattern="^$|^https?://[^\\s]+$"),
      "region": s("AWS_REGION", pattern="^$|^[a-z0-9-]+$"),
      "credentials": obj({
        "existingSecret": {"type": "string", "pattern": "^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                           "description": "Existing Secret with the access key pair; empty: the SDK's default chain"},
        "accessKeyIdKey": s(minLength=1), "secretAccessKeyKey": s(minLength=1)}),
    }),
    "serviceAccount": obj({"create": b(), "name": s(), "annotations": strmap,
                           "automountServiceAccountToken": b()}),
    "rbac": obj({"create": b(), "aggregateToDefaultRoles": b()}),
    "metrics": obj({
      "service": obj({"enabled": b(), "type": s(enum=["ClusterIP", "NodePort", "LoadBalancer"]),
                      "port": i(minimum=1, maximum=65535), "annotations": strmap, "labels": strmap}),
      "serviceMonitor": obj(dict(monitor_common, honorLabels=b())),
      "sandboxPodMonitor": obj(dict(monitor_common, taskLabel=label_key, variantLabel=label_key,
                                    shardLabel=label_key,
                                    metricsLinger=s("How long a sandbox pod waits for a first scrape before its "
                                                    "episodes and for a scrape of its final counts after "
                                                    "them (--sandbox-metrics-linger), e.g. 30s",
                                                    pattern="^([0-9]+(ms|s|m|h))+$"),
                                    scrapeFrom=arr(peer, "NetworkPolicyPeers that may reach the sandbox pods' "
                                                   "metrics port (--sandbox-metrics-from), injection included; "
                                                   "empty: none"))),
    }),
    "prometheusRule": obj({
      "enabled": b(), "namespace": s(), "labels": strmap, "annotations": strmap,
      "additionalRuleLabels": strmap,
      "disabled": obj({a: b() for a in ["BasecampOperatorDown", "BasecampReconcileErrors",
                     "BasecampReconcileSlow", "BasecampTaskCriteriaNotMet", "BasecampShardsFailing",
                     "BasecampEpisodesNotMeasured", "BasecampS3Errors", "BasecampSandboxToolTimeouts",
                     "BasecampSandboxWaitingForPolicy"]}, desc="Alerts to leave out, by name"),
      "operatorJob": s("The operator's scrape job; empty: the metrics Service name"),
      "runbookBaseUrl": s(pattern="^$|^https?://[^\\s]+$"),
      "operatorDown": alert(),
      "reconcileErrors": alert({"threshold": {"type": "number", "exclusiveMinimum": 0}}),
      "reconcileSlow": alert({"thresholdSeconds": {"type": "number", "exclusiveMinimum": 0}}),
      "criteriaNotMet": alert(),
      "shardsFailing": alert({"threshold": i(minimum=1)}),
      "episodesNotMeasured": alert({"ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}),
      "s3Errors": alert({"threshold": {"type": "number", "exclusiveMinimum": 0}}),
      "sandboxToolTimeouts": alert({"ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}),
      "sandboxWaitingForPolicy": alert({}),
      "additionalGroups": arr(obj({"name": s(minLength=1), "rules": arr(anyobj)},
                                  required=["name", "rules"], addl=True)),
    }),
    "grafana": obj({
      "traceViewerUrl": s("Base URL of the trace viewer (basecamp serve) for dashboard links",
                          pattern="^https?://[^\\s\"'<>\\\\]+$"),
      "dashboards": obj({
        "enabled": b(), "namespace": s(), "label": label_key | {"minLength": 1},
        "labelValue": s(), "folder": s("Grafana folder; empty: no folder annotation"),
        # An annotation needs a key: empty would render `: Basecamp`. No
        # folder is `folder: ""`.
        "folderAnnotation": label_key | {"minLength": 1},
        "labels": strmap, "annotations": strmap}),
    }, required=["traceViewerUrl"]),
  },
  "required": ["image", "operator", "networkPolicy", "leaderElection", "watchNamespaces", "s3", "serviceAccount",
               "rbac", "metrics", "prometheusRule", "grafana"],
}
# Cross-field rules (replicas > 1 needs leader election, ...) are the
# template's basecamp.validate: its fail message says what to set.
open(OUT, "w").write(json.dumps(schema, indent=2) + "\n")
