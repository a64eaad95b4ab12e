"""The sandbox NetworkPolicy's egress to an in-cluster Service: an endpoint
that names a Service the operator can read is allowed to that Service's
pods on its targetPort (the port the policy sees after the Service's
address translation), not to its port on any address; a host name that is
not a Service still opens its port. The operator watches Services: a
changed selector or target port, or a Service created for a name that was
none, reaches the policy at once, with no change to the task. kwok runs no network plugin, so this
checks the object the API server stores, which is what a plugin enforces."""

from __future__ import annotations

from conftest import delete_tasks, ecommerce_manifests
from kube import Kube, wait_until

NAME = "egress"


def service(name: str, port: int, target: int | str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": port, "targetPort": target, "protocol": "TCP"}]},
    }


def test_an_endpoint_naming_a_service_is_allowed_to_its_pods_on_the_target_port(kube: Kube, operator, task_ns: str,
                                                                                bucket: str):
    delete_tasks(kube, task_ns, [NAME])
    kube.apply([service("egress-inventory", 8080, 9090), service("egress-pricing", 7000, "http")], "-n", task_ns)
    docs = ecommerce_manifests(NAME, bucket, variants=("a",), shards=1)
    sandbox = docs[0]
    tool = {"description": "d", "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}
    sandbox["spec"]["tools"]["inventory"] = {**tool, "http": {"url": "http://egress-inventory:8080/items/{{id}}"}}
    sandbox["spec"]["tools"]["pricing"] = {**tool, "http": {"url": f"http://egress-pricing.{task_ns}.svc.cluster.local:7000/p"}}
    sandbox["spec"]["tools"]["weather"] = {**tool, "http": {"url": "http://egress-weather:6000/w"}}
    task = docs[-1]
    task["spec"]["suspend"] = True
    kube.apply(docs, "-n", task_ns)
    try:
        policy = wait_until("the task's NetworkPolicy",
                            lambda: kube.get("networkpolicy", f"{NAME}-sandbox", "-n", task_ns), timeout=60)
        egress = policy["spec"]["egress"]

        def to_pods(app: str, port) -> dict:
            return {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": task_ns}},
                            "podSelector": {"matchLabels": {"app": app}}}],
                    "ports": [{"port": port, "protocol": "TCP"}]}

        assert to_pods("egress-inventory", 9090) in egress, egress
        assert to_pods("egress-pricing", "http") in egress, egress
        open_ports = sorted(r["ports"][0]["port"] for r in egress if "to" not in r)
        assert 6000 in open_ports, f"a name that is no Service keeps its port open: {egress}"
        assert 8080 not in open_ports and 7000 not in open_ports, egress

        # The task is settled and not touched again; its next periodic
        # reconcile is minutes away. Only the Service watch can wake it.
        moved = service("egress-inventory", 8080, 9191)
        moved["spec"]["selector"] = {"app": "inventory-v2"}
        kube.apply([moved, service("egress-weather", 6000, 6060)], "-n", task_ns)

        def narrowed():
            egress = kube.get("networkpolicy", f"{NAME}-sandbox", "-n", task_ns)["spec"]["egress"]
            return egress if to_pods("inventory-v2", 9191) in egress and to_pods("egress-weather", 6060) in egress \
                else None

        egress = wait_until("the NetworkPolicy to follow the Services' changes", narrowed, timeout=30)
        assert to_pods("egress-inventory", 9090) not in egress, egress
        assert 6000 not in [r["ports"][0]["port"] for r in egress if "to" not in r], egress
    finally:
        delete_tasks(kube, task_ns, [NAME])
        kube.run("delete", "service", "egress-inventory", "egress-pricing", "egress-weather", "-n", task_ns,
                 "--ignore-not-found")
