"""Carrying an IPUJob worker pod template over to a Kubeflow job, without IPU-era privileges.

Graphcore's operator ran workers privileged on the host network; the seed's manifests add
``hostIPC: true`` and the ``IPC_LOCK`` capability. None of that is needed on Kubeflow
(shared memory comes from the ``/dev/shm`` ``emptyDir`` volume, which is kept), so
``privileged``, ``hostNetwork``, ``hostIPC``, ``hostPID`` and ``IPC_LOCK`` are removed, each
with a warning line, and a ``dnsPolicy: ClusterFirstWithHostNet`` that only served the host
network goes with them. ``IPC_LOCK`` stays when asked for (``--keep-ipc-lock``).
"""

import copy

from . import messages

_HOST_NAMESPACES = {"hostNetwork": "network", "hostIPC": "IPC", "hostPID": "process ID"}


def _prune_empty(mapping, *keys):
    for key in keys:
        if key in mapping and mapping[key] in ({}, [], None):
            del mapping[key]


def _secure_container(container, path, report, keep_ipc_lock):
    context = container.get("securityContext")
    if not context:
        return
    if "privileged" in context:
        value = context.pop("privileged")
        if value:
            report.warning(f"{path}.securityContext.privileged", messages.PRIVILEGED_REMOVED)
    capabilities = context.get("capabilities") or {}
    added = capabilities.get("add") or []
    if "IPC_LOCK" in added and not keep_ipc_lock:
        capabilities["add"] = [cap for cap in added if cap != "IPC_LOCK"]
        report.warning(f"{path}.securityContext.capabilities.add", messages.IPC_LOCK_REMOVED)
    _prune_empty(capabilities, "add")
    _prune_empty(context, "capabilities")
    _prune_empty(container, "securityContext")


def secure_pod_template(template, path, report, keep_ipc_lock=False):
    """A copy of ``template`` without host namespaces and privileges; pod restartPolicy out.

    Returns ``(template, restart_policy)``: the pod's ``restartPolicy`` is taken out because
    the Kubeflow job sets it from its replica / runtime policy.
    """
    template = copy.deepcopy(template)
    spec = template.setdefault("spec", {})
    for key in _HOST_NAMESPACES:
        if key in spec:
            value = spec.pop(key)
            if value:
                report.warning(f"{path}.spec.{key}",
                               messages.HOST_NAMESPACE_REMOVED.format(namespace=_HOST_NAMESPACES[key]))
    if spec.get("dnsPolicy") == "ClusterFirstWithHostNet":
        del spec["dnsPolicy"]
        report.warning(f"{path}.spec.dnsPolicy", messages.HOST_NET_DNS_POLICY_REMOVED)
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group) or []):
            _secure_container(container, f"{path}.spec.{group}[{index}]", report, keep_ipc_lock)
    restart = spec.pop("restartPolicy", None)
    return template, restart


def quantities_as_strings(container):
    """Kubernetes quantities written as numbers (``cpu: 32``) become strings (``"32"``)."""
    resources = container.get("resources") or {}
    for group in ("limits", "requests"):
        for key, value in (resources.get(group) or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                resources[group][key] = str(value)
