"""The YAML job spec: schema (`schema`), the parameter table's spec side (`parameters`), file-system checks
(`files`), documents read with each key's line and their problems (`document`), loading with errors that point
at a line (`load`) and site profiles merged under a spec (`site`). Import from here."""

from hpc.spec.document import Problem, Provenance, SpecError, provenance
from hpc.spec.load import dump_spec, load_spec, parse_spec, preview_spec
from hpc.spec.model import ModelInit, ModelSpec
from hpc.spec.parameters import NAMED_PARAMETERS, PARAMETER_OWNERS, parameter_findings
from hpc.spec.schema import (
    ContainerSpec,
    GatewaySpec,
    PortsSpec,
    RenewSpec,
    SlurmSpec,
    Spec,
    TritonSpec,
)

__all__ = [
    "NAMED_PARAMETERS",
    "PARAMETER_OWNERS",
    "ContainerSpec",
    "GatewaySpec",
    "ModelInit",
    "ModelSpec",
    "PortsSpec",
    "Problem",
    "Provenance",
    "RenewSpec",
    "SlurmSpec",
    "Spec",
    "SpecError",
    "TritonSpec",
    "dump_spec",
    "load_spec",
    "parameter_findings",
    "parse_spec",
    "preview_spec",
    "provenance",
]
