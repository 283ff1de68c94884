"""Structural validation of manifests with the field's own Python models.

* ``kubeflow.org/v1`` (PyTorchJob) with the training-operator SDK ``kubeflow-training``
  (``kubeflow.training.models.KubeflowOrgV1PyTorchJob`` ...), whose pod templates are the
  ``kubernetes`` client's ``V1PodTemplateSpec`` models;
* ``trainer.kubeflow.org/v1alpha1`` (TrainJob) with ``kubeflow-trainer-api``'s pydantic models;
* IPUJob pod templates with the ``kubernetes`` client's ``V1PodTemplateSpec``.

The models themselves ignore unknown keys and report errors without a path, so each
manifest is walked against the model's declared attributes first (unknown field, wrong
type, missing required field -> :class:`ManifestError` with the field path), then built
with the SDK's own constructors, which run the SDK's checks.
"""

import datetime
import importlib
import re
import typing

from openpop.k8s import messages
from openpop.k8s.errors import ManifestError, join_path

# Kubernetes "Quantity" and "IntOrString" values: YAML writes them as numbers or strings.
_QUANTITY_ATTRIBUTES = {"limits", "requests", "size_limit", "overhead", "allocatable"}

_PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def _openapi_namespaces():
    import kubernetes.client.models as k8s_models
    spaces = [k8s_models]
    try:
        import kubeflow.training.models as training_models
        spaces.insert(0, training_models)
    except ImportError:
        pass
    return spaces


def _openapi_class(name):
    for space in _openapi_namespaces():
        cls = getattr(space, name, None)
        if cls is not None:
            return cls
    raise LookupError(messages.NO_MODEL_CLASS.format(name=name))


def _type_name(value):
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number"}.get(type(value), type(value).__name__)


def _openapi_value(value, type_name, path, quantity=False):
    """Check ``value`` against an OpenAPI-generator type string; return the built value."""
    list_match = re.fullmatch(r"list\[(.+)\]", type_name)
    if list_match:
        if not isinstance(value, list):
            raise ManifestError(path, messages.NOT_ARRAY.format(type_name=_type_name(value)))
        return [_openapi_value(item, list_match.group(1), join_path(path, i), quantity)
                for i, item in enumerate(value)]
    dict_match = re.fullmatch(r"dict\(str, (.+)\)", type_name)
    if dict_match:
        if not isinstance(value, dict):
            raise ManifestError(path, messages.NOT_OBJECT.format(value_type=_type_name(value)))
        return {str(key): _openapi_value(item, dict_match.group(1), join_path(path, key), quantity)
                for key, item in value.items()}
    if type_name == "object":
        return value
    if type_name in ("datetime", "date"):
        if not isinstance(value, (str, datetime.date)):
            raise ManifestError(path, messages.NOT_TIMESTAMP.format(type_name=_type_name(value)))
        return value
    if type_name in _PRIMITIVES:
        if quantity and type_name == "str" and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            return str(value)
        expected = _PRIMITIVES[type_name]
        if (isinstance(value, bool) and type_name != "bool") or not isinstance(value, expected):
            word = {"str": "a string", "int": "an integer", "bool": "a boolean",
                    "float": "a number"}[type_name]
            raise ManifestError(path, messages.NOT_SCALAR.format(word=word, type_name=_type_name(value), value=value))
        return value
    return build_openapi_model(value, type_name, path)


def build_openapi_model(data, class_name, path=""):
    """Build ``class_name`` (a kubernetes / kubeflow-training model) from ``data``."""
    cls = _openapi_class(class_name)
    if not isinstance(data, dict):
        raise ManifestError(path, messages.NOT_MODEL_OBJECT.format(class_name=class_name, type_name=_type_name(data)))
    by_json_name = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    kwargs = {}
    for key, value in data.items():
        attr = by_json_name.get(key)
        if attr is None:
            known = ", ".join(sorted(by_json_name))
            raise ManifestError(join_path(path, key), messages.UNKNOWN_MODEL_FIELD.format(class_name=class_name,
                                                                                          known=known))
        if value is None:
            continue
        kwargs[attr] = _openapi_value(value, cls.openapi_types[attr], join_path(path, key),
                                      quantity=attr in _QUANTITY_ATTRIBUTES)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        missing = re.match(r"Invalid value for `(\w+)`, must not be `None`", message)
        if missing:
            attr = missing.group(1)
            raise ManifestError(join_path(path, cls.attribute_map.get(attr, attr)),
                                messages.REQUIRED_FIELD_MISSING) from None
        raise ManifestError(path, message) from None


def check_pod_template(template, path):
    """A core/v1 PodTemplateSpec, with the ``kubernetes`` client's models."""
    _require_sdk("kubernetes", "kubernetes")
    build_openapi_model(template, "V1PodTemplateSpec", path)


def check_object_meta(metadata, path):
    """A meta/v1 ObjectMeta (``metadata``), with the ``kubernetes`` client's models."""
    _require_sdk("kubernetes", "kubernetes")
    build_openapi_model(metadata, "V1ObjectMeta", path)


def check_pytorchjob(manifest):
    """A ``kubeflow.org/v1`` PyTorchJob, with ``kubeflow-training``'s models."""
    _require_sdk("kubeflow.training", "kubeflow-training")
    spec = manifest.get("spec")
    if isinstance(spec, dict) and "runPolicy" not in spec:
        # The SDK's swagger marks runPolicy required; the CRD (what the API server
        # enforces) does not, and the controller defaults an absent one.
        manifest = dict(manifest, spec=dict(spec, runPolicy={}))
    build_openapi_model(manifest, "KubeflowOrgV1PyTorchJob", "")


# ---- pydantic models (kubeflow-trainer-api) ------------------------------------------------

def _pydantic_value(value, annotation, path):
    import pydantic
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union:
        options = [arg for arg in args if arg is not type(None)]
        if value is None:
            return None
        if len(options) == 1:
            return _pydantic_value(value, options[0], path)
    if origin in (list, list):
        if not isinstance(value, list):
            raise ManifestError(path, messages.NOT_ARRAY.format(type_name=_type_name(value)))
        return [_pydantic_value(item, args[0], join_path(path, i)) for i, item in enumerate(value)]
    if origin in (dict, dict):
        if not isinstance(value, dict):
            raise ManifestError(path, messages.NOT_OBJECT.format(value_type=_type_name(value)))
        return {key: _pydantic_value(item, args[1], join_path(path, key))
                for key, item in value.items()}
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        if "one_of_schemas" in annotation.model_fields:
            try:
                annotation(value)
            except (ValueError, pydantic.ValidationError):
                choices = sorted(annotation.model_fields["one_of_schemas"].default)
                raise ManifestError(path, messages.NOT_ONE_OF_SCHEMAS.format(
                    choices=choices, type_name=_type_name(value), value=value)) from None
            return value
        return _pydantic_object(value, annotation, path)
    try:
        pydantic.TypeAdapter(annotation).validate_python(value)
    except pydantic.ValidationError as exc:
        raise ManifestError(path, f"{exc.errors()[0]['msg'].lower()}, got {_type_name(value)} "
                                  f"{value!r}") from None
    return value


def _pydantic_object(data, model, path):
    if not isinstance(data, dict):
        raise ManifestError(path, messages.NOT_MODEL_OBJECT_PYDANTIC.format(model_name=model.__name__,
                                                                            type_name=_type_name(data)))
    fields = {(info.alias or name): info for name, info in model.model_fields.items()}
    for key, value in data.items():
        info = fields.get(key)
        if info is None:
            known = ", ".join(sorted(fields))
            raise ManifestError(join_path(path, key), messages.UNKNOWN_MODEL_FIELD_PYDANTIC.format(
                model_name=model.__name__, known=known))
        _pydantic_value(value, info.annotation, join_path(path, key))
    for key, info in fields.items():
        if info.is_required() and data.get(key) is None:
            raise ManifestError(join_path(path, key), messages.REQUIRED_FIELD_MISSING)
    return data


def check_trainjob(manifest):
    """A ``trainer.kubeflow.org/v1alpha1`` TrainJob, with ``kubeflow-trainer-api``'s models."""
    _require_sdk("kubeflow_trainer_api", "kubeflow-trainer-api")
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
    _pydantic_object(manifest, TrainerV1alpha1TrainJob, "")
    try:
        TrainerV1alpha1TrainJob.from_dict(manifest)
    except ValueError as exc:
        raise ManifestError("", messages.TRAINJOB_REJECTED.format(exc=exc)) from None


def _require_sdk(module, package):
    try:
        importlib.import_module(module)
    except ImportError:
        raise ManifestError("", messages.SDK_PACKAGE_MISSING.format(package=package)) from None
