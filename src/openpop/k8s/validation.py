"""Validating a Kubeflow job manifest: structure (the SDKs' models) then webhook rules."""

from openpop.k8s import messages, pytorchjob, trainjob
from openpop.k8s.errors import ManifestError
from openpop.k8s.sdk_models import check_pytorchjob, check_trainjob
from openpop.k8s.webhook import check_pytorchjob_rules, check_trainjob_rules

KINDS = {
    (pytorchjob.API_VERSION, pytorchjob.KIND): (check_pytorchjob, check_pytorchjob_rules),
    (trainjob.API_VERSION, trainjob.KIND): (check_trainjob, check_trainjob_rules),
}


def kubeflow_kind(document):
    """``"PyTorchJob"`` or ``"TrainJob"``; anything else is an error naming the field."""
    key = (document.get("apiVersion"), document.get("kind"))
    if all(isinstance(part, str) for part in key) and key in KINDS:
        return key[1]
    known = "; ".join(f"apiVersion {api} kind {kind}" for api, kind in KINDS)
    field = "kind" if document.get("kind") not in [kind for _, kind in KINDS] else "apiVersion"
    raise ManifestError(field, messages.UNKNOWN_API_VERSION_KIND.format(key=key[0], key2=key[1], known=known))


def validate_kubeflow_job(document):
    """Raise :class:`ManifestError` unless ``document`` is a valid PyTorchJob or TrainJob."""
    kind = kubeflow_kind(document)
    structural, rules = KINDS[(document["apiVersion"], kind)]
    structural(document)
    rules(document)
    return kind
