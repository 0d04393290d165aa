"""Mirrors of the Kubernetes core/v1 types a ModelPool's engine block passes through.

Why it exists: ``spec.engine`` takes the commonly used fields of a Pod spec (env and
envFrom, volume mounts, security contexts, lifecycle hooks, resources, tolerations) under
the same names and shapes as in a Pod, so a user copies them from a Deployment. They are
typed here (not preserved as free-form objects) so the CRD schema - and ``kubectl
explain`` - describe them and an API server refuses a misspelt field; the larger objects
(Volume, Affinity) are kept as given (:data:`PreservedObject`). Nothing here is kvpool's
own: the kvpool types are in :mod:`kvpool.api.modelpool` and its neighbours.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema

from kvpool.api.common import ApiModel, cel, validations

IntOrString = Annotated[
    int | str,
    Field(description="A quantity: an integer or a string such as '16Gi' or '500m'."),
]


class KeySelector(ApiModel):
    """A key of a Secret or ConfigMap in the pool's namespace (as in a Pod spec)."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret/ConfigMap.")
    key: str = Field(min_length=1, max_length=253, description="The key to read.")
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


class ObjectFieldSelector(ApiModel):
    """A field of the engine pod (downward API), e.g. status.podIP."""

    field_path: str = Field(min_length=1, description="Path of the field, e.g. status.podIP.")
    api_version: str | None = Field(default=None, description="Schema version of the path.")


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from (one source; as in a Pod spec)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)]"
                ".filter(x, x).size() == 1",
                "exactly one of secretKeyRef, configMapKeyRef, fieldRef",
            )
        )
    }

    secret_key_ref: KeySelector | None = Field(
        default=None, description="A key of a Secret (e.g. an HF token)."
    )
    config_map_key_ref: KeySelector | None = Field(default=None, description="A ConfigMap key.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A pod field.")


class EnvVar(ApiModel):
    """An environment variable of the engine container: a value or a valueFrom source."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "!(has(self.valueFrom) && has(self.value) && self.value != '')",
                "value and valueFrom are exclusive",
            )
        )
    }

    name: str = Field(
        min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Name."
    )
    value: str = Field(default="", description="Value.")
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a Secret, ConfigMap or pod field."
    )


class NamedReference(ApiModel):
    """A Secret or ConfigMap of the pool's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, description="Object name.")
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


class EnvFromSource(ApiModel):
    """Every key of a Secret or ConfigMap as environment variables (as in a Pod spec)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "has(self.secretRef) != has(self.configMapRef)",
                "exactly one of secretRef, configMapRef",
            )
        )
    }

    prefix: str | None = Field(default=None, max_length=256, description="Prefix for each key.")
    secret_ref: NamedReference | None = Field(default=None, description="A Secret.")
    config_map_ref: NamedReference | None = Field(default=None, description="A ConfigMap.")


class LocalName(ApiModel):
    """A reference by name to an object of the pool's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Object name.")


class VolumeMount(ApiModel):
    """A volume mounted into the engine container (as in a Pod spec)."""

    name: str = Field(min_length=1, max_length=63, description="Name of a volume in volumes.")
    mount_path: str = Field(min_length=1, description="Where, e.g. /root/.cache/huggingface.")
    sub_path: str | None = Field(default=None, description="Sub-path of the volume to mount.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")


Capability = Annotated[str, Field(max_length=64)]


class Capabilities(ApiModel):
    """Linux capabilities to add or drop."""

    add: list[Capability] | None = Field(default=None, max_length=64, description="To add.")
    drop: list[Capability] | None = Field(default=None, max_length=64, description="To drop.")


class SeccompProfile(ApiModel):
    """A seccomp profile (as in a Pod spec)."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(description="Kind.")
    localhost_profile: str | None = Field(default=None, description="For type Localhost.")


class SecurityContext(ApiModel):
    """The engine container's security context (the commonly used fields of a Pod spec's)."""

    run_as_user: int | None = Field(default=None, ge=0, description="UID to run as.")
    run_as_group: int | None = Field(default=None, ge=0, description="GID to run as.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to run as root.")
    read_only_root_filesystem: bool | None = Field(default=None, description="Read-only root.")
    allow_privilege_escalation: bool | None = Field(default=None, description="no_new_privs off.")
    privileged: bool | None = Field(default=None, description="Privileged container.")
    capabilities: Capabilities | None = Field(default=None, description="Capabilities.")
    seccomp_profile: SeccompProfile | None = Field(default=None, description="Seccomp.")


class PodSecurityContext(ApiModel):
    """The engine pod's security context (the commonly used fields of a Pod spec's)."""

    run_as_user: int | None = Field(default=None, ge=0, description="UID to run as.")
    run_as_group: int | None = Field(default=None, ge=0, description="GID to run as.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to run as root.")
    fs_group: int | None = Field(default=None, ge=0, description="GID owning the volumes.")
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = Field(
        default=None, description="When to change volume ownership."
    )
    supplemental_groups: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, max_length=32, description="Extra GIDs."
    )
    seccomp_profile: SeccompProfile | None = Field(default=None, description="Seccomp.")


class ExecAction(ApiModel):
    """Run a command in the container."""

    command: list[str] = Field(min_length=1, description="Command and arguments.")


class HTTPGetAction(ApiModel):
    """An HTTP GET against the container."""

    path: str | None = Field(default=None, description="Path, e.g. /drain.")
    port: IntOrString = Field(description="Port number or name.")
    scheme: Literal["HTTP", "HTTPS"] | None = Field(default=None, description="HTTP or HTTPS.")


class SleepAction(ApiModel):
    """Sleep before the container gets SIGTERM."""

    seconds: int = Field(ge=0, description="Seconds to sleep.")


class LifecycleHandler(ApiModel):
    """One lifecycle action (exactly one of exec, httpGet, sleep; as in a Pod spec)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "[has(self.exec), has(self.httpGet), has(self.sleep)].filter(x, x).size() == 1",
                "exactly one of exec, httpGet, sleep",
            )
        )
    }

    exec: ExecAction | None = Field(default=None, description="Run a command.")
    http_get: HTTPGetAction | None = Field(default=None, alias="httpGet", description="HTTP GET.")
    sleep: SleepAction | None = Field(default=None, description="Sleep.")


class Lifecycle(ApiModel):
    """Engine container lifecycle hooks (as in a Pod spec)."""

    pre_stop: LifecycleHandler | None = Field(
        default=None,
        description=(
            "Runs before SIGTERM, e.g. a sleep so the gateway stops routing first and "
            "in-flight requests finish (within terminationGracePeriodSeconds)."
        ),
    )


# Kubernetes objects too large to type here (Volume, Affinity): kept as given, checked by
# the API server when the Deployment is written (and by a test against its schema).
PreservedObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


class ResourceRequirements(ApiModel):
    """Compute resources of the engine container (as in a Pod spec)."""

    requests: dict[str, IntOrString] = Field(
        default_factory=dict, description="Requested resources, e.g. cpu, memory, nvidia.com/gpu."
    )
    limits: dict[str, IntOrString] = Field(
        default_factory=dict, description="Resource limits, e.g. nvidia.com/gpu: 1."
    )


class Toleration(ApiModel):
    """A Pod toleration (as in a Pod spec)."""

    key: str | None = Field(default=None, description="Taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal."
    )
    value: str | None = Field(default=None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all."
    )
    toleration_seconds: int | None = Field(
        default=None, description="For NoExecute: how long the pod stays bound after the taint."
    )
