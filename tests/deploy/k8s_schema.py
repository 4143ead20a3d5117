"""Checks rendered Kubernetes objects against the API's schema, offline.

Built-in kinds are walked against the ``kubernetes`` client's generated models (``openapi_types``
gives each field's type, ``attribute_map`` its JSON name); the prometheus-operator kinds against the
small hand-written schemas below, which name only the fields the chart uses. What is an error:

- a field the kind does not have (a typo, a field at the wrong level);
- a value of the wrong type: a string where an integer goes (``containerPort: "50061"``), an integer
  where a string goes (an env ``value: 1``), a list where an object goes, and so on. Quantities
  (``resources``, ``sizeLimit``) take a number or a quantity string (checked: ``8GB`` is not one);
  IntOrString fields (``targetPort``, ``maxUnavailable``, ...) take an integer or a string;
- a required field left out (per the model), and an object without ``metadata.name``;
- a name or label that the API server would refuse (RFC 1123 names, label syntax).

``validate(obj)`` returns the errors as ``"Kind name: path: message"`` lines, empty when valid.
"""

import inspect
import re
from typing import Any

import kubernetes.client.models as models

# apiVersion, kind -> model class name. A kind under another apiVersion (a removed beta) has no entry.
BUILTIN_KINDS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "Secret"): "V1Secret",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
}

# Fields whose generated type says ``str`` (or a map of them) but which hold Kubernetes quantities.
QUANTITY_FIELDS = {
    ("V1ResourceRequirements", "limits"),
    ("V1ResourceRequirements", "requests"),
    ("V1VolumeResourceRequirements", "limits"),
    ("V1VolumeResourceRequirements", "requests"),
    ("V1EmptyDirVolumeSource", "size_limit"),
}
QUANTITY = re.compile(
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")  # fmt: skip

# prometheus-operator (monitoring.coreos.com/v1) kinds: the fields the chart uses. A dict is an object
# (a key ending in "!" is required), a one-item list a list of that item, a string a type as in the
# generated models' ``openapi_types`` (``str``, ``Dict[str, str]``, ``V1LabelSelector``, ...).
_RELABEL = {
    "sourceLabels": "List[str]",
    "separator": "str",
    "targetLabel": "str",
    "regex": "str",
    "modulus": "int",
    "replacement": "str",
    "action": "str",
}
SERVICE_MONITOR = {
    "apiVersion!": "str",
    "kind!": "str",
    "metadata!": "V1ObjectMeta",
    "spec!": {
        "selector!": "V1LabelSelector",
        "namespaceSelector": {"any": "bool", "matchNames": "List[str]"},
        "jobLabel": "str",
        "endpoints!": [
            {
                "port": "str",
                "targetPort": "object",
                "path": "str",
                "scheme": "str",
                "interval": "str",
                "scrapeTimeout": "str",
                "honorLabels": "bool",
                "relabelings": [_RELABEL],
                "metricRelabelings": [_RELABEL],
            }
        ],
    },
}
PROMETHEUS_RULE = {
    "apiVersion!": "str",
    "kind!": "str",
    "metadata!": "V1ObjectMeta",
    "spec!": {
        "groups!": [
            {
                "name!": "str",
                "interval": "str",
                "limit": "int",
                "query_offset": "str",
                "labels": "Dict[str, str]",
                "rules!": [
                    {
                        "record": "str",
                        "alert": "str",
                        "expr!": "object",  # IntOrString in the CRD
                        "for": "str",
                        "keep_firing_for": "str",
                        "labels": "Dict[str, str]",
                        "annotations": "Dict[str, str]",
                    }
                ],
            }
        ]
    },
}
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}
_LIST = re.compile(r"^[Ll]ist\[(.+)\]$")
_DICT = re.compile(r"^(?:Dict\[str, (.+)\]|dict\(str, (.+)\))$")


def validate(obj: dict) -> list[str]:
    """Every schema error in one rendered object, as ``"Kind name: path: message"``; empty when valid."""
    if not isinstance(obj, dict):
        return [f"document: expected an object, got {type(obj).__name__}"]
    key = (obj.get("apiVersion"), obj.get("kind"))
    where = f"{key[1]} {(obj.get('metadata') or {}).get('name', '?')}"
    errors: list[str] = []
    if key in BUILTIN_KINDS:
        _check(obj, BUILTIN_KINDS[key], "", errors)
    elif key in CUSTOM_KINDS:
        _check(obj, CUSTOM_KINDS[key], "", errors)
        if key[1] == "PrometheusRule":
            _check_rules(obj, errors)
    else:
        return [f"{where}: no schema for apiVersion {key[0]!r} kind {key[1]!r}"]
    _check_metadata(obj.get("metadata") or {}, errors)
    return [f"{where}: {error}" for error in errors]


def _check(value: Any, typ: Any, path: str, errors: list[str], quantity: bool = False) -> None:
    if isinstance(typ, dict):
        _check_object(value, typ, path, errors)
    elif isinstance(typ, list):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {_kind(value)}")
            return
        for i, item in enumerate(value):
            _check(item, typ[0], f"{path}[{i}]", errors)
    elif match := _LIST.match(typ):
        _check(value, [match.group(1)], path, errors)
    elif match := _DICT.match(typ):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected an object (map), got {_kind(value)}")
            return
        inner = match.group(1) or match.group(2)
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(f"{path}: map key {k!r} is not a string")
            _check(v, inner, f"{path}.{k}", errors, quantity)
    elif quantity:
        _check_quantity(value, path, errors)
    elif typ in _SCALARS:
        if not _SCALARS[typ](value):
            want = "an integer or a string (IntOrString)" if typ == "object" else typ
            errors.append(f"{path}: expected {want}, got {_kind(value)} {value!r}")
    elif isinstance(getattr(models, typ, None), type):
        _check_model(value, getattr(models, typ), path, errors)
    else:
        errors.append(f"{path}: the validator does not know type {typ!r}")


def _check_model(value: Any, cls: type, path: str, errors: list[str]) -> None:
    if not isinstance(value, dict):
        errors.append(f"{path or '.'}: expected an object ({cls.__name__}), got {_kind(value)}")
        return
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for json_name, item in value.items():
        attr = by_json.get(json_name)
        child = f"{path}.{json_name}" if path else json_name
        if attr is None:
            errors.append(f"{child}: unknown field for {cls.__name__}")
        elif item is not None:
            quantity = (cls.__name__, attr) in QUANTITY_FIELDS
            _check(item, cls.openapi_types[attr], child, errors, quantity)
    for attr in _required(cls):
        if value.get(cls.attribute_map[attr]) is None:
            child = f"{path}.{cls.attribute_map[attr]}" if path else cls.attribute_map[attr]
            errors.append(f"{child}: required by {cls.__name__}, missing")


def _check_object(value: Any, schema: dict, path: str, errors: list[str]) -> None:
    if not isinstance(value, dict):
        errors.append(f"{path or '.'}: expected an object, got {_kind(value)}")
        return
    fields = {key.rstrip("!"): typ for key, typ in schema.items()}
    for key, item in value.items():
        child = f"{path}.{key}" if path else key
        if key not in fields:
            errors.append(f"{child}: unknown field")
        elif item is not None:
            _check(item, fields[key], child, errors)
    for key in schema:
        if key.endswith("!") and value.get(key[:-1]) is None:
            errors.append(f"{path + '.' if path else ''}{key[:-1]}: required, missing")


def _check_quantity(value: Any, path: str, errors: list[str]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        errors.append(f"{path}: expected a quantity (number or string), got {_kind(value)}")
    elif isinstance(value, str) and not QUANTITY.match(value):
        errors.append(f"{path}: {value!r} is not a Kubernetes quantity (e.g. 500m, 4Gi, 2)")


def _check_metadata(meta: dict, errors: list[str]) -> None:
    name = meta.get("name")
    if not name:
        errors.append("metadata.name: required, missing")
    elif not isinstance(name, str) or len(name) > 63 or not DNS_LABEL.match(name):
        errors.append(f"metadata.name: {name!r} is not an RFC 1123 label (lowercase, digits, '-', <= 63)")
    for key, value in (meta.get("labels") or {}).items():
        if not LABEL_KEY.match(str(key)) or len(str(key).split("/")[-1]) > 63:
            errors.append(f"metadata.labels: {key!r} is not a valid label key")
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            errors.append(f"metadata.labels.{key}: {value!r} is not a valid label value")


def _check_rules(obj: dict, errors: list[str]) -> None:
    """Each rule is exactly one of a recording rule (record) and an alerting rule (alert)."""
    for g, group in enumerate(((obj.get("spec") or {}).get("groups")) or []):
        for r, rule in enumerate(group.get("rules") or []):
            if isinstance(rule, dict) and ("record" in rule) == ("alert" in rule):
                errors.append(f"spec.groups[{g}].rules[{r}]: needs exactly one of record, alert")


def _required(cls: type) -> list[str]:
    """The model's required attributes: pydantic models (client >= 35) or the older generated setters."""
    fields = getattr(cls, "model_fields", None)
    if fields is not None:
        return [attr for attr, field in fields.items() if field.is_required() and attr in cls.attribute_map]
    required = []
    for attr in cls.attribute_map:
        setter = getattr(getattr(cls, attr, None), "fset", None)
        if setter is not None and "must not be `None`" in inspect.getsource(setter):
            required.append(attr)
    return required


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


_SCALARS = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, (int, str)) and not isinstance(v, bool),  # IntOrString
    "datetime": lambda v: isinstance(v, str),
    "date": lambda v: isinstance(v, str),
    "bytes": lambda v: isinstance(v, str),
    "bytearray": lambda v: isinstance(v, str),
}
